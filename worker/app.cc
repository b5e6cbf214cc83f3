#include "worker/app.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "comm/cluster.h"
#include "comm/collective.h"
#include "comm/file_io.h"
#include "comm/file_system.h"
#include "comm/job_liveness.h"
#include "comm/kv_store.h"
#include "comm/process_context.h"
#include "comm/program_help.h"
#include "comm/progress_report.h"
#include "data/ctr_generator.h"
#include "data/tensorboard/event_writer.h"
#include "ps/client.h"
#include "ps/job_config.h"
#include "ps/ps_process.h"
#include "trainer/kernels/cpu_kernels.h"
#include "worker/communicator.h"
#include "worker/config.h"
#include "worker/task.h"

DEFINE_string(tensorboard_dir, "",
              "Worker 0 writes TensorBoard event files here (loss, AUC or accuracy, samples/s, "
              "held-out metrics). Default: <log_dir>/tb under fleetrun; none otherwise.");

namespace fleet::worker {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// This worker's progress lines and its reports to fleetrun's /metrics.
ProgressReporterOptions WorkerProgress(const PsWorkerOptions& o, const std::string& name,
                                       int64_t steps_per_epoch, int64_t total_steps,
                                       int64_t batch_size) {
  ProgressReporterOptions p;
  p.name = name;
  p.role = "worker";
  p.rank = o.rank;
  p.total_steps = total_steps;
  p.steps_per_epoch = steps_per_epoch;
  p.samples_per_step = batch_size;
  p.epoch_base = 1;  // as its "epoch E step S/N" lines
  p.interval = ProgressIntervalFromFlag();
  if (Result<Endpoint> kv = ParseEndpoint(o.kv_endpoint); !o.kv_endpoint.empty() && kv.ok()) {
    p.kv_endpoint = *kv;
  }
  p.job_id = o.job_id;
  p.kv_auth = o.kv_auth;
  return p;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The metrics group: each worker's vector combined (sum or max, in rank
// order) with every other worker's through the KV store, or nothing for a
// world of one. Not Gloo: a Gloo group is fixed once formed, and a worker
// restarted by fleetrun --max_restart must take its old place in the next
// reduction while the others keep theirs (CONTRIBUTING.md, Recovery).
// Round `name` (the same on every worker, never reused) is the KV key prefix
// ps_worker_metrics/<name>/: each worker sets <rank> and reads every rank's
// key. Once a worker has read all keys of a round, every worker has read
// the round before it (each set its key only after that), so it deletes its
// own key of the previous round; rounds `kept` are never deleted (a
// restarted worker reads them again).
class MetricsGroup {
 public:
  static Result<MetricsGroup> Join(const PsWorkerOptions& o) {
    MetricsGroup g;
    if (o.num_workers > 1 && o.kv_endpoint.empty()) {
      return Status::InvalidArgument(
          "a job of " + std::to_string(o.num_workers) +
              " workers needs the KV store (--kv_endpoint / FLEET_KV_ENDPOINT) to aggregate "
              "metrics; fleetrun sets it",
          "worker " + std::to_string(o.rank));
    }
    if (o.kv_endpoint.empty()) return g;
    g.kv_ = std::make_unique<KvStoreClient>(o.kv_endpoint, o.job_id,
                                            KvStoreClientOptions{.auth = o.kv_auth});
    g.rank_ = o.rank;
    g.size_ = o.num_workers;
    g.timeout_ = o.job.distributed.timeout;
    g.stop_ = o.stop;
    return g;
  }

  // Blocks until every worker set its vector for `round` (at most
  // Distributed.timeout_ms: Timeout naming the worker that did not; a stop
  // request ends the wait within kStopPoll: Unavailable) and replaces *v by
  // the combination. InvalidArgument when a worker's vector has another
  // length. Only kSum and kMax.
  Status AllReduce(const std::string& round, std::vector<float>* v, ReduceOp op, const char* what,
                   bool kept = false) {
    if (size_ == 1 || v->empty()) return Status::OK();
    CHECK(op == ReduceOp::kSum || op == ReduceOp::kMax);
    const std::string prefix = std::string(kPrefix) + round + "/";
    std::string mine;
    for (float x : *v) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%a ", x);  // hex float: exact
      mine += buf;
    }
    FLEET_RETURN_IF_ERROR(kv_->Set(prefix + std::to_string(rank_), mine).WithContext(what));
    std::vector<float> out(v->size(), 0.0f);
    const auto deadline = Clock::now() + timeout_;
    for (int r = 0; r < size_; ++r) {
      Result<std::string> got =
          r == rank_ ? Result<std::string>(mine) : WaitFor(r, prefix, deadline);
      if (!got.ok()) {
        if (!got.status().IsTimeout()) return got.status().WithContext(what);
        return Status::Timeout("worker " + std::to_string(r) + " did not send its " + what +
                                   " within Distributed.timeout_ms (" +
                                   std::to_string(timeout_.count()) + " ms)",
                               "metrics round " + round);
      }
      std::istringstream in(*got);
      std::vector<float> theirs;
      for (std::string tok; in >> tok;) theirs.push_back(std::strtof(tok.c_str(), nullptr));
      for (size_t i = 0; i < out.size() && i < theirs.size(); ++i) {
        out[i] = r == 0                 ? theirs[i]
                 : op == ReduceOp::kSum ? out[i] + theirs[i]
                                        : std::max(out[i], theirs[i]);
      }
      if (theirs.size() != out.size()) {
        return Status::InvalidArgument("worker " + std::to_string(r) + " sent " + what +
                                           " of another length than the " +
                                           std::to_string(out.size()) + " values of this worker",
                                       "metrics round " + round);
      }
    }
    *v = std::move(out);
    if (!previous_.empty()) (void)kv_->Delete(previous_);  // a leftover key only costs memory
    previous_ = kept ? std::string() : prefix + std::to_string(rank_);
    return Status::OK();
  }

  // Marks this worker as past the start barrier, for a restarted life of it
  // (Started). A no-op without the KV store.
  Status MarkStarted() {
    return kv_ ? kv_->Set(StartedKey(), "1").WithContext("marking the start") : Status::OK();
  }
  // Whether an earlier life of this worker passed the start barrier (false
  // without the KV store).
  Result<bool> Started() {
    if (!kv_) return false;
    Result<std::string> got = kv_->Get(StartedKey());
    if (got.ok()) return true;
    if (got.status().IsNotFound()) return false;
    return got.status().WithContext("reading the start mark");
  }
  // The rounds this worker's keys are still held for (the newest one or
  // two it reduced in; its earlier life's after a restart), e.g. "e1/s50/train".
  Result<std::vector<std::string>> OwnRounds() {
    std::vector<std::string> rounds;
    if (!kv_) return rounds;
    FLEET_ASSIGN_OR_RETURN(std::vector<std::string> keys, kv_->List(std::string(kPrefix)));
    const std::string suffix = "/" + std::to_string(rank_);
    for (const std::string& k : keys) {
      if (k.size() > kPrefix.size() + suffix.size() && k.ends_with(suffix)) {
        rounds.push_back(k.substr(kPrefix.size(), k.size() - kPrefix.size() - suffix.size()));
      }
    }
    return rounds;
  }

 private:
  static constexpr std::string_view kPrefix = "ps_worker_metrics/";
  // How often a wait looks at the stop flag.
  static constexpr std::chrono::milliseconds kStopPoll{250};

  // Worker r's value of the round under `prefix`, waited for until
  // `deadline` (Timeout) or a stop request (Unavailable).
  Result<std::string> WaitFor(int r, const std::string& prefix, Clock::time_point deadline) {
    while (true) {
      const auto left =
          std::max(std::chrono::milliseconds(1),
                   std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      Result<std::string> got = kv_->WaitGet(prefix + std::to_string(r), std::min(left, kStopPoll));
      if (got.ok() || !got.status().IsTimeout() || Clock::now() >= deadline) return got;
      if (stop_ != nullptr && stop_->load()) {
        return Status::Unavailable("stopped on request while waiting for worker " +
                                   std::to_string(r));
      }
    }
  }

  std::unique_ptr<KvStoreClient> kv_;  // null: no KV store (a world of one)
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_{0};
  const std::atomic<bool>* stop_ = nullptr;  // not owned; null: never stopped
  std::string previous_;  // this worker's key of the previous round not kept

  std::string StartedKey() const { return "ps_worker_started/" + std::to_string(rank_); }
};

std::string FormatMetric(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", v);
  return buf;
}

// Refuses tables the model does not use: a sync step would wait forever for
// pushes to them.
Status CheckTables(const WorkerConfig& config, const ps::JobConfig& job, const WorkerTask& task) {
  std::set<uint32_t> used = {config.model.dense_table};
  if (std::optional<uint32_t> sparse = task.sparse_table()) used.insert(*sparse);
  for (size_t i = 0; i < job.tables.size(); ++i) {
    if (!used.contains(job.tables[i].id)) {
      return Status::InvalidArgument(
          "table id " + std::to_string(job.tables[i].id) +
              " is not used by the model (model.sparse_table / model.dense_table); remove it",
          "tables." + std::to_string(i));
    }
  }
  for (size_t i = 0; i < job.tables.size(); ++i) {
    const ps::TableConfig& t = job.tables[i];
    if (t.id != config.model.dense_table) continue;
    if (t.kind != ps::TableKind::kDense) {
      return Status::InvalidArgument("model.dense_table must name a dense table",
                                     "tables." + std::to_string(i));
    }
    if (t.dim != task.dense_param_count()) {
      return Status::InvalidArgument(
          "dense table " + std::to_string(t.id) + " has dim " + std::to_string(t.dim) +
              " but the model has " + std::to_string(task.dense_param_count()) +
              " dense parameters: set tables." + std::to_string(i) +
              ".dim: " + std::to_string(task.dense_param_count()),
          "tables." + std::to_string(i) + ".dim");
    }
    return Status::OK();
  }
  return Status::InvalidArgument("no dense table with the id of model.dense_table",
                                 std::to_string(config.model.dense_table));
}

// A worker told to stop (SIGTERM, Ctrl-C) ends after its current step; one
// whose step waits on a peer that never answers (a frozen server or heter
// worker) would hold the process until the request's deadline, past
// fleetrun's grace. So once `stop` has been set for kStopGrace, `abort`
// fails the calls to the peers and the step ends with their error.
class StopWatch {
 public:
  static constexpr std::chrono::milliseconds kStopGrace{1000};

  StopWatch(const std::atomic<bool>* stop, std::function<void()> abort)
      : stop_(stop), abort_(std::move(abort)) {
    if (stop_ != nullptr) thread_ = std::thread([this] { Watch(); });
  }
  ~StopWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  StopWatch(const StopWatch&) = delete;
  StopWatch& operator=(const StopWatch&) = delete;

 private:
  void Watch() {
    std::optional<Clock::time_point> seen;
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      // The stop flag is set from a signal-watching thread: polled.
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      if (done_) return;
      if (!seen && stop_->load()) seen = Clock::now();
      if (seen && Clock::now() - *seen >= kStopGrace) {
        LOG(WARNING) << "asked to stop " << kStopGrace.count()
                     << " ms ago and still waiting on a peer: failing the calls in flight";
        abort_();
        return;
      }
    }
  }

  const std::atomic<bool>* const stop_;
  const std::function<void()> abort_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::thread thread_;
};

class WorkerRun {
 public:
  WorkerRun(const PsWorkerOptions& o, WorkerConfig config)
      : o_(o), config_(std::move(config)), name_("worker " + std::to_string(o.rank)) {}

