// Where a job's secret comes from (comm/job_auth.h derives every key from
// it). In order:
//   1. --job_secret_file: read and checked like the programs do (mode 600);
//   2. FLEET_JOB_SECRET in fleetrun's environment;
//   3. a job entirely on this machine (PS simulation, one-node collective,
//      a PS cluster all on loopback): a fresh random secret for this run;
//   4. otherwise InvalidArgument: every machine of the job needs the same
//      secret, so it must be given (a file copied with the job, or the
//      environment, the way SSH keys or MPI secrets are shared).
// The secret reaches the processes as FLEET_JOB_SECRET (RenderProcess), never
// as a flag, and is never printed.
#pragma once

#include <string>

#include "comm/cluster.h"
#include "comm/status.h"
#include "launch/options.h"
#include "launch/plan.h"

namespace fleet::launch {

// How the secret was obtained, for fleetrun's start-up lines (never the
// secret itself).
enum class SecretSource { kNone, kFile, kEnvironment, kGenerated };
std::string_view SecretSourceName(SecretSource source);

// Fills job.job_secret and job.credentials when job.auth, as described
// above. Errors start with the flag to blame ("--job_secret_file: ...").
Result<SecretSource> LoadJobSecret(const LaunchOptions& options, const EnvLookup& env,
                                   JobLayout& job);

// --metrics_token_file's token, the read-only credential of GET /metrics and
// the job page ("" when not given): the file is checked like the secret's
// (mode 600), surrounding whitespace is dropped (Prometheus drops it from
// its credentials_file too), and the rest must be 16 to 256 printable
// characters without spaces. InvalidArgument starting with the flag.
Result<std::string> LoadMetricsToken(const LaunchOptions& options);

}  // namespace fleet::launch
