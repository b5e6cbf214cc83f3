#include "collective/train_loop.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "comm/file_system.h"

namespace fleet::trainer::collective {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kPositionFile[] = "data_position";

// The data layout that gives a step its samples; a checkpoint only resumes
// into a run with the same layout.
struct DataLayout {
  int64_t train_samples = 0;
  int64_t global_batch = 0;
  uint64_t shuffle_seed = 0;
  bool shuffle = true;  // false: every epoch visits the samples in order

  int64_t steps_per_epoch() const { return train_samples / global_batch; }
};

// The permutation of [0, n) that epoch `epoch` visits. Fisher-Yates over
// mt19937_64, whose output the standard fixes, so every rank and every
// build draws the same order (std::shuffle's is implementation-defined).
// Into `order`, whose memory is reused from epoch to epoch.
void EpochOrder(uint64_t seed, bool shuffle, int64_t epoch, int64_t n, std::vector<int64_t>* out) {
  std::vector<int64_t>& order = *out;
  order.resize(n);
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    // The modulo bias (< 2^-40 for n <= 2^24) does not matter for shuffling.
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
}

std::string PositionText(const DataLayout& layout, int64_t step) {
  const int64_t spe = layout.steps_per_epoch();
  // "shuffled=0" only for the unshuffled order (files without it are shuffled).
  return absl::StrCat(
      "train_samples=", layout.train_samples, "\nglobal_batch=", layout.global_batch,
      "\nshuffle_seed=", layout.shuffle_seed, layout.shuffle ? "" : "\nshuffled=0", "\nstep=", step,
      "\nepoch=", step / spe, "\nbatch_in_epoch=", step % spe, "\n");
}

// Checks that the layout recorded in `path` is `want`. NotFound / IOError
// for an unreadable file, Corruption for a malformed one,
// FailedPrecondition naming the first key that differs.
Status CheckPosition(const std::string& path, const DataLayout& want) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open the data position file", path);
  std::map<std::string, std::string> kv;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    std::pair<std::string, std::string> p = absl::StrSplit(line, absl::MaxSplits('=', 1));
    kv[p.first] = p.second;
  }
  if (in.bad()) return Status::IOError("cannot read the data position file", path);
  kv.emplace("shuffled", "1");  // absent: a shuffled order
  const std::pair<const char*, uint64_t> expected[] = {
      {"train_samples", static_cast<uint64_t>(want.train_samples)},
      {"global_batch", static_cast<uint64_t>(want.global_batch)},
      {"shuffle_seed", want.shuffle_seed},
      {"shuffled", want.shuffle ? 1u : 0u}};
  for (const auto& [key, value] : expected) {
    uint64_t got = 0;
    auto it = kv.find(key);
    if (it == kv.end() || !absl::SimpleAtoi(it->second, &got)) {
      return Status::Corruption(absl::StrCat("data position file lacks a numeric '", key, "'"),
                                path);
    }
    if (got != value) {
      return Status::FailedPrecondition(
          absl::StrCat("checkpoint was made with ", key, "=", got, " but this run has ", key, "=",
                       value, "; its data position would not match (use another checkpoint_dir "
                              "or the original settings)"),
          path);
    }
  }
  return Status::OK();
}

class Loop {
 public:
  Loop(const TrainLoopOptions& options, CollectiveTask& task, Collective* collective,
       std::ostream* progress)
      : options_(options),
        task_(task),
        collective_(collective),
        progress_(progress),
        rank_(collective ? collective->rank() : 0),
        world_(collective ? collective->size() : 1),
        scalars_(rank_ == 0 ? options.scalars : nullptr) {}

  Result<TrainReport> Run();