  Result<PsWorkerReport> Run();

 private:
  bool StopRequested() const { return o_.stop != nullptr && o_.stop->load(); }
  // Connects to the heter workers and hands the task's dense part to them.
  Status UseHeterWorkers();
  // Finishes the steps in flight to heter workers (Task::Drain).
  Status Drain(int epoch) {
    return task_->Drain(*comm_).WithContext("finishing the steps in flight at the end of epoch " +
                                            std::to_string(epoch));
  }
  Status Evaluate(int epoch);
  Status MaybeSave(int epoch);
  // A restarted worker whose earlier life passed the start barrier: the
  // step to resume at. Sync: the lowest next step over every server and
  // sync table; async/geo: the step of its newest progress line.
  // FailedPrecondition where a rejoin is not supported (heter workers, an
  // epoch's end).
  Result<int64_t> ResumeStep(int64_t steps_per_epoch);
  // The metrics round that follows step index i of `epoch` (every
  // train.log_interval steps and the epoch's last), nullopt when none does.
  std::optional<std::string> TrainRound(int epoch, int64_t i, int64_t steps_per_epoch) const {
    const bool window = config_.train.log_interval > 0 && (i + 1) % config_.train.log_interval == 0;
    if (!window && i + 1 != steps_per_epoch) return std::nullopt;
    return "e" + std::to_string(epoch) + "/s" + std::to_string(i + 1) + "/train";
  }
  // A sync worker rejoining at step `resume`: its earlier life may have died
  // after the servers applied step resume - 1 but before it sent its part
  // of the metrics round after that step, where the others now wait for it
  // while it would wait for their push of step `resume` (a deadlock until
  // Distributed.timeout_ms). It sends zeros for that round (the window's
  // metrics lose its share; no update is lost).
  Status JoinMissedRound(int64_t resume, int64_t steps_per_epoch);
  // InvalidArgument when no worker has a training batch: names the data spec
  // and what this worker found in it (files, samples, malformed lines).
  Status NoTrainingData() const;

