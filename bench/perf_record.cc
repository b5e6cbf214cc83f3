#include "bench/perf_record.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fleet::bench {
namespace {

using Clock = std::chrono::steady_clock;
// perf answers a command within milliseconds; its start-up and the final
// write of a few MB of samples take longer.
constexpr auto kCommandTimeout = std::chrono::seconds(10);
constexpr auto kFinishTimeout = std::chrono::seconds(60);

std::string FindOnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  const std::vector<std::string> dirs = absl::StrSplit(path ? path : "/usr/bin:/bin", ':');
  for (const std::string& dir : dirs) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// perf's exit, waited for until `deadline`: OK for status 0.
Status WaitForExit(pid_t pid, Clock::time_point deadline) {
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::OK();
      return Status::IOError(
          absl::StrCat("perf record ended with ", WIFEXITED(status) ? "exit status " : "signal ",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status)),
          "see its messages above");
    }
    if (r < 0) return Status::IOError("waitpid(perf)", std::strerror(errno));
    if (Clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return Status::Timeout("perf record did not exit within 60 s of 'stop'; killed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

Result<std::unique_ptr<PerfRecord>> PerfRecord::Start(const std::string& path,
                                                      std::chrono::microseconds period) {
  const std::string perf = FindOnPath("perf");
  if (perf.empty()) return Status::NotFound("no perf on PATH", "install linux-perf");
  std::unique_ptr<PerfRecord> r(new PerfRecord());
  r->period_ = period;
  std::string dir = (std::filesystem::temp_directory_path() / "fleet-perf-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr)
    return Status::IOError("mkdtemp " + dir, std::strerror(errno));
  r->fifo_dir_ = dir;
  const std::string control = dir + "/control", ack = dir + "/ack";
  for (const std::string& f : {control, ack}) {
    if (mkfifo(f.c_str(), 0600) != 0) return Status::IOError("mkfifo " + f, std::strerror(errno));
  }
  // perf opens the ack fifo for writing, which blocks until it has a
  // reader: open it first (non-blocking, so this does not wait for perf).
  r->ack_fd_ = open(ack.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (r->ack_fd_ < 0) return Status::IOError("open " + ack, std::strerror(errno));
  FLEET_ASSIGN_OR_RETURN(
      r->perf_, SpawnChild({perf, "record", "-q", "-a", "-e", "cpu-clock", "-c",
                            std::to_string(period.count() * 1000), "--delay=-1", "--no-buildid",
                            absl::StrCat("--control=fifo:", control, ",", ack), "-o", path},
                           {}, "perf record"));
  // The control fifo opens for writing once perf has opened it.
  const auto deadline = Clock::now() + kCommandTimeout;
  while ((r->control_fd_ = open(control.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) < 0) {
    int status = 0;
    if (errno != ENXIO) return Status::IOError("open " + control, std::strerror(errno));
    if (waitpid(r->perf_.pid, &status, WNOHANG) == r->perf_.pid) {
      r->perf_.pid = -1;
      return Status::IOError("perf record exited at start",
                             "see its message above (system-wide sampling needs root or "
                             "kernel.perf_event_paranoid <= 0)");
    }
    if (Clock::now() >= deadline)
      return Status::Timeout("perf record did not open its control fifo within 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FLEET_RETURN_IF_ERROR(r->Command("ping"));  // its event loop runs
  return r;
}

Status PerfRecord::Command(const std::string& command) {
  const std::string line = command + "\n";
  if (write(control_fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    return Status::IOError("write to perf's control fifo", std::strerror(errno));
  pollfd p{ack_fd_, POLLIN, 0};
  const int n = poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kCommandTimeout).count()));
  if (n == 0) {
    return Status::Timeout(
        absl::StrCat("perf record did not acknowledge '", command, "' within 10 s"));
  }
  if (n < 0) return Status::IOError("poll perf's ack fifo", std::strerror(errno));
  char ack[16];
  const ssize_t got = read(ack_fd_, ack, sizeof ack);
  if (got <= 0) {
    return Status::IOError(absl::StrCat("perf record closed its ack fifo after '", command, "'"));
  }
  return Status::OK();
}

Status PerfRecord::Finish() {
  if (finished_) return Status::OK();
  finished_ = true;
  Status status = Status::OK();
  if (perf_.pid > 0) {
    // perf acknowledges nothing after 'stop': it leaves its loop and writes.
    const std::string stop = "stop\n";
    if (write(control_fd_, stop.data(), stop.size()) != static_cast<ssize_t>(stop.size()))
      status = Status::IOError("write 'stop' to perf's control fifo", std::strerror(errno));
    else
      status = WaitForExit(perf_.pid, Clock::now() + kFinishTimeout);
    perf_.pid = -1;
  }
  for (int* fd : {&control_fd_, &ack_fd_, &perf_.stdin_fd, &perf_.stdout_fd}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  std::error_code ignored;
  if (!fifo_dir_.empty()) std::filesystem::remove_all(fifo_dir_, ignored);
  return status;
}

PerfRecord::~PerfRecord() {
  if (perf_.pid > 0 && control_fd_ < 0) {
    kill(perf_.pid, SIGKILL);  // it never came up
    waitpid(perf_.pid, nullptr, 0);
    perf_.pid = -1;
  }
  if (Status s = Finish(); !s.ok()) std::fprintf(stderr, "perf record: %s\n", s.ToString().c_str());
}

}  // namespace fleet::bench
