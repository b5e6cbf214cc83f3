// fleetrun: starts a FleetPS job. Everything is in launch/launcher.h; this
// file owns only what is process-wide: signal handlers and the environment.
#include <cstdio>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "comm/http_server.h"
#include "launch/launcher.h"
#include "launch/supervisor.h"

int main(int argc, char** argv) {
  using namespace fleet::launch;
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // The KV store holds a descriptor per connection: a job's processes,
  // and whatever strangers reach its port.
  fleet::RaiseOpenFileLimit();
  auto signals = SignalPipe::Install();
  if (!signals.ok()) {
    std::fprintf(stderr, "fleetrun: %s\n", signals.status().ToString().c_str());
    return kExitJobFailed;
  }
  auto machine = GatherMachineInfo();
  if (!machine.ok()) {
    std::fprintf(stderr, "fleetrun: %s\n", machine.status().ToString().c_str());
    return kExitJobFailed;
  }
  return RunFleetrun(std::vector<std::string>(argv + 1, argv + argc), *machine, (*signals)->read_fd(), LauncherIo{});
}
