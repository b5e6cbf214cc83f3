// Child processes for the collective process tests: spawn a program with
// its output in a log file, wait for it with a bound (killing it after),
// and read the log. Binaries come from BinDir() (tests/test_paths.h).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_paths.h"

namespace fleet::testing {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Exit {
  bool exited = false;  // normal exit, with `code`
  int code = -1;
  int signal = 0;       // killed by this signal
  bool timed_out = false;
  double seconds = 0;   // from start to exit
};

// A child process with stdout and stderr in `log`.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::vector<std::string>& env,
        const std::string& log)
      : start_(Clock::now()) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<std::string> a = args, e = env;
    std::vector<char*> argv, envp;
    for (std::string& s : a) argv.push_back(s.data());
    for (std::string& s : e) envp.push_back(s.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start " + args[0]);
  }
  ~Child() {
    if (!reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }

  // Waits at most `timeout`; kills the process after that.
  Exit Wait(milliseconds timeout) {
    Exit out;
    int status = 0;
    const auto deadline = Clock::now() + timeout;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        out.timed_out = true;
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    reaped_ = true;
    out.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    out.exited = WIFEXITED(status);
    out.code = out.exited ? WEXITSTATUS(status) : -1;
    out.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return out;
  }

 private:
  const Clock::time_point start_;
  pid_t pid_ = 0;
  bool reaped_ = false;
};

inline std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace fleet::testing
