// JobPage: the job page fleetrun serves on its KV store's port, the page a
// person opens instead of tailing every log:
//
//   GET /job         the page (HTML and script, no data; JobPageHtml());
//   GET /job/state   its data, JSON, polled by the page every 2 s:
//     {"job": ID, "mode": "...", "status": "running" | "done" | "failed ...",
//      "wall_s": seconds since fleetrun started,
//      "processes": [{"host", "name", "role", "rank", "pid", "state",
//                     "restarts", "endpoint", "log", "tail": [lines]}],
//      "series": {"worker 0": {"t": [unix ms], "step": [...],
//                              "samples_per_s": [...], "<figure>": [...]}}}
//
// The series hold every progress report fleetrun read (comm/progress_report.h:
// steps, throughput, and the figures the logs print: loss, AUC, tokens/s),
// at most kMaxPoints per process (when full, every other point is dropped,
// so a long job keeps its whole shape at half the resolution).
//
// On a job over several hosts each fleetrun publishes its processes under
// page/hosts/<host> in the store (ProcessesJson), and the store's host
// shows them all (SetRemoteProcesses).
//
// Thread-safe: the launcher's loop writes while the store's thread reads.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/progress_report.h"

namespace fleet::launch {

class JobPage {
 public:
  struct Process {
    std::string host;  // "this host" or its address in the job
    std::string name;  // "worker 0"
    std::string role;
    int rank = 0;
    int pid = 0;
    std::string state;  // "running", "exited 0", "killed by signal 9 (Killed)"
    int restarts = 0;
    std::string endpoint;
    std::string log;
    std::vector<std::string> tail;  // its log's last lines
  };

  static constexpr size_t kMaxPoints = 512;

  JobPage(std::string job_id, std::string mode);

  void SetProcesses(std::vector<Process> processes);
  // Another host's processes, as its fleetrun published them (ProcessesJson
  // text); ignored when it does not parse.
  void SetRemoteProcesses(const std::string& host, const std::string& json);
  // A progress report of process `name`; one already seen (same unix_ms)
  // is ignored.
  void AddReport(const std::string& name, const ProgressValue& value);
  void SetStatus(std::string status);

  // GET /job/state's body.
  std::string StateJson() const;
  // The JSON array of `processes`, as StateJson lists them.
  static std::string ProcessesJson(const std::vector<Process>& processes);

 private:
  struct Series {
    int64_t last_unix_ms = -1;
    std::vector<int64_t> t;
    // "step", "samples_per_s", then each figure, by name.
    std::map<std::string, std::vector<double>> values;
  };

  const std::string job_id_;
  const std::string mode_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  mutable std::mutex mu_;
  std::string status_ = "running";             // guarded by mu_
  std::vector<Process> processes_;             // guarded by mu_
  std::map<std::string, std::string> remote_;  // guarded by mu_; host -> JSON array
  std::map<std::string, Series> series_;       // guarded by mu_; by process name
};

// The page itself: one HTML document with its style and script, which
// polls /job/state (with the bearer token of the URL's #token=..., if any)
// and draws the process table and an SVG chart per figure.
std::string_view JobPageHtml();

}  // namespace fleet::launch
