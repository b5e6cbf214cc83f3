#include "launch/log_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fleet::launch {

Result<LogDirLock> LogDirLock::Acquire(const std::string& dir, const std::string& job_id) {
  const std::string path = dir + "/.fleetrun.lock";
  // O_CLOEXEC: the job's processes must not keep the lock past fleetrun.
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    return Status::IOError(
        std::string("cannot open the log directory's lock file (") + std::strerror(errno) + ")",
        path);
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {};
    const ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
    close(fd);
    if (err != EWOULDBLOCK) {
      return Status::IOError(std::string("cannot lock (") + std::strerror(err) + ")", path);
    }
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "unknown";
    while (!who.empty() && who.back() == '\n') who.pop_back();
    return Status::FailedPrecondition(
        "log directory " + dir + " is in use by another live job (fleetrun " + who +
        "); its log files would be overwritten: give this job another --log_dir or --job_id");
  }
  const std::string me = "pid " + std::to_string(getpid()) + " job " + job_id + "\n";
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int err = errno;
    close(fd);
    return Status::IOError(std::string("cannot write the lock file (") + std::strerror(err) + ")",
                           path);
  }
  return LogDirLock(fd);
}

LogDirLock::~LogDirLock() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace fleet::launch
