// ShardedAdamWUpdater on its own (a small arena): its update equals
// trainer::AdamW's, float16 loss scaling skips an overflowing step and
// unscales the others, its state files refuse every broken byte with
// Corruption naming the file (the model's parameters stay as they were),
// and on 2 ranks (threads) the offloaded update runs as each bucket is
// reduced when clipping is off, after backward when it is on.
#include "collective/sharded_adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "comm/file_system.h"
#include "tests/comm/collective_test_util.h"
#include "trainer/models/adamw.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"

namespace fleet::trainer::collective {
namespace {

namespace fs = std::filesystem;

ParamTable Table() {
  return {{"w", Shape{{8, 16}}}, {"b", Shape{{16}}}, {"v", Shape{{40}}}};
}

// Gradients that differ per element and step.
void FillGrads(ParamArena& arena, int step, float scale) {
  std::vector<float> g(arena.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = scale * std::sin(0.37f * i + step) * 0.1f;
  arena.backend()->CopyFromHost(arena.grads().data(), g.data(), g.size() * sizeof(float));
}

struct Fixture {
  CpuBackend backend;
  CpuGptKernels kernels{nullptr};
  ParamArena arena = [this] {
    auto a = ParamArena::Create(Table(), &backend);
    EXPECT_TRUE(a.ok());
    std::vector<float> p(a->size());
    for (size_t i = 0; i < p.size(); ++i) p[i] = 0.01f * static_cast<float>(i % 17);
    EXPECT_TRUE(a->ParamsFromHost(p).ok());
    return *std::move(a);
  }();
};

std::unique_ptr<ShardedAdamWUpdater> MakeUpdater(Fixture& f, const ShardedAdamWOptions& options) {
  AdamWConfig config;
  config.clip_norm = 0.5f;
  auto updater =
      ShardedAdamWUpdater::Create({}, &f.arena, &f.kernels, config, 1e-2f, options, "m");
  EXPECT_TRUE(updater.ok()) << updater.status().ToString();
  return *std::move(updater);
}

TEST(ShardedAdamWTest, OneProcessEqualsAdamW) {
  Fixture ours, theirs;
  auto updater = MakeUpdater(ours, {});
  AdamWConfig config;
  config.clip_norm = 0.5f;
  AdamW adamw(&theirs.arena, &theirs.kernels, config, 1e-2f);
  for (int step = 0; step < 5; ++step) {
    updater->BeginStep(1e-2f);
    FillGrads(ours.arena, step, 1.0f);
    ASSERT_TRUE(updater->Step().ok());
    FillGrads(theirs.arena, step, 1.0f);
    adamw.Step();
  }
  EXPECT_EQ(ours.arena.ParamsToHost(), theirs.arena.ParamsToHost());
  EXPECT_EQ(updater->step(), 5);
  EXPECT_DOUBLE_EQ(updater->last_grad_norm(), adamw.last_grad_norm());
}

TEST(ShardedAdamWTest, Float16LossScalingUnscalesAndSkipsOverflow) {
  Fixture scaled, plain;
  ShardedAdamWOptions options;
  options.loss_scaler = LossScalerConfig{};
  options.loss_scaler->init_scale = 1024.0;
  auto updater = MakeUpdater(scaled, options);
  auto reference = MakeUpdater(plain, {});
  ASSERT_EQ(updater->loss_scale(), 1024.0f);

  // Gradients computed with the loss scaled by a power of two update the
  // parameters exactly as the unscaled ones do.
  updater->BeginStep(1e-2f);
  FillGrads(scaled.arena, 0, updater->loss_scale());
  ASSERT_TRUE(updater->Step().ok());
  reference->BeginStep(1e-2f);
  FillGrads(plain.arena, 0, 1.0f);
  ASSERT_TRUE(reference->Step().ok());
  EXPECT_EQ(scaled.arena.ParamsToHost(), plain.arena.ParamsToHost());
  EXPECT_DOUBLE_EQ(updater->last_grad_norm(), reference->last_grad_norm());

  // An overflowing step changes nothing but the scale and the step count.
  const std::vector<float> before = scaled.arena.ParamsToHost();
  updater->BeginStep(1e-2f);
  FillGrads(scaled.arena, 1, updater->loss_scale());
  const float inf = std::numeric_limits<float>::infinity();
  scaled.backend.CopyFromHost(scaled.arena.grads().data() + 3, &inf, sizeof(inf));
  ASSERT_TRUE(updater->Step().ok());
  EXPECT_EQ(scaled.arena.ParamsToHost(), before);
  EXPECT_EQ(updater->loss_scale(), 512.0f);
  EXPECT_EQ(updater->skipped_steps(), 1);
  EXPECT_EQ(updater->step(), 2);
}

TEST(ShardedAdamWTest, BrokenStateFilesAreCorruptionNamingTheFile) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("sharded_adamw_test." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    Fixture f;
    auto updater = MakeUpdater(f, {});
    for (int step = 0; step < 2; ++step) {
      updater->BeginStep(1e-2f);
      FillGrads(f.arena, step, 1.0f);
      ASSERT_TRUE(updater->Step().ok());
    }
    ASSERT_TRUE(updater->Save(dir).ok());
  }
  const fs::path state = dir / "m.adamw.s2.0-of-1";
  ASSERT_TRUE(fs::exists(state));
  std::string good;
  {
    std::ifstream in(state, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Offsets: the magic, the header (version at 8), the piece table, the
  // header checksum, a piece's moments, its checksum, and a truncation.
  const size_t header_end = 8 + 4 + 8 + 8 + 8 + 8 + 4 + 16;
  const std::vector<std::pair<size_t, std::string>> flips = {
      {0, "magic"}, {8, "version"}, {header_end - 3, "checksum"},
      {header_end + 4 + 10, "checksum"}, {good.size() - 2, "checksum"}};
  for (const auto& [at, says] : flips) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    std::ofstream(state, std::ios::binary | std::ios::trunc) << bad;
    Fixture f;
    const std::vector<float> before = f.arena.ParamsToHost();
    auto updater = MakeUpdater(f, {});
    Status st = updater->Resume(dir);
    EXPECT_TRUE(st.IsCorruption()) << "byte " << at << ": " << st.ToString();
    EXPECT_NE(st.ToString().find(says), std::string::npos) << st.ToString();
    EXPECT_NE(st.ToString().find(state.string()), std::string::npos) << st.ToString();
  }
  std::ofstream(state, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 9);
  {
    Fixture f;
    auto updater = MakeUpdater(f, {});
    Status st = updater->Resume(dir);
    EXPECT_TRUE(st.IsCorruption()) << st.ToString();
    EXPECT_NE(st.ToString().find("truncated"), std::string::npos) << st.ToString();
  }
  std::ofstream(state, std::ios::binary | std::ios::trunc) << good;
  {
    Fixture f;
    auto updater = MakeUpdater(f, {});
    ASSERT_TRUE(updater->Resume(dir).ok());
    EXPECT_EQ(updater->step(), 2);
  }
  fs::remove_all(dir);
}

// Sharded optimizer state goes through the FileSystem seam too: a save that
// fails in the state file or in the params file after it keeps the
// previous checkpoint, which a fresh updater resumes at its step.
TEST(ShardedAdamWTest, FailedSaveKeepsThePreviousCheckpoint) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("sharded_adamw_fault_test." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  using Op = FaultInjectionFileSystem::Op;
  // Appends: the state file's header, m and v, its checksum; then the params
  // file. Renames: the state file's, then the params file's.
  for (const auto& [op, nth] : {std::pair{Op::kAppend, 1}, std::pair{Op::kAppend, 2},
                                std::pair{Op::kRename, 1}, std::pair{Op::kRename, 2}}) {
    SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(op) << " call " << nth);
    FaultInjectionFileSystem faulty(DefaultFileSystem());
    ShardedAdamWOptions options;
    options.file_system = &faulty;
    Fixture f;
    auto updater = MakeUpdater(f, options);
    for (int step = 0; step < 2; ++step) {
      updater->BeginStep(1e-2f);
      FillGrads(f.arena, step, 1.0f);
      ASSERT_TRUE(updater->Step().ok());
    }
    ASSERT_TRUE(updater->Save(dir).ok());
    const std::vector<float> saved = f.arena.ParamsToHost();
    updater->BeginStep(1e-2f);
    FillGrads(f.arena, 2, 1.0f);
    ASSERT_TRUE(updater->Step().ok());
    faulty.FailNth(op, nth);
    const Status st = updater->Save(dir);
    EXPECT_TRUE(st.IsIOError()) << st.ToString();
    EXPECT_NE(st.ToString().find("injected"), std::string::npos) << st.ToString();

    Fixture fresh;
    auto resumed = MakeUpdater(fresh, {});
    ASSERT_TRUE(resumed->Resume(dir).ok());
    EXPECT_EQ(resumed->step(), 2);
    EXPECT_EQ(fresh.arena.ParamsToHost(), saved);
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  fs::remove_all(dir);
}

// Offload over 2 ranks, every tensor a bucket, backward reporting them last
// first as a model does. Both ranks hold the same gradients, so their mean
// is exact and the parameters must equal one process's bit for bit.
struct OffloadRun {
  std::vector<float> params;
  bool updates_on_reduction = false;
  std::vector<size_t> updates_before_last_reduction;  // per step
};

constexpr int kOffloadSteps = 4;
float StepLr(int step) { return 1e-2f / static_cast<float>(step + 1); }

OffloadRun TrainOffloaded(Collective* world, int degree, int stage, float clip_norm) {
  Fixture f;
  ShardedAdamWOptions options;
  options.offload = true;
  options.data_parallel.bucket_bytes = 1;  // one bucket per tensor
  options.sharding = {degree, stage};
  if (stage == 3) options.param_units = {{0, 1}, {1, 2}, {2, 3}};
  AdamWConfig config;
  config.clip_norm = clip_norm;
  auto created = ShardedAdamWUpdater::Create({world, nullptr, nullptr}, &f.arena, &f.kernels,
                                             config, StepLr(0), options, "m");
  testing::ThrowIfError(created.status(), "creating the updater");
  ShardedAdamWUpdater& updater = **created;
  testing::ThrowIfError(updater.Resume({}), "starting");
  OffloadRun run;
  run.updates_on_reduction = updater.updates_on_reduction();
  for (int step = 0; step < kOffloadSteps; ++step) {
    updater.BeginStep(StepLr(step));
    FillGrads(f.arena, step, 1.0f);
    const GradReadyFn ready = updater.grad_ready(/*last_micro_batch=*/true);
    for (size_t t = f.arena.num_tensors(); t > 0; --t) ready(t - 1, t);
    testing::ThrowIfError(updater.Step(), "step");
    run.updates_before_last_reduction.push_back(updater.updates_before_last_reduction());
  }
  testing::ThrowIfError(updater.MaterializeParams(), "gathering the parameters");
  run.params = f.arena.ParamsToHost();
  return run;
}

TEST(ShardedAdamWTest, OffloadUpdatesEachBucketAsItIsReducedWhenClippingIsOff) {
  const OffloadRun one = TrainOffloaded(nullptr, 1, 1, 0.0f);
  EXPECT_FALSE(one.updates_on_reduction);  // nothing is reduced
  for (const std::string kind : {"gloo", "shm"}) {
    for (const auto& [degree, stage] : {std::pair{1, 1}, {2, 1}, {2, 2}, {2, 3}}) {
      SCOPED_TRACE(kind + " degree " + std::to_string(degree) + " stage " + std::to_string(stage));
      std::vector<OffloadRun> runs(2);
      testing::RunRanksOver(kind, 2, std::chrono::milliseconds(30000),
                            [&, degree, stage](int rank, Collective& world) {
                              runs[rank] = TrainOffloaded(&world, degree, stage, 0.0f);
                            });
      for (const OffloadRun& run : runs) {
        EXPECT_TRUE(run.updates_on_reduction);
        // 3 buckets: the first two were updated before the last was reduced.
        EXPECT_EQ(run.updates_before_last_reduction, std::vector<size_t>(kOffloadSteps, 2));
        EXPECT_EQ(run.params, one.params);
      }
    }
  }
}

TEST(ShardedAdamWTest, OffloadWithClippingUpdatesAfterBackward) {
  const OffloadRun one = TrainOffloaded(nullptr, 1, 1, 0.5f);
  for (const auto& [degree, stage] : {std::pair{1, 1}, {2, 3}}) {
    SCOPED_TRACE("degree " + std::to_string(degree) + " stage " + std::to_string(stage));
    std::vector<OffloadRun> runs(2);
    testing::RunGlooRanks(2, std::chrono::milliseconds(30000),
                          [&, degree, stage](int rank, Collective& world) {
                            runs[rank] = TrainOffloaded(&world, degree, stage, 0.5f);
                          });
    for (const OffloadRun& run : runs) {
      EXPECT_FALSE(run.updates_on_reduction);
      EXPECT_EQ(run.updates_before_last_reduction, std::vector<size_t>(kOffloadSteps, 0));
      // The clip factor's sum of squares is summed over the shards at stage
      // 3, in another order than one process's: equal up to that rounding.
      ASSERT_EQ(run.params.size(), one.params.size());
      for (size_t i = 0; i < one.params.size(); ++i) {
        if (degree == 1) {
          EXPECT_EQ(run.params[i], one.params[i]) << "parameter " << i;
        } else {
          EXPECT_NEAR(run.params[i], one.params[i], 1e-6f) << "parameter " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fleet::trainer::collective
