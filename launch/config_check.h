// Checks a PS job's config in fleetrun before anything is started, so that a
// typo in the YAML or in a `-o` fails at once with exit 2 naming it, instead
// of after the servers started, with exit 1 and a process's log.
#pragma once

#include "comm/status.h"
#include "launch/plan.h"

namespace fleet::launch {

// Loads job.config with job.overrides as every process will
// (worker::LoadPsJobConfig: the error names the `-o` that broke the config,
// or the file). When every process runs on this machine (simulation), also
// checks that server.save_dir, server.recovery_dir and train.save_dir are
// writable (creating them). Errors: NotFound, InvalidArgument, IOError.
// REQUIRES: job.mode is a PS mode.
Status CheckPsJobConfig(const JobLayout& job);

}  // namespace fleet::launch
