// Linux perf sampling every CPU, switched on only around the parts of a
// benchmark it should profile: `perf record -a --delay=-1` driven through its
// --control fifos, so the samples cover exactly the timed rounds (no
// start-up, warm-up or other system's rounds) without a perf start per round.
//
// Thread safety: none; one thread drives a PerfRecord.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "bench/child.h"
#include "comm/status.h"

namespace fleet::bench {

class PerfRecord {
 public:
  // Starts perf (the first `perf` on PATH) writing `path`, sampling the
  // cpu-clock of every CPU once per `period` of CPU time, with sampling off.
  // NotFound when there is no perf; IOError or Timeout when it does not come
  // up (no permission for system-wide sampling: perf_event_paranoid).
  static Result<std::unique_ptr<PerfRecord>> Start(const std::string& path,
                                                   std::chrono::microseconds period);
  ~PerfRecord();  // Finish() if not done, its error on stderr
  PerfRecord(const PerfRecord&) = delete;
  PerfRecord& operator=(const PerfRecord&) = delete;

  // Sampling on / off; each returns once perf acknowledged it.
  Status Enable() { return Command("enable"); }
  Status Disable() { return Command("disable"); }
  // Stops perf and waits for it to write the file.
  Status Finish();

  std::chrono::microseconds period() const { return period_; }

 private:
  PerfRecord() = default;
  Status Command(const std::string& command);

  Child perf_;
  std::string fifo_dir_;  // the control and ack fifos, removed by Finish
  int control_fd_ = -1, ack_fd_ = -1;
  std::chrono::microseconds period_{0};
  bool finished_ = false;
};

}  // namespace fleet::bench
