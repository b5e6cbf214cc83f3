// ProgressReporter: what a training process says about its progress while
// it runs, so no rank is silent and fleetrun can serve it as metrics.
// Every `interval` it
//   * logs one line: "<name>: step S/T (epoch E: s/n), X steps/s, Y samples/s,
//     eta epoch 1m05s, job 12m40s";
//   * with a KV store, sets progress/<role>/<rank> to a ProgressValue, which
//     fleetrun reads for its /metrics and metrics.jsonl (launch/metrics.h).
// The first call only starts the clock.
//
// Thread-compatible: one training thread calls Step. The store write blocks
// for one HTTP request (bounded by the client's request timeout); a failed
// write is logged and training goes on.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/endpoint.h"
#include "comm/job_auth.h"
#include "comm/status.h"

namespace fleet {

class KvStoreClient;

// One process's progress as it travels through the store: "step total
// samples_per_s unix_ms [name=value ...]" (space-separated), the names
// those of its training figures (ProgressReporter::Figure).
struct ProgressValue {
  int64_t step = 0;
  int64_t total_steps = 0;
  double samples_per_s = 0;
  int64_t unix_ms = 0;  // when it was reported (the heartbeat)
  // Its latest figures ("loss", "auc", "eval_auc", "tokens_per_sec", ...),
  // by name; empty for a process that prints none.
  std::vector<std::pair<std::string, double>> figures;
};
std::string FormatProgressValue(const ProgressValue& value);
// InvalidArgument naming the text when it is not four numbers followed by
// name=value pairs (names of [a-z0-9_], values numbers).
Result<ProgressValue> ParseProgressValue(const std::string& text);

// The figure name of a training curve's tag, as TensorBoard files name it:
// "train/loss" -> "loss", "eval/auc" -> "eval_auc", other '/' -> '_';
// characters outside [a-z0-9_] are dropped.
std::string FigureName(std::string_view tag);

// The store key of a process's progress: "progress/<role>/<rank>".
std::string ProgressKey(const std::string& role, int rank);

// "45s", "1m05s", "2h03m".
std::string FormatDuration(double seconds);

// --progress_every_s (every program that trains has it; default 10, 0 = off).
std::chrono::milliseconds ProgressIntervalFromFlag();

struct ProgressReporterOptions {
  std::string name;             // how log lines start: "worker 1", "mnist_mlp rank 0"
  std::string role = "worker";  // of the store key
  int rank = 0;
  int64_t total_steps = 0;  // of the job
  int64_t steps_per_epoch = 0;
  int64_t samples_per_step = 0;  // this process's
  int epoch_base = 0;            // the first epoch's number in the line (ps_worker counts from 1)
  std::chrono::milliseconds interval{std::chrono::seconds(10)};  // 0: Step does nothing
  // The KV store (none: log lines only), its job scope and credentials.
  std::optional<Endpoint> kv_endpoint;
  std::string job_id = "default";
  std::shared_ptr<const JobAuth> kv_auth;
  // Where the lines go; default glog INFO.
  std::function<void(const std::string&)> log;
};

struct ClusterSpec;
// Options for the process `spec` describes: its role, rank, KV store, job and
// credentials, --progress_every_s, and the given sizes.
ProgressReporterOptions ProgressOptionsFor(const ClusterSpec& spec, std::string name,
                                           int64_t total_steps, int64_t steps_per_epoch,
                                           int64_t samples_per_step);

class ProgressReporter {
 public:
  explicit ProgressReporter(ProgressReporterOptions options);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // After a step: `steps_done` is the number of steps of the job done.
  void Step(int64_t steps_done);
  // A training figure as the process's log lines print it (the loss, the
  // AUC, tokens/s: a curve `tag` of TensorBoard's, "train/loss"), sent to
  // the store with the progress at once, or at the next Step once
  // kFigureEvery passed since the last sending (so fleetrun's curves get a
  // point per figure line, at most one a second).
  void Figure(std::string_view tag, double value);
  // The last report, after the last step: the throughput over the whole
  // run (a job shorter than `interval` has no other report). Idempotent.
  void Finish(int64_t steps_done);

  // Between two sendings of figures.
  static constexpr std::chrono::milliseconds kFigureEvery{1000};

 private:
  using Clock = std::chrono::steady_clock;
  // Writes the progress value (best effort; a failure is logged).
  void Send(int64_t steps_done, double samples_per_s);

  const ProgressReporterOptions options_;
  std::unique_ptr<KvStoreClient> kv_;  // null without a store
  bool started_ = false;
  bool finished_ = false;
  Clock::time_point first_;
  int64_t first_step_ = 0;
  Clock::time_point last_;
  int64_t last_step_ = 0;
  double last_samples_per_s_ = 0;
  // Figures by name, and whether some arrived since the last sending.
  std::vector<std::pair<std::string, double>> figures_;
  bool figures_pending_ = false;
  Clock::time_point last_sent_{};
};

}  // namespace fleet