  const PsWorkerOptions& o_;
  const WorkerConfig config_;
  const std::string name_;
  std::unique_ptr<WorkerTask> task_;
  std::unique_ptr<ps::PsClient> client_;
  std::unique_ptr<heter::HeterClient> heter_;  // with heter workers only
  // heter_ for the StopWatch's thread (set once heter_ exists).
  std::atomic<heter::HeterClient*> heter_to_abort_{nullptr};
  std::unique_ptr<Communicator> comm_;
  MetricsGroup group_;
  PsWorkerReport report_;
  std::unique_ptr<tensorboard::EventWriter> events_;  // worker 0 with a tensorboard_dir
  std::unique_ptr<ProgressReporter> progress_;        // once training starts
  // Writes `values` (tag, value) at `step` into events_ (a failed write logs
  // a warning and stops the curves, not the training) and, as figures, into
  // the progress reports for fleetrun's job page and metrics.
  void Curves(int64_t step, std::initializer_list<std::pair<std::string, double>> values);
};

void WorkerRun::Curves(int64_t step, std::initializer_list<std::pair<std::string, double>> values) {
  for (const auto& [tag, value] : values) {
    if (progress_ != nullptr) progress_->Figure(tag, value);
    if (events_ == nullptr) continue;
    if (Status st = events_->Scalar(tag, step, value); !st.ok()) {
      LOG(WARNING) << "TensorBoard curves stopped: " << st.ToString();
      events_.reset();
    }
  }
}

Result<PsWorkerReport> WorkerRun::Run() {
  trainer::kernels::SetBlasThreads(config_.train.blas_threads);
  if (o_.rank == 0 && !o_.tensorboard_dir.empty()) {
    FLEET_ASSIGN_OR_RETURN(events_, tensorboard::EventWriter::Create(o_.tensorboard_dir));
  }
  report_.oracle_auc = kNaN;
  report_.heldout_metric = kNaN;
  if (!config_.data.oracle.empty()) {
    FLEET_ASSIGN_OR_RETURN(data::OracleInfo oracle, data::ReadOracleFile(config_.data.oracle));
    report_.oracle_auc = oracle.oracle_auc;
  }

  // 1. Data and model.
  const auto t_load = Clock::now();
  LOG(INFO) << name_ << ": loading its shard of the data (" << o_.rank + 1 << " of "
            << o_.num_workers << ")";
  WorkerTaskOptions task_options{.rank = o_.rank, .world_size = o_.num_workers};
  task_options.load_progress_every = ProgressIntervalFromFlag();
  task_options.load_progress = [this](const std::string& line) {
    LOG(INFO) << name_ << ": " << line;
  };
  FLEET_ASSIGN_OR_RETURN(task_, CreateWorkerTask(config_, o_.job, task_options));
  report_.metric_name = task_->metric_name();
  FLEET_RETURN_IF_ERROR(CheckTables(config_, o_.job, *task_));
  if (o_.rank == 0 && !config_.train.save_dir.empty()) {
    // Before training, not when the first save fails after it.
    // A config value to change: InvalidArgument, so ps_worker exits 2 as the
    // servers do for server.save_dir.
    if (Status st = CheckWritableDir(DefaultFileSystem(), config_.train.save_dir); !st.ok()) {
      return Status::InvalidArgument(st.message()).WithContext("train.save_dir");
    }
  }
  LOG(INFO) << name_ << ": " << task_->num_train_batches() << " local batches of "
            << config_.train.batch_size << ", " << task_->dense_param_count()
            << " dense parameters, loaded in " << FormatMetric(Seconds(t_load)) << " s";

  ps::PsClientOptions co;
  co.servers = o_.servers;
  co.worker_rank = o_.rank;
  co.num_workers = o_.num_workers;
  co.auth = o_.auth;
  FLEET_ASSIGN_OR_RETURN(client_, ps::PsClient::Create(co, o_.job));
  // Destroyed (joined) before the clients, on every way out of Run().
  StopWatch stop_watch(o_.stop, [this] {
    client_->Abort();
    if (heter::HeterClient* heter = heter_to_abort_.load()) heter->Abort();
  });

  // 2. Metrics group; steps per epoch = the largest shard's batch count.
  FLEET_ASSIGN_OR_RETURN(group_, MetricsGroup::Join(o_));
  std::vector<float> batches = {static_cast<float>(task_->num_train_batches())};
  FLEET_RETURN_IF_ERROR(
      group_.AllReduce("steps_per_epoch", &batches, ReduceOp::kMax, "batch count", /*kept=*/true));
  const int64_t steps_per_epoch = static_cast<int64_t>(batches[0]);
  if (steps_per_epoch == 0) return NoTrainingData();

  // 2b. A restarted worker whose earlier life got past the start barrier
  // rejoins the others where that life left off; one that did not starts
  // like them (the others are still at the barrier).
  bool rejoin = false;
  int64_t resume = 0;
  if (o_.restart_generation > 0) {
    FLEET_ASSIGN_OR_RETURN(rejoin, group_.Started());
    if (rejoin) {
      FLEET_ASSIGN_OR_RETURN(resume, ResumeStep(steps_per_epoch));
    }
  }

  // 3. One initialisation for everyone (a rejoining worker finds it done).
  if (!rejoin) {
    if (o_.rank == 0 && o_.job.server.load_dir.empty()) {
      std::vector<float> init = task_->InitialDenseParams();
      FLEET_RETURN_IF_ERROR(client_->InitDense(config_.model.dense_table, init)
                                .WithContext("writing the initial dense parameters"));
    }
    FLEET_RETURN_IF_ERROR(client_->Barrier("ps_worker_init").WithContext("start barrier"));
    FLEET_RETURN_IF_ERROR(group_.MarkStarted());
  }
  if (o_.started != nullptr) o_.started->store(true);

  // 3b. Heter workers run the dense part.
  if (!o_.heter_workers.empty()) FLEET_RETURN_IF_ERROR(UseHeterWorkers());

  CommunicatorOptions copts;
  copts.sparse_table = task_->sparse_table();
  // With heter workers they train the dense table.
  if (heter_ == nullptr) copts.dense_table = config_.model.dense_table;
  copts.num_workers = o_.num_workers;
  copts.batch_size = config_.train.batch_size;
  copts.max_merge = o_.job.distributed.max_merge;
  copts.k_steps = o_.job.distributed.k_steps;
  FLEET_ASSIGN_OR_RETURN(comm_, CreateCommunicator(client_.get(), copts));
  Communicator* comm = comm_.get();
  LOG(INFO) << name_ << ": " << comm->name() << " mode, " << steps_per_epoch
            << " steps per epoch, " << config_.train.epochs << " epochs";
  if (rejoin) {
    std::ostringstream line;
    line << name_ << ": rejoined at step " << resume << " (skipped " << resume << " batches: epoch "
         << resume / steps_per_epoch + 1 << " from step " << resume % steps_per_epoch
         << "); lost 0 updates";
    if (o_.job.distributed.mode == ps::SyncMode::kSync) {
      FLEET_RETURN_IF_ERROR(comm->ResumeAt(resume).WithContext(name_ + " rejoining"));
      FLEET_RETURN_IF_ERROR(JoinMissedRound(resume, steps_per_epoch));
      // The step it was in when killed was not acknowledged to it (the
      // servers have not applied it everywhere), so it is pushed again.
      line << " (step " << resume << ", the one it was in when killed, is pushed again, applied "
           << "once)";
    } else {
      // Its steps after its last progress line are taken again: what it had
      // sent of them is applied twice, what it had queued is sent now.
      line << " (its steps after step " << resume << " before the kill, at most "
           << std::max(config_.train.log_interval - 1, 0)
           << ", are taken again: those it had sent are applied twice)";
    }
    LOG(INFO) << line.str();
  }

  // 4. Training.
  progress_ = std::make_unique<ProgressReporter>(
      WorkerProgress(o_, name_, steps_per_epoch, steps_per_epoch * config_.train.epochs,
                     config_.train.batch_size));
  double train_seconds = 0;
  double train_samples = 0;
  for (int epoch = 1 + static_cast<int>(resume / steps_per_epoch);
       epoch <= config_.train.epochs && !report_.stopped; ++epoch) {
    const auto t_epoch = Clock::now();
    auto t_window = Clock::now();
    const int64_t first = epoch == 1 + resume / steps_per_epoch ? resume % steps_per_epoch : 0;
    for (int64_t i = first; i < steps_per_epoch; ++i) {
      if (StopRequested()) {
        report_.stopped = true;
        break;
      }
      const std::string where =
          name_ + " epoch " + std::to_string(epoch) + " step " + std::to_string(i);
      if (i < task_->num_train_batches()) {
        FLEET_RETURN_IF_ERROR(task_->TrainStep(i, *comm).WithContext(where));
      } else {
        // This shard is done; keep the step count every worker shares.
        FLEET_RETURN_IF_ERROR(task_->SkipStep(*comm).WithContext(where));
      }
      // A diverged model must fail the job, not be trained on and saved.
      if (const double loss = task_->train_loss_sum(); !std::isfinite(loss)) {
        return Status::FailedPrecondition(
            "training loss is " + std::string(std::isnan(loss) ? "NaN" : "Inf") +
                " (diverged: lower the learning rate, or check the data); stopping before "
                "pushing more or saving the model",
            where);
      }
      ++report_.steps;
      const int64_t global_step = (epoch - 1) * steps_per_epoch + i;
      progress_->Step((epoch - 1) * steps_per_epoch + i + 1);
      const bool last = i + 1 == steps_per_epoch;
      // Steps still in flight to heter workers belong to this epoch's last line.
      if (last) FLEET_RETURN_IF_ERROR(Drain(epoch));
      if (o_.die_after_push_for_test && o_.die_after_push_for_test(global_step)) {
        return Status::Internal("killed by the test after pushing step " +
                                std::to_string(global_step));
      }
      if (std::optional<std::string> round = TrainRound(epoch, i, steps_per_epoch)) {
        std::vector<float> sums = task_->TakeTrainSums();
        FLEET_RETURN_IF_ERROR(
            group_.AllReduce(*round, &sums, ReduceOp::kSum, "training metrics"));
        const MetricSummary m = task_->Summarize(sums);
        const double secs = Seconds(t_window);
        train_samples += m.samples;
        report_.train_losses.push_back(m.loss);
        LOG(INFO) << "epoch " << epoch << " step " << (i + 1) << "/" << steps_per_epoch
                  << " loss " << FormatMetric(m.loss) << " " << task_->metric_name() << " "
                  << FormatMetric(m.metric) << " samples/s "
                  << static_cast<int64_t>(secs > 0 ? m.samples / secs : 0);
        Curves(global_step + 1, {{"train/loss", m.loss},
                                 {std::string("train/") + task_->metric_name(), m.metric},
                                 {"train/samples_per_sec", secs > 0 ? m.samples / secs : 0.0}});
        t_window = Clock::now();
      }
    }
    FLEET_RETURN_IF_ERROR(Drain(epoch));  // after a stop; else a no-op
    FLEET_RETURN_IF_ERROR(comm->Flush().WithContext("flush at the end of epoch " +
                                                    std::to_string(epoch)));
    train_seconds += Seconds(t_epoch);
    if (report_.stopped) break;
    FLEET_RETURN_IF_ERROR(client_->Barrier("ps_worker_epoch_" + std::to_string(epoch))
                              .WithContext("end-of-epoch barrier"));
    FLEET_RETURN_IF_ERROR(Evaluate(epoch));
    FLEET_RETURN_IF_ERROR(MaybeSave(epoch));
  }
  if (config_.train.epochs == 0) FLEET_RETURN_IF_ERROR(Evaluate(0));
  if (report_.stopped) {
    LOG(WARNING) << name_ << ": stop requested; gradients flushed, leaving after "
                 << report_.steps << " steps";
    return report_;
  }

  // 5. Summary.
  progress_->Finish(steps_per_epoch * config_.train.epochs);
  if (heter_ != nullptr && train_seconds > 0) {
    report_.heter_idle_fraction = heter_->blocked_seconds() / train_seconds;
    report_.heter_resends = heter_->resends();
  }
  std::vector<float> totals = {static_cast<float>(task_->malformed_lines()),
                               static_cast<float>(train_seconds)};
  FLEET_RETURN_IF_ERROR(group_.AllReduce("summary", &totals, ReduceOp::kSum, "summary"));
  report_.malformed_lines = static_cast<int64_t>(totals[0]);
  const double mean_seconds = totals[1] / o_.num_workers;
  report_.train_samples_per_sec = mean_seconds > 0 ? train_samples / mean_seconds : 0;
  std::ostringstream line;
  line << "summary: held-out " << report_.metric_name << " " << FormatMetric(report_.heldout_metric);
  if (!std::isnan(report_.oracle_auc)) {
    line << " (oracle " << FormatMetric(report_.oracle_auc) << ", gap "
         << FormatMetric(report_.oracle_auc - report_.heldout_metric) << ")";
  }
  line << ", " << static_cast<int64_t>(report_.train_samples_per_sec)
       << " train samples/s over " << o_.num_workers << " workers, "
       << report_.malformed_lines << " malformed lines skipped";
  if (heter_ != nullptr) {
    char idle[16];
    std::snprintf(idle, sizeof(idle), "%.1f", 100 * report_.heter_idle_fraction);
    line << "; waited for the heter workers " << idle << "% of the training time, "
         << report_.heter_resends << " micro-batches resent";
  }
  LOG(INFO) << line.str();
  return report_;
}

Status WorkerRun::JoinMissedRound(int64_t resume, int64_t steps_per_epoch) {
  if (resume == 0) return Status::OK();
  const int64_t i = (resume - 1) % steps_per_epoch;
  const int epoch = static_cast<int>((resume - 1) / steps_per_epoch) + 1;
  const std::optional<std::string> round = TrainRound(epoch, i, steps_per_epoch);
  if (!round) return Status::OK();
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> rounds, group_.OwnRounds());
  if (std::find(rounds.begin(), rounds.end(), *round) != rounds.end()) return Status::OK();
  std::vector<float> zeros = task_->TakeTrainSums();  // nothing trained yet: zeros
  std::fill(zeros.begin(), zeros.end(), 0.0f);
  LOG(INFO) << name_ << ": sending zeros for metrics round " << *round
            << ", which its earlier life left after pushing step " << resume - 1;
  return group_.AllReduce(*round, &zeros, ReduceOp::kSum, "training metrics (rejoining)");
}

