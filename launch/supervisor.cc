#include "launch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace fleet::launch {
namespace {

// The write end the handlers use. A signal handler cannot reach an object,
// so this one process-wide value exists; SignalPipe::Install guards it.
volatile sig_atomic_t g_signal_write_fd = -1;
constexpr int kHandled[] = {SIGCHLD, SIGINT, SIGTERM};
struct sigaction g_previous[3];

void OnSignal(int signo) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  if (g_signal_write_fd >= 0) (void)!write(g_signal_write_fd, &byte, 1);
  errno = saved;
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= w;
  }
}

}  // namespace

Result<std::unique_ptr<SignalPipe>> SignalPipe::Install() {
  if (g_signal_write_fd >= 0) return Status::FailedPrecondition("a SignalPipe is already installed");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return Status::IOError("pipe2 for signals failed", std::strerror(errno));
  g_signal_write_fd = fds[1];
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int i = 0; i < 3; ++i) {
    if (sigaction(kHandled[i], &sa, &g_previous[i]) != 0) {
      return Status::IOError("sigaction failed", strsignal(kHandled[i]));
    }
  }
  return std::unique_ptr<SignalPipe>(new SignalPipe(fds[0], fds[1]));
}

SignalPipe::~SignalPipe() {
  for (int i = 0; i < 3; ++i) sigaction(kHandled[i], &g_previous[i], nullptr);
  g_signal_write_fd = -1;
  close(read_fd_);
  close(write_fd_);
}

Supervisor::Supervisor(SupervisorOptions options) : options_(options) {}

Supervisor::~Supervisor() {
  for (Proc& p : procs_) {
    if (p.pid > 0) {
      kill(-p.pid, SIGKILL);
      Reap(p, /*block=*/true);
    }
    CloseFds(p);
  }
}

void Supervisor::CloseFds(Proc& p) {
  if (p.tee_fd >= 0) close(p.tee_fd);
  if (p.log_fd >= 0) close(p.log_fd);
  p.tee_fd = p.log_fd = -1;
}

Result<size_t> Supervisor::Start(ProcessSpec spec) {
  procs_.push_back(Proc{.spec = std::move(spec)});
  Status st = Spawn(procs_.back(), /*append=*/false);
  if (!st.ok()) {
    procs_.pop_back();
    return st;
  }
  return procs_.size() - 1;
}

Status Supervisor::Restart(size_t index, ProcessSpec spec) {
  Proc& p = procs_.at(index);
  CHECK(p.pid <= 0) << "Restart of a running process " << p.spec.Name();
  CloseFds(p);
  p.spec = std::move(spec);
  p.escalated = false;
  ++p.restarts;
  return Spawn(p, /*append=*/true);
}

Status Supervisor::Spawn(Proc& p, bool append) {
  const ProcessSpec& spec = p.spec;
  // O_NOFOLLOW: a log file planted as a symbolic link is refused, never
  // followed to overwrite its target.
  int log_fd = open(spec.log_path.c_str(),
                    O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (append ? O_APPEND : O_TRUNC), 0644);
  if (log_fd < 0) return Status::IOError(std::string("cannot open log file (") + std::strerror(errno) + ")", spec.log_path);
  if (append) {
    std::string marker = "==== fleetrun: restart " + std::to_string(p.restarts) + " of " + spec.Name() + " ====\n";
    WriteAll(log_fd, marker.data(), marker.size());
  }
  int out_fd = log_fd;
  int pipe_fds[2] = {-1, -1};
  if (spec.tee) {
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
      close(log_fd);
      return Status::IOError("pipe2 for output failed", spec.Name());
    }
    fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
    out_fd = pipe_fds[1];
  }

  // Everything the child needs is built before fork: after fork only
  // async-signal-safe calls are allowed (other threads may hold locks).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    if (!IsProcessContractVariable(entry.substr(0, entry.find('='))))
      env_strings.emplace_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = spec.argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const std::string exec_error = "fleetrun: cannot exec " + spec.exe + ": ";
  // The child writes execve's errno here; a successful exec closes it
  // (O_CLOEXEC) unwritten. So Spawn knows at once whether the program runs,
  // instead of finding exit status 127 later, after starting all the others.
  int exec_fds[2];
  if (pipe2(exec_fds, O_CLOEXEC) != 0) {
    close(log_fd);
    if (spec.tee) close(pipe_fds[0]), close(pipe_fds[1]);
    return Status::IOError("pipe2 for exec status failed", spec.Name());
  }

  const pid_t pid = fork();
  if (pid < 0) {
    const int fork_errno = errno;
    close(log_fd);
    close(exec_fds[0]);
    close(exec_fds[1]);
    if (spec.tee) close(pipe_fds[0]), close(pipe_fds[1]);
    return Status::Internal(std::string("fork failed (") + std::strerror(fork_errno) + ")", spec.Name());
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // fleetrun died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int signo : kHandled) signal(signo, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(out_fd, STDERR_FILENO);
    execve(spec.exe.c_str(), argv.data(), envp.data());
    const int exec_errno = errno;
    WriteAll(exec_fds[1], reinterpret_cast<const char*>(&exec_errno), sizeof(exec_errno));
    const char* reason = strerror(exec_errno);
    WriteAll(STDERR_FILENO, exec_error.data(), exec_error.size());
    WriteAll(STDERR_FILENO, reason, std::strlen(reason));
    WriteAll(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent, so a kill(-pid) right away cannot miss
  close(exec_fds[1]);
  int exec_errno = 0;
  ssize_t got;
  // Bounded: the child only sets up its descriptors before execve.
  do {
    got = read(exec_fds[0], &exec_errno, sizeof(exec_errno));
  } while (got < 0 && errno == EINTR);
  close(exec_fds[0]);
  if (got == sizeof(exec_errno)) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(log_fd);
    if (spec.tee) close(pipe_fds[0]), close(pipe_fds[1]);
    p.last_pid = pid;
    p.last_status = status;
    return Status::IOError(std::string("cannot exec (") + std::strerror(exec_errno) + ")", spec.exe);
  }
  p.pid = p.last_pid = pid;
  if (spec.tee) {
    close(pipe_fds[1]);
    p.tee_fd = pipe_fds[0];
    p.log_fd = log_fd;
  } else {
    close(log_fd);
  }
  return Status::OK();
}

