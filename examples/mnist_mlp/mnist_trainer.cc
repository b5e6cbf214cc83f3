#include "examples/mnist_mlp/mnist_trainer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "trainer/checkpoint.h"
#include "trainer/data/file_io.h"
#include "trainer/data/metrics.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"

namespace fleet::examples {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kCheckpointFile[] = "mlp.ckpt";
constexpr char kPositionFile[] = "data_position";
// Test-set samples per forward pass during evaluation.
constexpr int64_t kEvalBatch = 1000;

// The data layout that gives a step its samples; a checkpoint only resumes
// into a run with the same layout.
struct DataLayout {
  int64_t train_samples = 0;
  int64_t global_batch = 0;
  uint64_t shuffle_seed = 0;

  int64_t steps_per_epoch() const { return train_samples / global_batch; }
};

// The permutation of [0, n) that epoch `epoch` visits. Fisher-Yates over
// mt19937_64, whose output the standard fixes, so every rank and every
// build draws the same order (std::shuffle's is implementation-defined).
std::vector<int64_t> EpochOrder(uint64_t seed, int64_t epoch, int64_t n) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    // The modulo bias (< 2^-40 for n <= 2^24) does not matter for shuffling.
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

std::string PositionText(const DataLayout& layout, int64_t step) {
  const int64_t spe = layout.steps_per_epoch();
  return absl::StrCat("train_samples=", layout.train_samples, "\nglobal_batch=",
                      layout.global_batch, "\nshuffle_seed=", layout.shuffle_seed,
                      "\nstep=", step, "\nepoch=", step / spe, "\nbatch_in_epoch=", step % spe,
                      "\n");
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
  const std::pair<const char*, uint64_t> expected[] = {
      {"train_samples", static_cast<uint64_t>(want.train_samples)},
      {"global_batch", static_cast<uint64_t>(want.global_batch)},
      {"shuffle_seed", want.shuffle_seed}};
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

class Trainer {
 public:
  Trainer(const MnistOptions& options, const MnistData& data, Collective* collective,
          trainer::Backend* backend, std::ostream* progress)
      : options_(options),
        data_(data),
        collective_(collective),
        backend_(backend),
        progress_(progress),
        rank_(collective ? collective->rank() : 0),
        world_(collective ? collective->size() : 1) {}

  Result<MnistReport> Run();

 private:
  Status Validate() const;
  Status Setup();
  // Rank 0 loads the checkpoint if there is one; every rank then learns
  // whether that worked and takes rank 0's model.
  Status ResumeAndSync();
  Status Save(int64_t step);
  Result<float> TrainStep(int64_t step);
  Result<double> Evaluate();
  void Print(const std::string& line) {
    if (progress_ != nullptr) *progress_ << line << std::endl;
  }

  const MnistOptions& options_;
  const MnistData& data_;
  Collective* const collective_;
  trainer::Backend* const backend_;
  std::ostream* const progress_;
  const int rank_;
  const int world_;

  DataLayout layout_;
  std::unique_ptr<trainer::Mlp> model_;
  std::unique_ptr<trainer::Optimizer> optimizer_;
  std::unique_ptr<trainer::DataParallel> dp_;

  // The order of the epoch in use, and which epoch it is.
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_labels_;
};

Status Trainer::Validate() const {
  const MnistOptions& o = options_;
  if (o.sizes.size() < 2) return Status::InvalidArgument("sizes needs an input and an output");
  if (o.sizes.front() != data_.train.images.pixels_per_image() ||
      o.sizes.front() != data_.test.images.pixels_per_image()) {
    return Status::InvalidArgument(
        "input size differs from the images' pixel count",
        absl::StrCat(o.sizes.front(), " vs ", data_.train.images.pixels_per_image(), " (train), ",
                     data_.test.images.pixels_per_image(), " (test)"));
  }
  if (o.epochs < 1) return Status::InvalidArgument("epochs must be >= 1", absl::StrCat(o.epochs));
  if (o.batch_size < 1) {
    return Status::InvalidArgument("batch_size must be >= 1", absl::StrCat(o.batch_size));
  }
  if (!(o.lr > 0)) return Status::InvalidArgument("lr must be > 0", absl::StrCat(o.lr));
  if (o.max_steps < 0 || o.log_every_steps < 0 || o.checkpoint_every_steps < 0) {
    return Status::InvalidArgument("max_steps, log_every_steps and checkpoint_every_steps must be >= 0");
  }
  if (data_.train.images.count < static_cast<int64_t>(o.batch_size) * world_) {
    return Status::InvalidArgument(
        "too few training samples for one global batch",
        absl::StrCat(data_.train.images.count, " samples, global batch ",
                     static_cast<int64_t>(o.batch_size) * world_));
  }
  return Status::OK();
}

Status Trainer::Setup() {
  FLEET_RETURN_IF_ERROR(Validate());
  layout_ = DataLayout{data_.train.images.count, static_cast<int64_t>(options_.batch_size) * world_,
                       options_.shuffle_seed};
  trainer::MlpConfig config;
  config.sizes = options_.sizes;
  config.seed = options_.model_seed;
  FLEET_ASSIGN_OR_RETURN(model_, trainer::Mlp::Create(config, backend_));
  trainer::OptimizerConfig opt;
  opt.type = "adam";
  opt.lr = options_.lr;
  FLEET_ASSIGN_OR_RETURN(optimizer_, trainer::CreateOptimizer(opt, &model_->arena()));
  FLEET_ASSIGN_OR_RETURN(
      dp_, trainer::DataParallel::Create(collective_, &model_->arena(), options_.data_parallel));
  batch_x_.resize(static_cast<size_t>(options_.batch_size) * options_.sizes.front());
  batch_labels_.resize(options_.batch_size);
  return Status::OK();
}

Status Trainer::ResumeAndSync() {
  Status load;
  if (rank_ == 0 && !options_.checkpoint_dir.empty()) {
    const std::filesystem::path dir(options_.checkpoint_dir);
    std::error_code ec;
    if (std::filesystem::exists(dir / kCheckpointFile, ec)) {
      load = CheckPosition((dir / kPositionFile).string(), layout_);
      if (load.ok()) {
        load = trainer::LoadCheckpoint((dir / kCheckpointFile).string(), &model_->arena(),
                                       optimizer_.get());
      }
      if (load.ok()) {
        LOG(INFO) << "resumed from " << (dir / kCheckpointFile).string() << " at step "
                  << optimizer_->step();
      }
    }
  }
  // Every rank learns whether rank 0 could load, so none waits for a
  // broadcast that will never come.
  float failed = load.ok() ? 0.0f : 1.0f;
  FLEET_RETURN_IF_ERROR(dp_->SumOverRanks(std::span<float>(&failed, 1)));
  if (!load.ok()) return load.WithContext("loading the checkpoint");
  if (failed > 0) {
    return Status::FailedPrecondition("rank 0 could not load the checkpoint (see its log)",
                                      options_.checkpoint_dir);
  }
  return dp_->SyncFromRoot(optimizer_.get());
}

Status Trainer::Save(int64_t step) {
  if (rank_ != 0 || options_.checkpoint_dir.empty()) return Status::OK();
  const std::filesystem::path dir(options_.checkpoint_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create the checkpoint directory: " + ec.message(), dir.string());
  // Position first: a crash before the checkpoint's rename leaves the old
  // checkpoint, which the unchanged layout still places (see the header).
  FLEET_RETURN_IF_ERROR(
      data::WriteFileAtomically((dir / kPositionFile).string(), PositionText(layout_, step)));
  return trainer::SaveCheckpoint((dir / kCheckpointFile).string(), model_->arena(), *optimizer_);
}

Result<float> Trainer::TrainStep(int64_t step) {
  const int64_t spe = layout_.steps_per_epoch();
  const int64_t epoch = step / spe;
  if (epoch != order_epoch_) {
    order_ = EpochOrder(layout_.shuffle_seed, epoch, layout_.train_samples);
    order_epoch_ = epoch;
  }
  const int64_t B = options_.batch_size;
  const int64_t first = (step % spe) * layout_.global_batch + rank_ * B;
  const int64_t pixels = data_.train.images.pixels_per_image();
  for (int64_t i = 0; i < B; ++i) {
    const int64_t sample = order_[first + i];
    std::copy_n(data_.train.images.pixels.begin() + sample * pixels, pixels,
                batch_x_.begin() + i * pixels);
    batch_labels_[i] = data_.train.labels[sample];
  }
  model_->arena().ZeroGrad();
  FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(batch_x_, batch_labels_));
  model_->Backward(dp_->grad_ready());
  FLEET_RETURN_IF_ERROR(dp_->FinishGradients());
  optimizer_->Step();
  return loss;
}

Result<double> Trainer::Evaluate() {
  const data::IdxDataset& test = data_.test;
  const int64_t n = test.images.count;
  const int64_t begin = n * rank_ / world_;
  const int64_t end = n * (rank_ + 1) / world_;
  const int64_t pixels = test.images.pixels_per_image();
  float sums[2] = {0.0f, 0.0f};  // correct, count
  for (int64_t b = begin; b < end; b += kEvalBatch) {
    const int64_t e = std::min(end, b + kEvalBatch);
    std::span<const float> x(test.images.pixels.data() + b * pixels, (e - b) * pixels);
    std::span<const int32_t> labels(test.labels.data() + b, e - b);
    FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(x, labels));
    (void)loss;
    const std::vector<float> probs = model_->Probabilities();
    sums[0] += static_cast<float>(data::CountCorrectArgmax(probs, model_->num_classes(), labels));
    sums[1] += static_cast<float>(e - b);
  }
  FLEET_RETURN_IF_ERROR(dp_->SumOverRanks(sums));
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

Result<MnistReport> Trainer::Run() {
  FLEET_RETURN_IF_ERROR(Setup());
  FLEET_RETURN_IF_ERROR(ResumeAndSync());

  MnistReport report;
  const int64_t spe = layout_.steps_per_epoch();
  int64_t total = spe * options_.epochs;
  if (options_.max_steps > 0) total = std::min(total, options_.max_steps);
  report.steps_per_epoch = spe;
  report.start_step = optimizer_->step();
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
    const int64_t done = step + 1;  // == optimizer_->step()
    const int64_t epoch = step / spe;

    if (options_.log_every_steps > 0 && done % options_.log_every_steps == 0) {
      float sums[2] = {loss_sum, static_cast<float>(loss_count)};
      FLEET_RETURN_IF_ERROR(dp_->SumOverRanks(sums));
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      Print(absl::StrFormat("epoch: %d, step: %d, train_loss: %.6f, speed: %.2f steps/s", epoch,
                            done, sums[0] / sums[1], secs > 0 ? loss_count / secs : 0.0));
      loss_sum = 0.0f;
      loss_count = 0;
      window_start = Clock::now();
    }
    const bool epoch_end = done % spe == 0;
    if (epoch_end && options_.evaluate) {
      FLEET_ASSIGN_OR_RETURN(double accuracy, Evaluate());
      report.test_accuracy.push_back(accuracy);
      Print(absl::StrFormat("epoch: %d, test_accuracy: %.4f", epoch, accuracy));
    }
    if (epoch_end || done == total ||
        (options_.checkpoint_every_steps > 0 && done % options_.checkpoint_every_steps == 0)) {
      FLEET_RETURN_IF_ERROR(Save(done));
    }
    if (options_.after_step) FLEET_RETURN_IF_ERROR(options_.after_step(done));
    if (epoch_end) window_start = Clock::now();  // evaluation is not training speed
  }
  report.end_step = optimizer_->step();
  report.params = model_->arena().ParamsToHost();
  return report;
}

}  // namespace

