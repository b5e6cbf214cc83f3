#include "bench/child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace fleet::bench {
namespace {

using Clock = std::chrono::steady_clock;

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

Result<Child> SpawnChild(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                         const std::string& name) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return Status::IOError("pipe2", std::strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return Status::IOError("pipe2", std::strerror(errno));
  }
  // Everything exec needs is made before fork: the child may only make
  // async-signal-safe calls.
  std::vector<std::string> args = argv, vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const std::string key = var.substr(0, var.find('='));
    bool overridden = false;
    for (const std::string& o : env) overridden |= o.substr(0, o.find('=')) == key;
    if (!overridden) vars.push_back(var);
  }
  vars.insert(vars.end(), env.begin(), env.end());
  std::vector<char*> arg_ptrs, env_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  arg_ptrs.push_back(nullptr);
  for (auto& v : vars) env_ptrs.push_back(v.data());
  env_ptrs.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    return Status::IOError("fork", std::strerror(errno));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    // dup2 clears FD_CLOEXEC on the copies: stdin and stdout survive exec.
    if (dup2(in[0], STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0) _exit(126);
    execve(arg_ptrs[0], arg_ptrs.data(), env_ptrs.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  Child child;
  child.pid = pid;
  child.stdin_fd = in[1];
  child.stdout_fd = out[0];
  child.name = name;
  return child;
}

Status WriteLine(Child& child, const std::string& line) {
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(child.stdin_fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::IOError(absl::StrCat("cannot write to ", child.name, " (pid ", child.pid, ")"),
                             std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  return Status::OK();
}

Result<std::string> ReadLine(Child& child, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    if (const size_t eol = child.pending.find('\n'); eol != std::string::npos) {
      std::string line = child.pending.substr(0, eol);
      child.pending.erase(0, eol + 1);
      return line;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{child.stdout_fd, POLLIN, 0};
    const int ready = left.count() > 0 ? poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      return Status::Timeout(
          absl::StrCat(child.name, " (pid ", child.pid, ") did not answer ", what, " in time"));
    }
    char buf[65536];
    const ssize_t n = read(child.stdout_fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::Unavailable(
          absl::StrCat(child.name, " (pid ", child.pid, ") exited before answering ", what));
    }
    child.pending.append(buf, static_cast<size_t>(n));
  }
}

void Reap(Child& child, std::chrono::seconds timeout) {
  CloseFd(child.stdin_fd);
  CloseFd(child.stdout_fd);
  if (child.pid < 0) return;
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  while (Clock::now() < deadline) {
    const pid_t r = waitpid(child.pid, &status, WNOHANG);
    if (r == child.pid || r < 0) {
      if (r == child.pid && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
        std::fprintf(stderr, "%s (pid %d) ended with status %d\n", child.name.c_str(), child.pid,
                     status);
      child.pid = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "%s (pid %d) did not stop within %lld s; killing it\n", child.name.c_str(),
               child.pid, static_cast<long long>(timeout.count()));
  kill(child.pid, SIGKILL);
  waitpid(child.pid, &status, 0);
  child.pid = -1;
}

double ProcessCpuSeconds(pid_t pid) {
  std::error_code ec;
  double total = 0;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(task.path() / "schedstat");
    unsigned long long ns = 0;
    if (in >> ns) total += static_cast<double>(ns) / 1e9;
  }
  return total;
}

std::vector<ThreadSample> SampleThreads(pid_t pid) {
  std::vector<ThreadSample> out;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    ThreadSample t;
    t.tid = static_cast<pid_t>(std::stol(task.path().filename().string()));
    std::ifstream stat(task.path() / "schedstat");
    unsigned long long ns = 0;
    if (!(stat >> ns)) continue;
    t.cpu_s = static_cast<double>(ns) / 1e9;
    std::ifstream comm(task.path() / "comm");
    std::getline(comm, t.name);
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.find("ctxt_switches:") != std::string::npos)
        t.switches += std::stoll(line.substr(line.find(':') + 1));
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace fleet::bench
