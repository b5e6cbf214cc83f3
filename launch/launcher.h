// fleetrun as a library: RunFleetrun is the whole program minus the few
// process-wide things main() owns (signal handlers, reading the
// environment), so tests can drive every phase.
//
// Phases: parse flags -> ResolveLayout -> print the configuration -> host
// the KV store (if this machine does) -> start servers, wait until each has
// published its endpoint (port-0 simulation) -> heter workers, likewise ->
// workers (or collective ranks after the node rendezvous) -> supervise ->
// stop servers when every worker is done.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "comm/status.h"
#include "launch/plan.h"

namespace fleet::launch {

// Exit codes of fleetrun.
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;     // a process failed, or a wait timed out
inline constexpr int kExitBadFlags = 2;      // validation failed; nothing was started, or a
                                             // process refused its config at start-up (exit 2)
// Stopped by SIGINT / SIGTERM: 128 + signo (130 / 143).

struct LauncherIo {
  std::FILE* out = stdout;  // configuration, process lines, worker 0's output
  std::FILE* err = stderr;  // errors and failure reports
};

// Reads this machine's facts: interfaces, GPUs, /proc/self/exe, PATH and
// Slurm variables from `environ`. IOError when the interfaces cannot be
// listed. Blocks on DNS only under Slurm (resolving the first node).
Result<MachineInfo> GatherMachineInfo();

// Runs fleetrun with `args` (argv without argv[0]) and returns its exit code.
// wake_fd: a SignalPipe's read end (-1 without one: Ctrl-C is then not
// handled and deaths are noticed within 100 ms). Blocks until the job ends.
int RunFleetrun(const std::vector<std::string>& args, const MachineInfo& machine, int wake_fd, LauncherIo io);

}  // namespace fleet::launch
