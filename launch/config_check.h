// Checks a PS job's config in fleetrun before anything is started, so that a
// typo in the YAML or in a `-o` fails at once with exit 2 naming it, instead
// of after the servers started, with exit 1 and a process's log.
#pragma once

#include "comm/status.h"
#include "launch/plan.h"

namespace fleet::launch {

// Loads job.config with job.overrides as every process will
// (worker::LoadPsJobConfig: the error names the `-o` that broke the config,
// or the file; with job.worker_program, whose script reads its own
// settings, the servers' sections only: ps::LoadJobConfig). When every
// process runs on this machine (simulation), also checks that
// server.save_dir, server.recovery_dir and train.save_dir are writable
// (creating them). Errors: NotFound, InvalidArgument, IOError.
// REQUIRES: job.mode is a PS mode.
Status CheckPsJobConfig(const JobLayout& job);

// With --max_restart > 0 a restarted server must come back with every
// acknowledged update, or the job goes on from an empty server (and the
// workers' "lost 0 updates" is false): when the config sets no
// server.recovery_dir, adds "-o server.recovery_dir=<log dir>/recovery" to
// job->overrides (servers keep their push log and recovery checkpoints
// there; workers resend to a restarting server) and returns that directory;
// "" when nothing was added. Errors as CheckPsJobConfig.
// REQUIRES: job->mode is a PS mode.
Result<std::string> DefaultRecoveryDir(JobLayout* job, int max_restart);

}  // namespace fleet::launch
