// Listening TCP sockets the way every FleetPS HTTP endpoint (the KV store,
// gpt_serve) needs them: SO_REUSEADDR but not SO_REUSEPORT, so that a port
// in use fails instead of silently sharing the clients; and a listen backlog
// of the system's size, so that a burst of connections (a job's rendezvous,
// many clients, strangers beside them) is queued by the kernel rather than
// dropped into SYN retries that stall each connect 1, 3, 7 s.
#pragma once

#include <string>

#include "comm/status.h"

namespace fleet {

struct ListeningSocket {
  int fd = -1;   // owned by the caller: non-blocking, close-on-exec, listening
  int port = 0;  // the bound port
};

// Binds host:port (IPv4; a hostname is resolved; port 0: a free one, chosen
// by the kernel) and listens. Unavailable naming the address when it cannot
// be bound (in use, or not this host's), InvalidArgument when the host does
// not resolve.
Result<ListeningSocket> ListenTcp(const std::string& host, int port);

}  // namespace fleet
