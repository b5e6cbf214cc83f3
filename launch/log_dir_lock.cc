#include "launch/log_dir_lock.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>
#include <thread>

namespace fleet::launch {
namespace {

constexpr std::string_view kPrefix = ".fleetrun";
constexpr std::string_view kSuffix = ".lock";

// What a held lock file says of its holder ("job J host H store S pid P"),
// one line. A holder writes its line just after taking the lock, so a line
// not yet complete (the hosts of a job start together) is waited for, up to
// a second; then "unknown".
std::string Holder(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (true) {
    char text[512] = {};
    const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    std::string who = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
    if (who.ends_with('\n')) {
      while (!who.empty() && (who.back() == '\n' || who.back() == '\r')) who.pop_back();
      return who;
    }
    if (std::chrono::steady_clock::now() >= deadline) return who.empty() ? "unknown" : who;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The word after `key` in a holder line ("job <id> host <h> store <s> pid
// <p>"; older fleetruns wrote "pid <pid> job <id>"); empty when absent.
std::string Field(const std::string& holder, std::string_view key) {
  const size_t at = holder.find(std::string(key) + " ");
  if (at == std::string::npos) return "";
  const size_t start = at + key.size() + 1;
  return holder.substr(start, holder.find(' ', start) - start);
}

// The lock file of `host` ("" for a job on one machine).
std::string LockFileName(const std::string& host) {
  return std::string(kPrefix) + (host.empty() ? "" : "." + host) + std::string(kSuffix);
}

Status InUse(const std::string& dir, const std::string& holder) {
  return Status::FailedPrecondition(
      "log directory " + dir + " is in use by another live job (fleetrun " + holder +
      "); its log files would be overwritten: give this job another --log_dir or --job_id");
}

Status IoError(const std::string& what, const std::string& path, int err) {
  return Status::IOError(what + " (" + std::strerror(err) + ")", path);
}

}  // namespace

Result<LogDirLock> LogDirLock::Acquire(const std::string& dir, const std::string& job_id,
                                       const std::string& host, const std::string& store) {
  const std::string mine_name = LockFileName(host);
  const std::string path = dir + "/" + mine_name;
  // O_CLOEXEC: the job's processes must not keep the lock past fleetrun.
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return IoError("cannot open the log directory's lock file", path, errno);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string who = Holder(fd);
    close(fd);
    if (err != EWOULDBLOCK) return IoError("cannot lock", path, err);
    return InUse(dir, who);
  }
  const std::string me = "job " + job_id + " host " + (host.empty() ? "(one machine)" : host) +
                         (host.empty() ? "" : " store " + store) + " pid " +
                         std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int err = errno;
    close(fd);
    return IoError("cannot write the lock file", path, err);
  }
  LogDirLock lock(fd);
  // The other hosts' locks: one held by a live fleetrun of another job
  // means its files are here too. A lock nobody holds is a dead job's.
  DIR* entries = opendir(dir.c_str());
  if (entries == nullptr) return IoError("cannot list the log directory", dir, errno);
  Status other_job;
  while (const dirent* e = readdir(entries)) {
    const std::string_view name = e->d_name;
    if (name == mine_name || !name.starts_with(kPrefix) || !name.ends_with(kSuffix)) continue;
    const int other = openat(dirfd(entries), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (other < 0) continue;
    if (flock(other, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      const std::string who = Holder(other);
      // A job on one machine shares its folder with no other host, so a
      // live lock beside it is another job's, whatever its job id.
      const bool one_machine = host.empty() || name == LockFileName("");
      // The hosts of one job share its id and its KV store.
      if (one_machine || Field(who, "job") != job_id || Field(who, "store") != store) {
        other_job = InUse(dir, who);
      }
    }
    close(other);  // releases a shared lock taken on a dead job's file
    if (!other_job.ok()) break;
  }
  closedir(entries);
  if (!other_job.ok()) return other_job;
  return lock;
}

LogDirLock::~LogDirLock() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace fleet::launch