 private:
  Status Validate() const;
  Status Setup();
  // Rank 0 checks the data position of a checkpoint the updater will load;
  // then the updater resumes (or syncs every rank to rank 0's model).
  Status ResumeAndSync();
  Status Save(int64_t step);
  Result<float> TrainStep(int64_t step);
  Result<double> Evaluate();
  // Evaluates, prints the line and records it in the report.
  Status EvaluateAndReport(int64_t epoch, int64_t step, TrainReport* report);
  void Print(const std::string& line) {
    if (progress_ != nullptr) *progress_ << line << std::endl;
  }
  // Calls write(*scalars_) when curves are written; a failure warns once
  // and stops the writing (TensorBoard is worth no lost training).
  template <typename Fn>
  void WriteScalars(Fn&& write) {
    if (scalars_ == nullptr) return;
    Status st = write(*scalars_);
    if (!st.ok()) {
      Print("warning: TensorBoard curves stopped: " + st.ToString());
      scalars_ = nullptr;
    }
  }

  const TrainLoopOptions& options_;
  CollectiveTask& task_;
  Collective* const collective_;
  std::ostream* const progress_;
  const int rank_;
  const int world_;
  tensorboard::ScalarSink* scalars_;  // rank 0's options.scalars, null once a write failed

  DataLayout layout_;
  std::unique_ptr<GradientUpdater> updater_;
  // LoadBatch time since the last progress line.
  double reader_seconds_ = 0;

  // The order of the epoch in use, and which epoch it is.
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

Status Loop::Validate() const {
  const TrainLoopOptions& o = options_;
  if (o.epochs < 1) return Status::InvalidArgument("epochs must be >= 1", absl::StrCat(o.epochs));
  if (o.batch_size < 1) {
    return Status::InvalidArgument("batch_size must be >= 1", absl::StrCat(o.batch_size));
  }
  if (o.micro_batches < 1 || o.batch_size % o.micro_batches != 0) {
    return Status::InvalidArgument(
        "micro_batches must be >= 1 and divide batch_size",
        absl::StrCat(o.micro_batches, " micro-batches, batch_size ", o.batch_size));
  }
  if (o.max_steps < 0 || o.log_every_steps < 0 || o.checkpoint_every_steps < 0 ||
      o.eval_every_steps < 0) {
    return Status::InvalidArgument(
        "max_steps, log_every_steps, checkpoint_every_steps and eval_every_steps must be >= 0");
  }
  if (task_.num_train_samples() < static_cast<int64_t>(o.batch_size) * world_) {
    return Status::InvalidArgument(
        "too few training samples for one global batch",
        absl::StrCat(task_.num_train_samples(), " samples, global batch ",
                     static_cast<int64_t>(o.batch_size) * world_));
  }
  return Status::OK();
}

Status Loop::Setup() {
  FLEET_RETURN_IF_ERROR(Validate());
  layout_ =
      DataLayout{task_.num_train_samples(), static_cast<int64_t>(options_.batch_size) * world_,
                 options_.shuffle_seed, options_.shuffle};
  if (options_.make_updater) {
    FLEET_ASSIGN_OR_RETURN(updater_, options_.make_updater(&task_.arena(), collective_));
  } else {
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                           CreateOptimizer(options_.optimizer, &task_.arena()));
    FLEET_ASSIGN_OR_RETURN(updater_,
                           ReplicatedUpdater::Create(collective_, &task_.arena(),
                                                     std::move(optimizer), options_.data_parallel,
                                                     task_.name()));
  }
  return Status::OK();
}

Status Loop::ResumeAndSync() {
  const std::filesystem::path dir(options_.resume_dir.empty() ? options_.checkpoint_dir
                                                               : options_.resume_dir);
  Status position;
  if (rank_ == 0 && updater_->HasCheckpoint(dir)) {
    position = CheckPosition((dir / kPositionFile).string(), layout_);
  }
  // Every rank learns whether rank 0 accepted it, so none waits for a
  // checkpoint that will never be read.
  FLEET_RETURN_IF_ERROR(AgreeOnSuccess(
      *updater_, position.ok() ? position : position.WithContext("loading the checkpoint"),
      "rank 0 could not load the checkpoint (its data position)"));
  return updater_->Resume(dir);
}

