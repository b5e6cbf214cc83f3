// One job per log directory: fleetrun holds <log_dir>/.fleetrun.lock (an
// flock) while it runs, so a second job on the machine that would write the
// same serverlog.N / workerlog.N files (e.g. two jobs with the default
// --log_dir and --job_id) is refused instead of truncating the first's logs.
// The lock dies with the process, so a job killed by SIGKILL leaves no stale
// lock behind.
#pragma once

#include <string>

#include "comm/status.h"

namespace fleet::launch {

class LogDirLock {
 public:
  // Takes the lock of `dir` (which must exist) and writes "pid <getpid()>
  // job <job_id>" into the lock file for whoever finds it taken.
  // Errors: FailedPrecondition when a live process holds it, naming that
  // job's fleetrun pid and job id; IOError when the lock file cannot be
  // opened (also when it is a symbolic link: never followed).
  static Result<LogDirLock> Acquire(const std::string& dir, const std::string& job_id);

  LogDirLock(LogDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  LogDirLock& operator=(LogDirLock&&) = delete;
  LogDirLock(const LogDirLock&) = delete;
  ~LogDirLock();

 private:
  explicit LogDirLock(int fd) : fd_(fd) {}
  int fd_;  // open with the flock held; closed (releasing it) on destruction
};

}  // namespace fleet::launch