Status WorkerRun::NoTrainingData() const {
  const bool ctr = !config_.data.train.empty();
  const std::string key = ctr ? "data.train" : "data.train_images";
  const std::string& spec = ctr ? config_.data.train : config_.data.train_images;
  std::string files = "?";
  if (auto list = data::ExpandFileSpec(spec); list.ok()) files = std::to_string(list->size());
  return Status::InvalidArgument(
      "no training data: no worker of " + std::to_string(o_.num_workers) +
          " got a batch; this worker found " + files + " files, 0 usable samples and " +
          std::to_string(task_->malformed_lines()) + " malformed lines in '" + spec + "'",
      key);
}

Result<int64_t> WorkerRun::ResumeStep(int64_t steps_per_epoch) {
  const std::string which =
      name_ + " restarted (generation " + std::to_string(o_.restart_generation) + ")";
  if (!o_.heter_workers.empty()) {
    return Status::FailedPrecondition(
        "a worker with heter workers cannot rejoin a running job (its micro-batch slots are "
        "not resumed)",
        which);
  }
  int64_t step = 0;
  bool epoch_end = false;  // the earlier life was past an epoch's last step
  if (o_.job.distributed.mode == ps::SyncMode::kSync) {
    Result<std::vector<pb::PsStatsReply>> stats = client_->Stats();
    if (!stats.ok()) return stats.status().WithContext("asking the servers for their sync step");
    int64_t low = std::numeric_limits<int64_t>::max(), high = -1;
    for (const pb::PsStatsReply& s : *stats) {
      for (const pb::PsTableStats& t : s.tables()) {
        if (t.next_sync_step() < 0) continue;
        low = std::min(low, t.next_sync_step());
        high = std::max(high, t.next_sync_step());
      }
    }
    if (high < 0) return Status::FailedPrecondition("no server holds a sync table", which);
    LOG(INFO) << which << ": the servers are at sync step " << low
              << (high > low ? " (some at " + std::to_string(high) + ")" : std::string());
    step = low;
    epoch_end = low > 0 && low % steps_per_epoch == 0;
  } else {
    // Async and geo steps are the worker's own: it resumes after its newest
    // progress line, the last point the others know it reached.
    FLEET_ASSIGN_OR_RETURN(std::vector<std::string> rounds, group_.OwnRounds());
    const std::regex train(R"(e(\d+)/s(\d+)/train)"), heldout(R"(e(\d+)/heldout(_size)?)");
    for (const std::string& r : rounds) {
      std::smatch m;
      if (std::regex_match(r, m, train)) {
        const int64_t done = (std::stoll(m[1]) - 1) * steps_per_epoch + std::stoll(m[2]);
        if (done > step || (done == step && !epoch_end)) {
          step = done;
          epoch_end = done % steps_per_epoch == 0;
        }
      } else if (std::regex_match(r, m, heldout)) {
        const int64_t done = std::stoll(m[1]) * steps_per_epoch;
        if (done >= step) step = done, epoch_end = true;
      }
    }
  }
  if (epoch_end) {
    // Its earlier life finished the epoch's steps and died somewhere in the
    // epoch's end (barrier, evaluation, save), which the others may have
    // left already: not a point it can rejoin at.
    return Status::FailedPrecondition(
        "restarted after the last step of epoch " + std::to_string(step / steps_per_epoch) +
            " (step " + std::to_string(step) +
            "): an epoch's end (barrier, evaluation, save) cannot be rejoined",
        which);
  }
  return step;
}

