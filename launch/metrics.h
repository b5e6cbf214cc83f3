// JobMetrics: what fleetrun knows about its job's processes, kept as
// Prometheus metrics (prometheus-cpp) for the KV store's GET /metrics and
// written as JSON lines to <log_dir>/metrics.jsonl.
//
// Per process (labels role, rank):
//   fleet_process_step                   steps done (progress/<role>/<rank>,
//                                        comm/progress_report.h)
//   fleet_process_total_steps            steps of the whole job
//   fleet_process_samples_per_second     throughput at its last report
//   fleet_process_last_heartbeat_seconds unix time of its last report
//   fleet_process_up                     1 while running, 0 once exited
//   fleet_process_exit_code              its exit code (128+N: killed by N)
//
// Thread-safe: the launcher updates it while the store's threads serve Text().
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "comm/progress_report.h"
#include "comm/status.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Gauge;
}  // namespace prometheus

namespace fleet::launch {

class JobMetrics {
 public:
  // `jsonl_path`: where the JSON lines go (created or appended); empty for none.
  explicit JobMetrics(const std::string& jsonl_path);
  ~JobMetrics();
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // A progress report of a process; a report already seen (same unix_ms) is
  // ignored. Appends a JSON line for a new one.
  void Progress(const std::string& role, int rank, const ProgressValue& value);
  void Started(const std::string& role, int rank);
  void Exited(const std::string& role, int rank, int exit_code);

  // The sum of the last reported throughputs of every process of `role`.
  double Throughput(const std::string& role) const;

  // The Prometheus text exposition of every metric.
  std::string Text() const;

 private:
  prometheus::Gauge& Gauge(prometheus::Family<prometheus::Gauge>* family, const std::string& role,
                           int rank);
  void WriteLine(const std::string& line);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* step_;
  prometheus::Family<prometheus::Gauge>* total_;
  prometheus::Family<prometheus::Gauge>* throughput_;
  prometheus::Family<prometheus::Gauge>* heartbeat_;
  prometheus::Family<prometheus::Gauge>* up_;
  prometheus::Family<prometheus::Gauge>* exit_code_;

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, ProgressValue> last_;  // guarded by mu_
  std::FILE* jsonl_ = nullptr;                                 // guarded by mu_
};

}  // namespace fleet::launch
