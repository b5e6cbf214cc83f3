// Helpers for tests that run a real fleetrun job and inject faults into it:
// start fleetrun with its output in a file, read the pids it logs, wait for
// a line, wait for its end, and find any process of the job left behind
// (by pid and by the FLEET_JOB_ID in its environment).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/child_process.h"


namespace fleet::testing {

// Running and not a zombie (a zombie whose parent does not reap it runs
// nothing).
inline bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// Live processes whose environment holds FLEET_JOB_ID=<job_id>: every
// process fleetrun started for the job, and any child they forked.
inline std::vector<pid_t> ProcessesOfJob(const std::string& job_id) {
  const std::string needle = "FLEET_JOB_ID=" + job_id + '\0';
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    std::string env = ReadAll(entry.path() / "environ");
    env.push_back('\0');
    if (env.find(needle) != std::string::npos && ProcessAlive(pid)) out.push_back(pid);
  }
  return out;
}

// Writes 2 training files and 1 test file of `lines_per_file` Criteo lines
// into `out_dir` with `bin_dir`/gen_ctr_data. "" on success, else the
// command that failed.
inline std::string GenerateCtrData(const std::string& bin_dir, const std::filesystem::path& out_dir,
                                   int lines_per_file) {
  const std::string gen = bin_dir + "/gen_ctr_data --out_dir=" + out_dir.string() +
                          " --train_files=2 --test_files=1 --lines_per_file=" +
                          std::to_string(lines_per_file) + " >/dev/null 2>&1";
  return RunCommand(gen).exit_code == 0 ? "" : gen;
}

// A fleetrun job started by StartFleetrun.
struct FleetJob {
  pid_t fleetrun = -1;
  std::filesystem::path output;  // fleetrun's stdout and stderr
  std::string job_id;
  // "server 0" -> pid, from fleetrun's "started ..." and "restarted ..."
  // lines (the latest pid of each process); see ReadPids.
  std::map<std::string, pid_t> pids;

  std::string Output() const { return ReadAll(output); }

  void ReadPids() {
    const std::string out = Output();
    const std::regex started(R"(fleetrun: (?:re)?started (\w+ \d+) .*?pid (\d+))");
    for (std::sregex_iterator it(out.begin(), out.end(), started), end; it != end; ++it) {
      pids[(*it)[1]] = std::stoi((*it)[2]);
    }
  }

  // Waits until fleetrun's output holds `text`; false when fleetrun ended
  // first or `timeout` passed.
  bool WaitFor(const std::string& text, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Output().find(text) != std::string::npos) {
        ReadPids();
        return true;
      }
      if (Ended()) return Output().find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // Whether fleetrun has exited (reaps it and keeps its exit code).
  bool Ended() {
    if (exit_code) return true;
    int status = 0;
    if (waitpid(fleetrun, &status, WNOHANG) != fleetrun) return false;
    exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }

  // fleetrun's exit code (128 + signal when killed) once it ended within
  // `timeout`; otherwise kills it (SIGKILL) and returns nullopt.
  std::optional<int> WaitForExit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Ended()) return exit_code;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(fleetrun, SIGKILL);
    waitpid(fleetrun, nullptr, 0);
    return std::nullopt;
  }

  // Processes of the job still alive: by FLEET_JOB_ID and by logged pid.
  std::vector<pid_t> Left() {
    ReadPids();
    std::vector<pid_t> left = ProcessesOfJob(job_id);
    for (const auto& [who, pid] : pids) {
      if (ProcessAlive(pid)) left.push_back(pid);
    }
    return left;
  }

  std::optional<int> exit_code;
};

// Starts `args` (args[0] is fleetrun's path; pass --job_id=<job_id>
// among them) with stdout and stderr going to `output`. `in_child`, when
// given, runs in the child before the exec (e.g. to enter a network
// namespace; it _exits when that fails).
inline FleetJob StartFleetrun(std::vector<std::string> args, const std::filesystem::path& output,
                              const std::string& job_id, const std::function<void()>& in_child = {}) {
  FleetJob job;
  job.output = output;
  job.job_id = job_id;
  Child fleetrun(args, ChildOptions{.stdout_file = output.string(), .stderr_file = output.string(),
                                    .in_child = in_child});
  job.fleetrun = fleetrun.Release();  // the job reaps it (Ended, WaitForExit)
  return job;
}

}  // namespace fleet::testing
