// One job per log directory, also when several hosts share it (a home or
// project folder on NFS under Slurm: the same command on every host means
// the same --log_dir). Each fleetrun holds an flock on its host's own lock
// file in the folder, <log_dir>/.fleetrun.lock for a job on one machine and
// <log_dir>/.fleetrun.<host>.lock for a host of a multi-host job (<host>:
// its address in the job), holding "job <job id> host <host> store <KV
// store endpoint> pid <pid>" (the hosts of one job share its id and store).
// So the hosts of one job share the folder, each writing its own files,
// while a second job there (on any host: the locks of a shared file system
// are the file server's) is refused naming the job and the host that holds
// it, instead of overwriting its serverlog.N / workerlog.N. A lock dies
// with its process, so a job killed by SIGKILL leaves none behind, and a
// host is never told a pid of another host's (pid 1 in a container) is
// alive.
#pragma once

#include <string>

#include "comm/status.h"

namespace fleet::launch {

class LogDirLock {
 public:
  // Takes `host`'s lock of `dir` (which must exist; `host` empty: a job on
  // one machine) and writes who holds it; `store` is the job's KV store
  // endpoint (multi-host jobs). Errors: FailedPrecondition when
  // another live fleetrun holds this host's lock, or any live fleetrun of
  // another job holds a lock in `dir` (a job on one machine shares `dir`
  // with no other fleetrun, whatever its job id), naming that job, its host
  // and pid;
  // IOError when a lock file cannot be opened (also when it is a symbolic
  // link: never followed).
  static Result<LogDirLock> Acquire(const std::string& dir, const std::string& job_id,
                                    const std::string& host = "", const std::string& store = "");

  LogDirLock(LogDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  LogDirLock& operator=(LogDirLock&&) = delete;
  LogDirLock(const LogDirLock&) = delete;
  ~LogDirLock();

 private:
  explicit LogDirLock(int fd) : fd_(fd) {}
  int fd_;  // open with the flock held; closed (releasing it) on destruction
};

}  // namespace fleet::launch
