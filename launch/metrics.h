// JobMetrics: what fleetrun knows about its job's processes, kept as
// Prometheus metrics (prometheus-cpp) for the KV store's GET /metrics and
// written as JSON lines to <log_dir>/metrics.jsonl, each with the job id.
//
// Per process (labels role, rank):
//   fleet_process_steps_total                    steps done (progress/<role>/<rank>,
//                                                comm/progress_report.h)
//   fleet_process_total_steps                    steps of the whole job
//   fleet_process_samples_per_second             throughput at its last report
//   fleet_process_last_report_timestamp_seconds  unix time of its last report
//   fleet_process_up                             1 while running, 0 once exited
//   fleet_process_exit_code                      its exit code (128+N: killed by N)
//   fleet_process_restarts_total                 restarts by fleetrun (--max_restart)
//   fleet_training_<figure>                      the figures its log lines print
//                                                (loss, auc, eval_auc, tokens_per_second, ...;
//                                                PrometheusFigureName)
// Per parameter server (label rank; command: "pull_sparse", ...; table: its id),
// from its reports under stats/server/<rank> (ps/server.h StatsReply):
//   fleet_server_requests_total{command}
//   fleet_server_received_bytes_total{command}, fleet_server_sent_bytes_total{command}
//   fleet_server_request_handling_seconds_total{command}   (÷ requests = mean latency)
//   fleet_server_rejected_requests_total
//   fleet_server_table_rows{table}, fleet_server_table_bytes{table}
//   fleet_server_resident_memory_bytes
// Counters count over the job: a restarted process's counts add to its
// earlier life's.
//
// Thread-safe: the launcher updates it while the store's thread serves Text().
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "comm/progress_report.h"
#include "comm/status.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
}  // namespace prometheus

namespace fleet::pb {
class PsStatsReply;
}  // namespace fleet::pb

namespace fleet::launch {

// The gauge name of a training figure: "fleet_training_<figure>", with an
// abbreviated unit spelled out as Prometheus's conventions want
// ("samples_per_sec" -> "fleet_training_samples_per_second").
std::string PrometheusFigureName(const std::string& figure);

class JobMetrics {
 public:
  // `job_id` goes into every JSON line; `jsonl_path`: where they go
  // (created or appended); empty for none.
  JobMetrics(std::string job_id, const std::string& jsonl_path);
  ~JobMetrics();
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // A progress report of a process; a report already seen (same unix_ms) is
  // ignored. Appends a JSON line for a new one. Returns whether it was new.
  bool Progress(const std::string& role, int rank, const ProgressValue& value);
  void Started(const std::string& role, int rank);
  void Restarted(const std::string& role, int rank);
  void Exited(const std::string& role, int rank, int exit_code);
  // A parameter server's report (ps/server.h StatsReply).
  void ServerStats(int rank, const pb::PsStatsReply& stats);

  // The sum of the last reported throughputs of every process of `role`;
  // nullopt when none of them reported.
  std::optional<double> Throughput(const std::string& role) const;

  // The Prometheus text exposition of every metric.
  std::string Text() const;

 private:
  using Labels = std::map<std::string, std::string>;
  prometheus::Gauge& Gauge(prometheus::Family<prometheus::Gauge>* family, const std::string& role,
                           int rank);
  // Sets counter `family{labels}` to `value`, a running total of a process
  // that starts from 0 when it is restarted (mu_ held).
  void SetTotal(prometheus::Family<prometheus::Counter>* family, const Labels& labels,
                double value);
  void WriteLine(const std::string& line);

  const std::string job_id_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* steps_;
  prometheus::Family<prometheus::Gauge>* total_;
  prometheus::Family<prometheus::Gauge>* throughput_;
  prometheus::Family<prometheus::Gauge>* heartbeat_;
  prometheus::Family<prometheus::Gauge>* up_;
  prometheus::Family<prometheus::Gauge>* exit_code_;
  prometheus::Family<prometheus::Counter>* restarts_;
  prometheus::Family<prometheus::Counter>* server_requests_;
  prometheus::Family<prometheus::Counter>* server_bytes_in_;
  prometheus::Family<prometheus::Counter>* server_bytes_out_;
  prometheus::Family<prometheus::Counter>* server_handling_;
  prometheus::Family<prometheus::Counter>* server_rejected_;
  prometheus::Family<prometheus::Gauge>* server_rows_;
  prometheus::Family<prometheus::Gauge>* server_table_bytes_;
  prometheus::Family<prometheus::Gauge>* server_resident_;

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, ProgressValue> last_;  // guarded by mu_
  // fleet_training_<figure>, made on first sight; guarded by mu_.
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> figures_;
  // The last value a counter was set from, per (family, labels); guarded by mu_.
  std::map<std::pair<const void*, Labels>, double> last_totals_;
  std::FILE* jsonl_ = nullptr;  // guarded by mu_
};

}  // namespace fleet::launch
