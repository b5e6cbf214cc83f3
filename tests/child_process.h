// The one way tests start processes: a program (fork + exec) or a function
// of the test binary (fork), with its environment, output files or pipes,
// process group and a hook that runs in the child first (e.g. to enter a
// network namespace); waits are bounded and kill the child after. Shell
// commands whose output a test reads (python, ip, protoc) go through
// RunCommand. A Child still running when it is destroyed is killed (with
// its group, when it has one) and reaped, so a failed test leaves nothing.
//
// Everything the child needs is built before fork: after fork only
// async-signal-safe calls run until exec (the test may have threads).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_paths.h"

extern char** environ;

namespace fleet::testing {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How a child ended.
struct Exit {
  bool exited = false;  // normal exit, with `code`
  int code = -1;
  int signal = 0;  // killed by this signal
  bool timed_out = false;
  double seconds = 0;  // from start to exit

  // The shell's view: the exit code, or 128 + the signal.
  int ShellCode() const { return exited ? code : 128 + signal; }
};

// How a child starts. By default it inherits this process's environment
// and output. (Every member has an initializer, so that designated
// initializers may leave any out without GCC 12's -Wextra warning.)
struct ChildOptions {
  // NAME=value entries added to the inherited environment, or (with
  // inherit_env false) the whole of it, except that LD_LIBRARY_PATH is
  // passed on when `env` does not set it: it says where this build's
  // shared libraries are (a GPU machine's bundle, ../shared/gpu/pack.sh),
  // not anything a program under test reads.
  std::vector<std::string> env = {};
  bool inherit_env = true;
  // Inherited variables whose names start with one of these are left out.
  std::vector<std::string> drop_env_prefixes = {};
  // Files for stdout and stderr ("" inherits; one path for both shares one
  // file). stdout_file "/dev/null" discards.
  std::string stdout_file = {}, stderr_file = {};
  mode_t file_mode = 0644;
  // Pipes instead: read them through Child::out_fd() and err_fd().
  bool pipe_output = false;
  // The child leads a process group of its own; Kill and the destructor
  // signal the whole group.
  bool own_process_group = false;
  // Runs in the child right after fork (before the exec or the function);
  // it may _exit to fail the start.
  std::function<void()> in_child = {};
};

class Child {
 public:
  // Starts the program args[0]. A program that cannot be executed fails the
  // current test, naming it and the reason.
  Child(const std::vector<std::string>& args, ChildOptions options) : start_(Clock::now()) {
    Start(args, {}, std::move(options));
  }

  // The common case: `env` is the whole environment, stdout and stderr both
  // go to `log`.
  Child(const std::vector<std::string>& args, const std::vector<std::string>& env,
        const std::string& log)
      : Child(args, ChildOptions{.env = env, .inherit_env = false, .stdout_file = log, .stderr_file = log}) {}

  // Forks this test binary and runs `body` in the child, which exits with
  // its return value.
  static Child Fork(std::function<int()> body, ChildOptions options = {}) {
    Child child;
    child.Start({}, std::move(body), std::move(options));
    return child;
  }

  // No process: started() is false (a member to move a started one into).
  Child() : start_(Clock::now()) {}