Status Loop::Save(int64_t step) {
  if (options_.checkpoint_dir.empty()) return Status::OK();
  const std::filesystem::path dir(options_.checkpoint_dir);
  Status prepared;
  if (rank_ == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    // Position first: a crash before the checkpoint's rename leaves the old
    // checkpoint, which the unchanged layout still places (see the header).
    if (ec) {
      prepared =
          Status::IOError("cannot create the checkpoint directory: " + ec.message(), dir.string());
    } else if (options_.writes_data_position) {
      prepared =
          WriteFileAtomically((dir / kPositionFile).string(), PositionText(layout_, step));
    }
  }
  // The other ranks may write their own files into the directory next (one
  // process: the sum is local and this returns `prepared`).
  FLEET_RETURN_IF_ERROR(
      AgreeOnSuccess(*updater_, prepared, "preparing the checkpoint directory on rank 0"));
  return updater_->Save(dir);
}

Result<float> Loop::TrainStep(int64_t step) {
  const int64_t spe = layout_.steps_per_epoch();
  const int64_t epoch = step / spe;
  if (epoch != order_epoch_) {
    EpochOrder(layout_.shuffle_seed, layout_.shuffle, epoch, layout_.train_samples, &order_);
    order_epoch_ = epoch;
  }
  const int64_t B = options_.batch_size;
  const int k = options_.micro_batches;
  const int64_t micro = B / k;
  const int64_t first = (step % spe) * layout_.global_batch + rank_ * B;
  task_.BeginStep(step);
  // The batch's rows start arriving while the gradients are zeroed.
  task_.PrefetchBatch(std::span<const int64_t>(order_.data() + first, micro));
  // The learning rate is known before backward: an updater may apply it as
  // each bucket's gradients are reduced.
  const float lr =
      options_.learning_rate_at ? options_.learning_rate_at(step) : updater_->learning_rate();
  updater_->BeginStep(lr);
  float loss = 0.0f;
  for (int m = 0; m < k; ++m) {
    const auto t0 = Clock::now();
    FLEET_RETURN_IF_ERROR(
        task_.LoadBatch(std::span<const int64_t>(order_.data() + first + m * micro, micro)));
    reader_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    FLEET_ASSIGN_OR_RETURN(float micro_loss,
                           task_.ForwardBackward(updater_->grad_ready(m == k - 1),
                                                 updater_->loss_scale() / k));
    loss += micro_loss / k;
  }
  FLEET_RETURN_IF_ERROR(updater_->Step());
  return loss;
}

Result<double> Loop::Evaluate() {
  FLEET_ASSIGN_OR_RETURN(std::vector<float> sums, task_.EvalSums(rank_, world_));
  FLEET_RETURN_IF_ERROR(updater_->SumOverRanks(sums));
  return task_.EvalMetric(sums);
}

Status Loop::EvaluateAndReport(int64_t epoch, int64_t step, TrainReport* report) {
  const auto t0 = Clock::now();
  FLEET_ASSIGN_OR_RETURN(double metric, Evaluate());
  EvalWindow window{epoch, step, metric,
                    std::chrono::duration<double>(Clock::now() - t0).count()};
  report->eval_metric.push_back(metric);
  report->eval_steps.push_back(step);
  Print(options_.eval_line ? options_.eval_line(window)
                           : absl::StrFormat("epoch: %d, %s: %.4f", epoch,
                                             task_.eval_metric_name(), metric));
  WriteScalars([&](tensorboard::ScalarSink& s) -> Status {
    FLEET_RETURN_IF_ERROR(s.Scalar("eval/" + task_.eval_metric_name(), step, metric));
    return options_.eval_scalars ? options_.eval_scalars(window, s) : Status::OK();
  });
  return Status::OK();
}