MnistFiles MnistFilesIn(const std::string& dir) {
  const std::filesystem::path d(dir);
  return MnistFiles{(d / "train-images-idx3-ubyte.gz").string(),
                    (d / "train-labels-idx1-ubyte.gz").string(),
                    (d / "t10k-images-idx3-ubyte.gz").string(),
                    (d / "t10k-labels-idx1-ubyte.gz").string()};
}

Result<MnistData> LoadMnistData(const MnistFiles& files, int64_t max_train_samples) {
  constexpr int kClasses = 10;
  MnistData data;
  FLEET_ASSIGN_OR_RETURN(data.train,
                         data::ReadIdxDataset(files.train_images, files.train_labels, kClasses));
  FLEET_ASSIGN_OR_RETURN(data.test,
                         data::ReadIdxDataset(files.test_images, files.test_labels, kClasses));
  if (max_train_samples > 0 && max_train_samples < data.train.images.count) {
    data.train.images.count = max_train_samples;
    data.train.images.pixels.resize(max_train_samples * data.train.images.pixels_per_image());
    data.train.labels.resize(max_train_samples);
  }
  return data;
}

Result<MnistReport> TrainMnist(const MnistOptions& options, const MnistData& data,
                               Collective* collective, trainer::Backend* backend,
                               std::ostream* progress) {
  if (backend == nullptr) return Status::InvalidArgument("TrainMnist: no backend");
  Trainer trainer(options, data, collective, backend, progress);
  return trainer.Run();
}

}  // namespace fleet::examples