  Child(Child&& other) noexcept { *this = std::move(other); }
  Child& operator=(Child&& other) noexcept {
    std::swap(pid_, other.pid_);
    std::swap(group_, other.group_);
    std::swap(reaped_, other.reaped_);
    std::swap(out_fd_, other.out_fd_);
    std::swap(err_fd_, other.err_fd_);
    start_ = other.start_;
    return *this;
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  ~Child() {
    if (pid_ > 0 && !reaped_) {
      Kill(SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    CloseOutput();
  }

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  Clock::time_point start_time() const { return start_; }

  // The read ends of the output pipes (pipe_output); -1 once closed.
  int out_fd() const { return out_fd_; }
  int err_fd() const { return err_fd_; }
  void CloseOutput() {
    for (int* fd : {&out_fd_, &err_fd_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }

  // Hands the process over to the caller, who then reaps it (for helpers
  // that track a job by its pid); this Child no longer kills or waits.
  pid_t Release() {
    reaped_ = true;
    return pid_;
  }

  // Sends `signal` to the child, or to its group when it leads one. True
  // when delivered.
  bool Kill(int signal = SIGKILL) const {
    if (pid_ <= 0 || reaped_) return false;
    return kill(group_ ? -pid_ : pid_, signal) == 0;
  }

  // The exit, when the child has ended; nullopt while it runs.
  std::optional<Exit> Poll() {
    if (pid_ <= 0 || reaped_) return std::nullopt;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    return Reaped(status, false);
  }

  // Waits at most `timeout` for the child to exit; kills it (and its group)
  // after that, and says so in `timed_out`.
  Exit Wait(milliseconds timeout) {
    if (pid_ <= 0 || reaped_) return Exit{};
    const auto deadline = Clock::now() + timeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        Kill(SIGKILL);
        waitpid(pid_, &status, 0);
        return Reaped(status, true);
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return Reaped(status, false);
  }

 private:

  void Start(const std::vector<std::string>& args, std::function<int()> body, ChildOptions options) {
    // argv, envp and the output files' names, built before fork.
    std::vector<std::string> arg_text = args;
    std::vector<char*> argv;
    for (std::string& a : arg_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_text;
    if (options.inherit_env) {
      for (char** e = environ; *e != nullptr; ++e) {
        bool dropped = false;
        for (const std::string& prefix : options.drop_env_prefixes) dropped |= std::strncmp(*e, prefix.c_str(), prefix.size()) == 0;
        if (!dropped) env_text.emplace_back(*e);
      }
    }
    env_text.insert(env_text.end(), options.env.begin(), options.env.end());
    const char* loader_path = std::getenv("LD_LIBRARY_PATH");
    if (!options.inherit_env && loader_path != nullptr &&
        std::none_of(env_text.begin(), env_text.end(),
                     [](const std::string& e) { return e.starts_with("LD_LIBRARY_PATH="); })) {
      env_text.push_back(std::string("LD_LIBRARY_PATH=") + loader_path);
    }
    std::vector<char*> envp;
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (options.pipe_output && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
      ADD_FAILURE() << "pipe2 failed: " << std::strerror(errno);
      return;
    }
    // The child reports a failed exec's errno here; a successful exec
    // closes it (O_CLOEXEC), so the parent reads end-of-file.
    int exec_status[2];
    if (pipe2(exec_status, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed: " << std::strerror(errno);
      return;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed: " << std::strerror(errno);
      return;
    }
    if (pid == 0) {
      if (options.own_process_group) setpgid(0, 0);
      if (options.in_child) options.in_child();
      RedirectInChild(options, out_pipe, err_pipe);
      if (body) {
        close(exec_status[1]);  // no exec to close it: the parent must not wait for our end
        _exit(body());
      }
      execve(argv[0], argv.data(), envp.data());
      const int error = errno;
      (void)!write(exec_status[1], &error, sizeof(error));
      _exit(127);
    }
    pid_ = pid;
    group_ = options.own_process_group;
    if (group_) setpgid(pid, pid);  // also here, so that an early Kill reaches the group
    close(exec_status[1]);
    int exec_errno = 0;
    ssize_t got;
    do {
      got = read(exec_status[0], &exec_errno, sizeof(exec_errno));
    } while (got < 0 && errno == EINTR);
    close(exec_status[0]);
    if (got == sizeof(exec_errno)) {
      ADD_FAILURE() << "cannot start " << args[0] << ": " << std::strerror(exec_errno);
    }
    if (options.pipe_output) {
      close(out_pipe[1]);
      close(err_pipe[1]);
      out_fd_ = out_pipe[0];
      err_fd_ = err_pipe[0];
    }
  }

  // Points the child's stdout and stderr where the options say.
  static void RedirectInChild(const ChildOptions& options, const int out_pipe[2], const int err_pipe[2]) {
    if (options.pipe_output) {
      dup2(out_pipe[1], STDOUT_FILENO);
      dup2(err_pipe[1], STDERR_FILENO);
      return;
    }
    int out = -1;
    if (!options.stdout_file.empty()) {
      out = open(options.stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, options.file_mode);
      if (out >= 0) dup2(out, STDOUT_FILENO);
    }
    if (!options.stderr_file.empty()) {
      if (options.stderr_file == options.stdout_file && out >= 0) {
        dup2(out, STDERR_FILENO);
      } else {
        const int err = open(options.stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, options.file_mode);
        if (err >= 0) dup2(err, STDERR_FILENO);
      }
    }
  }

  Exit Reaped(int status, bool timed_out) {
    reaped_ = true;
    Exit out;
    out.timed_out = timed_out;
    out.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    out.exited = WIFEXITED(status);
    out.code = out.exited ? WEXITSTATUS(status) : -1;
    out.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return out;
  }

  Clock::time_point start_;
  pid_t pid_ = -1;
  bool group_ = false;
  bool reaped_ = false;
  int out_fd_ = -1, err_fd_ = -1;
};

// A shell command's exit code (-1 when it did not exit normally or ran past
// `timeout`) and its stdout and stderr together.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

// The whole of a file, byte for byte ("" when it cannot be read).
inline std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Resident memory of process `pid` in KiB (VmRSS), -1 when unknown.
inline int64_t ResidentKib(pid_t pid) {
  std::istringstream status(ReadAll("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6));
  }
  return -1;
}

// Runs `command` with /bin/sh, its output in a temporary file (so a chatty
// command cannot fill a pipe), killed with everything it started after
// `timeout`.
inline CommandResult RunCommand(const std::string& command, milliseconds timeout = milliseconds(300000)) {
  char path[] = "/tmp/fleet_command_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) {
    ADD_FAILURE() << "mkstemp failed: " << std::strerror(errno);
    return {};
  }
  close(fd);
  Child shell({"/bin/sh", "-c", command},
              ChildOptions{.stdout_file = path, .stderr_file = path, .own_process_group = true});
  const Exit exit = shell.Wait(timeout);
  CommandResult result;
  result.output = ReadAll(path);
  std::remove(path);
  if (exit.timed_out) {
    ADD_FAILURE() << "`" << command << "` did not finish within " << timeout.count() << " ms";
  } else if (exit.exited) {
    result.exit_code = exit.code;
  }
  return result;
}

}  // namespace fleet::testing
