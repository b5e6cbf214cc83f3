// Binding an httplib::Server the way every FleetPS HTTP endpoint (the KV
// store, gpt_serve) needs it: SO_REUSEADDR but not httplib's SO_REUSEPORT,
// so that a port in use fails instead of silently sharing the clients; and
// a listen backlog of the system's size instead of httplib's 5, so that a
// burst of connections (a job's rendezvous, many clients, strangers beside
// them) is queued by the kernel rather than dropped into SYN retries that
// stall each connect 1, 3, 7 s.
#pragma once

#include <string>

namespace httplib {
class Server;
}

namespace fleet {

// Binds `server` to host:port (port 0: a free one, chosen by the kernel)
// and returns the bound port, or -1 when the address cannot be bound (in
// use, or not this host's). The caller then runs server.listen_after_bind().
int BindHttpServer(httplib::Server& server, const std::string& host, int port);

}  // namespace fleet