Status WorkerRun::UseHeterWorkers() {
  const std::optional<heter::DenseShape> shape = task_->heter_shape();
  if (!shape) {
    return Status::InvalidArgument(
        "model " + config_.model.kind +
            " cannot run its dense part on heter workers; start the job without them",
        "model.kind");
  }
  const ps::HeterConfig& hc = o_.job.distributed.heter;
  heter::HeterClientOptions ho;
  ho.heter_workers = o_.heter_workers;
  ho.worker_rank = o_.rank;
  ho.num_workers = o_.num_workers;
  ho.shape = *shape;
  ho.timeout = o_.job.distributed.timeout;
  ho.down_timeout = hc.down_timeout;
  ho.log_dir = o_.log_dir;
  ho.van = ps::JobVanOptions(o_.job, o_.auth);
  FLEET_ASSIGN_OR_RETURN(heter_, heter::HeterClient::Create(std::move(ho)));
  heter_to_abort_.store(heter_.get());
  task_->UseHeterWorkers(heter_.get(), hc);
  LOG(INFO) << name_ << ": dense part on " << o_.heter_workers.size() << " heter workers, "
            << hc.micro_batches << " micro-batches per batch, up to " << hc.pipeline_depth
            << " in flight";
  return Status::OK();
}

Status WorkerRun::Evaluate(int epoch) {
  FLEET_ASSIGN_OR_RETURN(std::vector<float> sums, task_->EvaluateSums(*client_));
  const std::string round = "e" + std::to_string(epoch);
  // Every worker takes part in the reduce, even one with no held-out data.
  std::vector<float> size = {static_cast<float>(sums.size())};
  FLEET_RETURN_IF_ERROR(
      group_.AllReduce(round + "/heldout_size", &size, ReduceOp::kMax, "held-out metric size"));
  if (size[0] == 0) return Status::OK();
  if (sums.empty()) sums = std::vector<float>(static_cast<size_t>(size[0]), 0.0f);
  FLEET_RETURN_IF_ERROR(
      group_.AllReduce(round + "/heldout", &sums, ReduceOp::kSum, "held-out metrics"));
  const MetricSummary m = task_->Summarize(sums);
  report_.epochs.push_back({epoch, m.loss, m.metric});
  Curves(report_.steps,
         {{"eval/loss", m.loss}, {std::string("eval/") + task_->metric_name(), m.metric}});
  report_.heldout_metric = m.metric;
  std::ostringstream line;
  line << "epoch " << epoch << " held-out loss " << FormatMetric(m.loss) << " "
       << task_->metric_name() << " " << FormatMetric(m.metric) << " over "
       << static_cast<int64_t>(m.samples) << " samples";
  if (!std::isnan(report_.oracle_auc)) line << " (oracle " << FormatMetric(report_.oracle_auc) << ")";
  LOG(INFO) << line.str();
  return Status::OK();
}

