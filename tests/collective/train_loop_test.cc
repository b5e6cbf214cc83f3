// The collective training loop's own interface (collective/
// train_loop.h), beyond what the MNIST tests exercise through TrainMnist:
// what a progress line is given, and the default line's format; and the
// MLP classifier task's two ways of gathering a batch.
#include "collective/train_loop.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <span>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/collective/mnist_test_data.h"
#include "tests/comm/collective_test_util.h"
#include "collective/mlp_classifier.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::trainer::collective {
namespace {

using fleet::testing::RunGlooRanks;
using fleet::testing::SyntheticMnist;
using fleet::testing::ThrowIfError;

TEST(TrainLoopTest, DefaultProgressLine) {
  ProgressWindow w;
  w.epoch = 1;
  w.step = 30;
  w.loss = 0.5;
  w.steps = 10;
  w.seconds = 4.0;
  EXPECT_EQ(DefaultProgressLine(w),
            "epoch: 1, step: 30, train_loss: 0.500000, speed: 2.50 steps/s");
  w.seconds = 0;
  EXPECT_EQ(DefaultProgressLine(w),
            "epoch: 1, step: 30, train_loss: 0.500000, speed: 0.00 steps/s");
}

// Batch 32, a progress line every `log_every` steps up to `max_steps`, no
// evaluation at an epoch's end.
TrainLoopOptions LoggingOptions(int64_t max_steps, int log_every) {
  TrainLoopOptions options;
  options.batch_size = 32;
  options.max_steps = max_steps;
  options.log_every_steps = log_every;
  options.evaluate = false;
  return options;
}

// Two ranks of batch 32 over 1000 samples (15 steps per epoch), a line every
// 4 steps up to step 18: the windows name the step, epoch, window length,
// global batch and learning rate, and the loss is the mean of both ranks'
// losses over the window.
TEST(TrainLoopTest, ProgressLineGetsEachWindow) {
  trainer::kernels::SetBlasThreads(1);
  const data::MnistData data = SyntheticMnist(1000, 100);
  TrainLoopOptions options = LoggingOptions(18, 4);
  options.epochs = 2;
  options.optimizer.lr = 2e-3f;
  std::mutex mu;
  std::vector<ProgressWindow> windows;
  options.progress_line = [&](const ProgressWindow& w) {
    std::lock_guard<std::mutex> lock(mu);
    windows.push_back(w);
    return DefaultProgressLine(w);
  };
  std::vector<TrainReport> reports(2);
  RunGlooRanks(2, std::chrono::milliseconds(20000), [&](int rank, Collective& group) {
    CpuBackend backend;
    auto task = MlpClassifierTask::Create({}, data.train, data.test, &backend);
    ThrowIfError(task.status(), "MlpClassifierTask");
    auto report = RunTrainLoop(options, **task, &group, nullptr);
    ThrowIfError(report.status(), "RunTrainLoop");
    reports[rank] = std::move(report).value();
  });
  ASSERT_EQ(reports[0].step_losses.size(), 18u);
  ASSERT_EQ(windows.size(), 8u);  // 4 per rank, at steps 4, 8, 12, 16
  std::sort(windows.begin(), windows.end(),
            [](const ProgressWindow& a, const ProgressWindow& b) { return a.step < b.step; });
  for (size_t i = 0; i < windows.size(); ++i) {
    const ProgressWindow& w = windows[i];
    const int64_t step = 4 * static_cast<int64_t>(i / 2 + 1);
    EXPECT_EQ(w.step, step);
    EXPECT_EQ(w.epoch, (step - 1) / 15);
    EXPECT_EQ(w.steps, 4);
    EXPECT_EQ(w.global_batch, 64);
    EXPECT_FLOAT_EQ(w.learning_rate, 2e-3f);
    EXPECT_GT(w.seconds, 0);
    double sum = 0;
    for (const TrainReport& r : reports) {
      for (int64_t s = step - 4; s < step; ++s) sum += r.step_losses[s];
    }
    EXPECT_NEAR(w.loss, sum / 8, 1e-5) << "step " << step;
  }
}

// A window's seconds leave out an evaluation inside it but keep the window's
// steps before that evaluation. One rank, a line every 4 steps, an
// evaluation every 2 whose report takes 300 ms, and 100 ms of extra work
// after step 1 (before the first evaluation). Before: the window restarted
// its clock after each evaluation and lost step 1's 100 ms (speed 2.8x too
// high on the first line after an epoch's evaluation in mnist_mlp).
TEST(TrainLoopTest, WindowSecondsSkipEvaluationOnly) {
  trainer::kernels::SetBlasThreads(1);
  const data::MnistData data = SyntheticMnist(1000, 100);
  TrainLoopOptions options = LoggingOptions(4, 4);
  options.eval_every_steps = 2;
  options.eval_line = [](const EvalWindow&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return std::string("eval");
  };
  options.after_step = [](int64_t done) {
    if (done == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return Status::OK();
  };
  std::vector<ProgressWindow> windows;
  options.progress_line = [&](const ProgressWindow& w) {
    windows.push_back(w);
    return DefaultProgressLine(w);
  };
  CpuBackend backend;
  auto task = MlpClassifierTask::Create({}, data.train, data.test, &backend);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  auto report = RunTrainLoop(options, **task, nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->eval_steps, (std::vector<int64_t>{2, 4}));
  ASSERT_EQ(windows.size(), 1u);
  EXPECT_GE(windows[0].seconds, 0.1) << "lost the steps before the evaluation";
  EXPECT_LT(windows[0].seconds, 0.1 + 0.25) << "counted the 300 ms evaluations";
}

// A task that records what the loop hands it, over an MLP task.
class RecordingTask final : public CollectiveTask {
 public:
  explicit RecordingTask(CollectiveTask* inner) : inner_(inner) {}
  std::string name() const override { return inner_->name(); }
  ParamArena& arena() override { return inner_->arena(); }
  int64_t num_train_samples() const override { return inner_->num_train_samples(); }
  void BeginStep(int64_t step) override { steps.push_back(step); }
  Status LoadBatch(std::span<const int64_t> ids) override {
    loaded.insert(loaded.end(), ids.begin(), ids.end());
    return inner_->LoadBatch(ids);
  }
  Result<float> ForwardBackward(const GradReadyFn& ready, float scale) override {
    return inner_->ForwardBackward(ready, scale);
  }
  Result<std::vector<float>> EvalSums(int rank, int world) override {
    return inner_->EvalSums(rank, world);
  }
  double EvalMetric(std::span<const float> sums) const override { return inner_->EvalMetric(sums); }
  std::string eval_metric_name() const override { return inner_->eval_metric_name(); }

  std::vector<int64_t> steps, loaded;

 private:
  CollectiveTask* const inner_;
};

// Without shuffling (a dataset that shuffles itself, Megatron's) the loop
// reads samples in id order, tells the task each step before its batches,
// and a checkpoint of that order is refused by a shuffled run.
TEST(TrainLoopTest, UnshuffledOrderIsIdOrderAndIsPartOfTheCheckpoint) {
  trainer::kernels::SetBlasThreads(1);
  const data::MnistData data = SyntheticMnist(1000, 100);
  TrainLoopOptions options = LoggingOptions(3, 0);
  options.shuffle = false;
  options.micro_batches = 2;
  options.checkpoint_dir = ::testing::TempDir() + "/train_loop_unshuffled";
  std::filesystem::remove_all(options.checkpoint_dir);
  CpuBackend backend;
  auto mlp = MlpClassifierTask::Create({}, data.train, data.test, &backend);
  ASSERT_TRUE(mlp.ok()) << mlp.status().ToString();
  RecordingTask task(mlp->get());
  auto report = RunTrainLoop(options, task, nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::vector<int64_t> in_order(96);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_EQ(task.loaded, in_order);
  EXPECT_EQ(task.steps, (std::vector<int64_t>{0, 1, 2}));
  options.shuffle = true;
  options.max_steps = 4;
  auto shuffled = RunTrainLoop(options, task, nullptr, nullptr);
  EXPECT_EQ(shuffled.status().code(), StatusCode::kFailedPrecondition)
      << shuffled.status().ToString();
  EXPECT_NE(shuffled.status().message().find("shuffled=0"), std::string::npos)
      << shuffled.status().ToString();
  std::filesystem::remove_all(options.checkpoint_dir);
}

// The training gather reads the IDX bytes (in huge-page memory) when every
// pixel is one the reader makes (byte * (1/255)), else the floats: both give
// the same batch, so the same loss and gradients bit for bit.
TEST(MlpClassifierTaskTest, BytePixelsGiveTheSameBatchAsFloats) {
  trainer::kernels::SetBlasThreads(1);
  data::MnistData bytes_data = SyntheticMnist(200, 10);
  for (float& p : bytes_data.train.images.pixels) {
    p = static_cast<float>(static_cast<int>(p * 255.0f + 0.5f)) * (1.0f / 255.0f);
  }
  data::MnistData float_data = bytes_data;
  float_data.train.images.pixels.back() = 0.123456f;  // no byte gives it; a sample not loaded
  const std::vector<int64_t> ids = {17, 3, 150, 42, 0, 99, 123, 8};
  std::vector<float> losses, grads[2];
  int i = 0;
  for (const data::MnistData* d : {&bytes_data, &float_data}) {
    CpuBackend backend;
    auto task = MlpClassifierTask::Create({}, d->train, d->test, &backend);
    ASSERT_TRUE(task.ok()) << task.status().ToString();
    EXPECT_EQ((*task)->uses_byte_pixels(), d == &bytes_data);
    ASSERT_TRUE((*task)->LoadBatch(ids).ok());
    (*task)->arena().ZeroGrad();
    auto loss = (*task)->ForwardBackward({}, 1.0f);
    ASSERT_TRUE(loss.ok());
    losses.push_back(*loss);
    grads[i++] = (*task)->arena().GradsToHost();
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

}  // namespace
}  // namespace fleet::trainer::collective
