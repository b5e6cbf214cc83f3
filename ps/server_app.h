// The ps_server program, as a library function so tests can run it
// in-process or as a child process.
//
//   ps_server --endpoint=ip:port --config=job.yaml [--override='a.b=1;c=2']
//             [--rank=R --servers=... --workers=... --kv_endpoint=... --job_id=...]
//
// Every cluster flag falls back to its FLEET_* variable (comm/cluster.h).
// --endpoint defaults to this rank's entry of --servers, else 127.0.0.1:0.
// With a KV store the bound endpoint is published at EndpointKey(server,
// rank). SIGTERM or SIGINT stop it gracefully: requests being handled
// finish, then it saves to server.save_dir when the config sets one, and
// exits 0 (1 when that save failed, 2 for bad flags or config).
#pragma once

namespace fleet::ps {

int PsServerMain(int argc, char** argv);

}  // namespace fleet::ps