Status WorkerRun::MaybeSave(int epoch) {
  const WorkerTrainConfig& t = config_.train;
  if (t.save_dir.empty()) return Status::OK();
  const bool due = epoch == t.epochs || (t.save_every_epochs > 0 && epoch % t.save_every_epochs == 0);
  if (!due) return Status::OK();
  const std::string dir = t.save_dir + "/epoch_" + std::to_string(epoch);
  if (o_.rank == 0) {
    FLEET_RETURN_IF_ERROR(client_->Save(dir, /*delta=*/false).WithContext("saving " + dir));
    LOG(INFO) << "saved checkpoint " << dir;
  }
  // Nobody pushes into the next epoch before the checkpoint is complete.
  return client_->Barrier("ps_worker_saved_" + std::to_string(epoch))
      .WithContext("checkpoint barrier");
}

}  // namespace

Result<PsWorkerReport> RunPsWorker(const PsWorkerOptions& options) {
  if (options.num_workers < 1 || options.rank < 0 || options.rank >= options.num_workers) {
    return Status::InvalidArgument("rank must be in [0, num_workers)",
                                   std::to_string(options.rank) + " of " +
                                       std::to_string(options.num_workers));
  }
  if (options.servers.empty()) {
    return Status::InvalidArgument("no parameter servers given (--servers / FLEET_SERVERS)");
  }
  FLEET_ASSIGN_OR_RETURN(WorkerConfig config, ParseWorkerConfig(options.job.root));
  WorkerRun run(options, std::move(config));
  return run.Run();
}