void Supervisor::DrainTee(Proc& p) {
  if (p.tee_fd < 0) return;
  char buf[16384];
  while (true) {
    ssize_t n = read(p.tee_fd, buf, sizeof(buf));
    if (n > 0) {
      WriteAll(p.log_fd, buf, n);
      std::fwrite(buf, 1, n, options_.tee_out);
      std::fflush(options_.tee_out);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // every writer is gone
      close(p.tee_fd);
      p.tee_fd = -1;
    }
    return;
  }
}

bool Supervisor::Reap(Proc& p, bool block) {
  if (p.pid <= 0) return false;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(p.pid, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r != p.pid) return false;
  // Whatever the process left in its group (children it forked) goes too.
  kill(-p.pid, SIGKILL);
  p.pid = -1;
  p.last_status = status;
  DrainTee(p);
  return true;
}

std::vector<Supervisor::Event> Supervisor::Poll(std::chrono::milliseconds timeout) {
  std::vector<pollfd> fds;
  if (options_.wake_fd >= 0) fds.push_back({options_.wake_fd, POLLIN, 0});
  for (const Proc& p : procs_) {
    if (p.tee_fd >= 0) fds.push_back({p.tee_fd, POLLIN, 0});
  }
  std::vector<Event> events;
  int n = poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (n > 0 && options_.wake_fd >= 0 && (fds[0].revents & POLLIN)) {
    unsigned char buf[64];
    ssize_t got;
    while ((got = read(options_.wake_fd, buf, sizeof(buf))) > 0) {
      for (ssize_t i = 0; i < got; ++i) {
        if (buf[i] == SIGINT || buf[i] == SIGTERM) events.push_back({.kind = Event::kSignal, .signo = buf[i]});
      }
    }
  }
  for (Proc& p : procs_) DrainTee(p);
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (Reap(procs_[i], /*block=*/false)) {
      events.push_back({.kind = Event::kExited, .index = i, .wait_status = procs_[i].last_status});
    }
  }
  return events;
}

std::vector<int> Supervisor::Stop(const std::vector<size_t>& which, std::chrono::milliseconds grace,
                                  StopReason reason) {
  for (size_t i : which) {
    if (procs_[i].pid > 0) {
      kill(-procs_[i].pid,
           reason == StopReason::kFinished ? SIGTERM : procs_[i].spec.abandon_signal);
      // A stopped (SIGSTOP'd, frozen in a debugger) process acts on the
      // signal only once continued; otherwise it would wait for the SIGKILL.
      kill(-procs_[i].pid, SIGCONT);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  auto any_running = [&] {
    return std::any_of(which.begin(), which.end(), [&](size_t i) { return procs_[i].pid > 0; });
  };
  while (any_running() && std::chrono::steady_clock::now() < deadline) {
    // Short polls: SIGCHLD wakes us through wake_fd; the bytes it leaves are
    // consumed here and the stop signals among them do not matter any more.
    Poll(std::chrono::milliseconds(20));
  }
  for (size_t i : which) {
    Proc& p = procs_[i];
    if (p.pid > 0) {
      // It ignored SIGTERM for the whole grace period.
      p.escalated = true;
      kill(-p.pid, SIGKILL);
      Reap(p, /*block=*/true);
    }
    DrainTee(p);
  }
  std::vector<int> statuses;
  for (size_t i : which) statuses.push_back(procs_[i].last_status);
  return statuses;
}

void Supervisor::StopAll(std::chrono::milliseconds grace) {
  Stop(Running(), grace, StopReason::kAbandoned);
}

std::vector<size_t> Supervisor::Running() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (procs_[i].pid > 0) out.push_back(i);
  }
  return out;
}

std::string Supervisor::LogTail(size_t index, size_t lines) const {
  const std::string& path = procs_.at(index).spec.log_path;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "(cannot read " + path + ")\n";
  constexpr off_t kMaxBytes = 64 * 1024;
  struct stat st {};
  fstat(fd, &st);
  off_t start = std::max<off_t>(0, st.st_size - kMaxBytes);
  std::string data(st.st_size - start, '\0');
  ssize_t got = pread(fd, data.data(), data.size(), start);
  close(fd);
  data.resize(std::max<ssize_t>(got, 0));
  if (data.empty()) return data;
  if (data.back() != '\n') data += '\n';
  // Walk back from the final newline; the `lines`-th newline before it
  // ends the line just before the tail.
  size_t found = 0;
  for (size_t i = data.size() - 1; i > 0; --i) {
    if (data[i - 1] == '\n' && ++found == lines) return data.substr(i);
  }
  return data;
}

std::string Supervisor::DescribeWaitStatus(int s) {
  if (WIFEXITED(s)) return "exited with status " + std::to_string(WEXITSTATUS(s));
  if (WIFSIGNALED(s)) {
    return "was killed by signal " + std::to_string(WTERMSIG(s)) + " (" + strsignal(WTERMSIG(s)) + ")";
  }
  return "ended with wait status " + std::to_string(s);
}

}  // namespace fleet::launch