Result<TrainReport> Loop::Run() {
  FLEET_RETURN_IF_ERROR(Setup());
  FLEET_RETURN_IF_ERROR(ResumeAndSync());

  TrainReport report;
  const int64_t spe = layout_.steps_per_epoch();
  int64_t total = spe * options_.epochs;
  if (options_.max_steps > 0) total = std::min(total, options_.max_steps);
  report.steps_per_epoch = spe;
  report.start_step = updater_->step();
  report.step_losses.reserve(std::max<int64_t>(0, total - report.start_step));
  report.step_micros.reserve(report.step_losses.capacity());

  float loss_sum = 0.0f;
  int64_t loss_count = 0;
  auto window_start = Clock::now();
  for (int64_t step = report.start_step; step < total; ++step) {
    const auto t0 = Clock::now();
    FLEET_ASSIGN_OR_RETURN(float loss, TrainStep(step));
    report.step_micros.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    report.step_losses.push_back(loss);
    loss_sum += loss;
    ++loss_count;
    const int64_t done = step + 1;  // == updater_->step()
    const int64_t epoch = step / spe;

    if (options_.log_every_steps > 0 && done % options_.log_every_steps == 0) {
      float sums[2] = {loss_sum, static_cast<float>(loss_count)};
      FLEET_RETURN_IF_ERROR(updater_->SumOverRanks(sums));
      ProgressWindow window;
      window.epoch = epoch;
      window.step = done;
      window.batch = step % spe;
      window.loss = sums[0] / sums[1];
      window.steps = loss_count;
      window.seconds = std::chrono::duration<double>(Clock::now() - window_start).count();
      window.global_batch = layout_.global_batch;
      window.learning_rate = updater_->learning_rate();
      window.reader_seconds = reader_seconds_;
      window.data_world_size = world_;
      window.grad_norm = updater_->grad_norm();
      window.loss_scale = updater_->loss_scale();
      Print(options_.progress_line(window));
      WriteScalars([&](tensorboard::ScalarSink& s) -> Status {
        FLEET_RETURN_IF_ERROR(s.Scalar("train/loss", done, window.loss));
        FLEET_RETURN_IF_ERROR(s.Scalar("train/learning_rate", done, window.learning_rate));
        if (window.seconds > 0) {
          FLEET_RETURN_IF_ERROR(s.Scalar(
              "train/samples_per_sec", done,
              static_cast<double>(window.steps * window.global_batch) / window.seconds));
        }
        if (window.grad_norm) {
          FLEET_RETURN_IF_ERROR(s.Scalar("train/grad_norm", done, *window.grad_norm));
        }
        if (window.loss_scale != 1.0f) {
          FLEET_RETURN_IF_ERROR(s.Scalar("train/loss_scale", done, window.loss_scale));
        }
        return options_.progress_scalars ? options_.progress_scalars(window, s) : Status::OK();
      });
      loss_sum = 0.0f;
      loss_count = 0;
      reader_seconds_ = 0;
      window_start = Clock::now();
    }
    const bool epoch_end = done % spe == 0;
    const bool eval_now =
        (epoch_end && options_.evaluate) ||
        (options_.eval_every_steps > 0 && done % options_.eval_every_steps == 0);
    if (eval_now) {
      // Evaluation is not training speed: the window's clock skips it (and
      // still counts the window's steps before it).
      const auto eval_start = Clock::now();
      FLEET_RETURN_IF_ERROR(EvaluateAndReport(epoch, done, &report));
      window_start += Clock::now() - eval_start;
    }
    if (epoch_end || done == total ||
        (options_.checkpoint_every_steps > 0 && done % options_.checkpoint_every_steps == 0)) {
      FLEET_RETURN_IF_ERROR(Save(done));
    }
    if (options_.after_step) FLEET_RETURN_IF_ERROR(options_.after_step(done));
  }
  report.end_step = updater_->step();
  report.memory = updater_->memory();
  FLEET_RETURN_IF_ERROR(updater_->MaterializeParams());
  report.params = task_.arena().ParamsToHost();
  return report;
}

}  // namespace

std::string DefaultProgressLine(const ProgressWindow& w) {
  return absl::StrFormat("epoch: %d, step: %d, train_loss: %.6f, speed: %.2f steps/s", w.epoch,
                         w.step, w.loss, w.seconds > 0 ? w.steps / w.seconds : 0.0);
}

Result<TrainReport> RunTrainLoop(const TrainLoopOptions& options, CollectiveTask& task,
                                 Collective* collective, std::ostream* progress) {
  Loop loop(options, task, collective, progress);
  return loop.Run();
}

}  // namespace fleet::trainer::collective