Status JoinAsWorker(const ProcessContext& ctx) {
  const ClusterSpec& spec = ctx.spec();
  if (spec.world_size > 1 && !spec.kv_endpoint) {
    return Status::InvalidArgument(
        absl::StrCat(spec.world_size, " workers meet through a KV store: give --kv_endpoint=ip:port ",
                     "(fleetrun hosts one; by hand, start fleetrun --store_only)"),
        absl::StrCat("worker ", spec.rank));
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return ctx.ClaimRank(absl::StrCat(host, " pid ", getpid()));
}

namespace {

ProgramHelp WorkerHelp() {
  ProgramHelp help{"ps_worker --config=job.yaml --servers=ip:port,... [--workers=ip,... --rank=N] "
                   "[flags]",
                   "One parameter-server worker: reads its shard of the data, trains, pulls and "
                   "pushes parameters (fleetrun starts it; see README.md for starting it by hand).",
                   {ps::JobConfigHelpGroup(), {"Progress",
                     {GflagsHelpFlag("progress_every_s", "S"),
                      GflagsHelpFlag("tensorboard_dir", "DIR")}}}};
  help.override_flag = "override";
  for (HelpGroup& g : ClusterHelpGroups()) help.groups.push_back(std::move(g));
  return help;
}

}  // namespace

int PsWorkerMain(int argc, char** argv) {
  if (std::optional<int> done = ParseFlagsOrHelp(WorkerHelp(), &argc, &argv, std::cout)) {
    return *done;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  ProcessContextOptions context{.program = "ps_worker", .role = Role::kWorker};
  context.watch_stop_signals = true;
  context.on_stop = [](int sig) {
    LOG(INFO) << "ps_worker: signal " << sig << ", stopping after the current step";
  };
  Result<ps::PsProcess> process = ps::StartPsProcess(std::move(context));
  Status joined = process.ok() ? JoinAsWorker(*process->context) : process.status();
  if (!joined.ok()) {
    LOG(ERROR) << "ps_worker: " << joined.ToString();
    return 2;
  }
  ProcessContext& ctx = *process->context;
  const ClusterSpec& spec = ctx.spec();
  PsWorkerOptions o;
  o.rank = spec.rank;
  o.num_workers = spec.world_size;
  o.job_id = spec.job_id;
  o.restart_generation = ctx.restart_generation();
  if (spec.kv_endpoint) o.kv_endpoint = spec.kv_endpoint->ToString();
  o.job = std::move(process->job);
  o.stop = &ctx.stop_requested();
  std::atomic<bool> started{false};
  o.started = &started;
  o.log_dir = spec.log_dir;
  o.tensorboard_dir = tensorboard::TensorBoardDir(FLAGS_tensorboard_dir, spec.log_dir, true);
  o.kv_auth = ctx.kv_auth();
  o.auth = std::move(process->transport_auth);
  auto servers = ctx.PeerEndpoints(Role::kServer, o.job.distributed.timeout);
  auto heters = servers.ok() ? ctx.PeerEndpoints(Role::kHeterWorker, o.job.distributed.timeout)
                             : servers.status();
  if (!heters.ok()) {
    LOG(ERROR) << "ps_worker: " << heters.status().ToString();
    return 2;
  }
  o.servers = std::move(servers).value();
  o.heter_workers = std::move(heters).value();
  LOG(INFO) << "ps_worker: " << spec.ToString();
  const std::string name = "ps_worker " + std::to_string(o.rank);
  Result<std::unique_ptr<JobLiveness>> liveness = WatchPeersByHand(ctx, name, spec.world_size);
  if (!liveness.ok()) {
    LOG(ERROR) << name << ": " << liveness.status().ToString();
    return 1;
  }

  auto report = RunPsWorker(o);
  if (*liveness != nullptr) {
    // A call that failed (a server's connection lost) may be the echo of a
    // peer's death the watch is about to find: its cause is the news.
    const std::optional<std::string> why =
        report.ok() || ctx.stop_requested().load()
            ? (*liveness)->failure()
            : (*liveness)->WaitForFailure(2 * JobLivenessOptions().interval);
    if (why) {
      LOG(ERROR) << name << ": stopped: " << *why;
      return 1;
    }
    if (report.ok() && !report->stopped) {
      (*liveness)->MarkDone();
    } else {
      (*liveness)->MarkFailed(name + (report.ok() ? std::string(" was stopped (a signal)")
                                                  : ": " + report.status().ToString()));
    }
  }
  if (!report.ok() && ctx.stop_requested().load()) {
    // Told to stop while a step waited on a peer (StopWatch ended it).
    LOG(WARNING) << name << ": stopped on request during a step (" << report.status().ToString()
                 << ")";
    return 1;
  }
  if (!report.ok()) {
    LOG(ERROR) << name << ": " << report.status().ToString();
    // Refused input at start-up (a config, the data) is 2, as for flags;
    // whatever fails once training runs is the job's failure.
    return report.status().IsInvalidArgument() && !started.load() ? 2 : 1;
  }
  return 0;
}

}  // namespace fleet::worker
