// AdamW, clipping and the learning-rate schedule: six steps against float64
// NumPy (golden/make_gpt_golden.py, adamw.golden) on both twins, the
// schedule and clip factor against hand-computed values, and the pieces a
// sharded optimizer builds on (ShardRange, updates over sub-ranges).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/trainer/test_util.h"
#include "trainer/models/adamw.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/gpt_ref_kernels.h"
#include "trainer/models/gpt.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

class AdamWGolden : public ::testing::TestWithParam<bool> {};

TEST_P(AdamWGolden, SixStepsThroughWarmupDecayAndClipping) {
  const auto g = testing::ReadGolden(testing::GoldenDir() + "/adamw.golden");
  auto get = [&](const std::string& name) -> const std::vector<float>& {
    return testing::GoldenData(g, name);
  };
  const auto& h = get("hparams");
  ASSERT_EQ(h.size(), 9u);
  const AdamWConfig ac{
      .beta1 = h[0], .beta2 = h[1], .eps = h[2], .weight_decay = h[3], .clip_norm = h[4]};
  const LrScheduleConfig lc{.max_lr = h[5],
                            .min_lr = h[6],
                            .warmup_steps = static_cast<int64_t>(h[7]),
                            .decay_steps = static_cast<int64_t>(h[8])};
  CpuBackend backend;
  ThreadPool pool(1);
  std::unique_ptr<GptKernels> kernels;
  if (GetParam()) {
    kernels = std::make_unique<CpuGptKernels>(&pool);
  } else {
    kernels = std::make_unique<RefGptKernels>();
  }
  // "w" is a matrix (decays), "b" a vector (does not).
  auto arena = ParamArena::Create({{"w", Shape{3, 4}}, {"b", Shape{5}}}, &backend);
  ASSERT_TRUE(arena.ok());
  std::vector<float> init = get("init.w");
  init.insert(init.end(), get("init.b").begin(), get("init.b").end());
  ASSERT_TRUE(arena->ParamsFromHost(init).ok());
  LrSchedule schedule(lc);
  AdamW adamw(&*arena, kernels.get(), ac, 0.0f);
  for (int t = 1; t <= 6; ++t) {
    const std::string step = "step" + std::to_string(t) + ".";
    std::vector<float> grads = get(step + "grad.w");
    grads.insert(grads.end(), get(step + "grad.b").begin(), get(step + "grad.b").end());
    backend.CopyFromHost(arena->grads().data(), grads.data(), grads.size() * sizeof(float));
    const float lr = schedule.At(adamw.step());
    EXPECT_NEAR(lr, get(step + "lr")[0], 1e-9) << step;
    adamw.set_learning_rate(lr);
    adamw.Step();
    EXPECT_NEAR(adamw.last_grad_norm(), get(step + "norm")[0], 1e-5 * get(step + "norm")[0]);
    const auto p = arena->ParamsToHost();
    EXPECT_TRUE(AllClose(step + "w", std::span(p).first(12), get(step + "w"), 1e-6, 1e-5));
    EXPECT_TRUE(AllClose(step + "b", std::span(p).subspan(12), get(step + "b"), 1e-6, 1e-5));
  }
  EXPECT_EQ(adamw.step(), 6);
}

INSTANTIATE_TEST_SUITE_P(Twins, AdamWGolden, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Cpu" : "Reference"; });

TEST(LrSchedule, WarmupCosineFloor) {
  const LrSchedule s(
      LrScheduleConfig{.max_lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 10, .decay_steps = 110});
  EXPECT_FLOAT_EQ(s.At(0), 1e-4f);  // 1/10 of the peak: the first step is not wasted
  EXPECT_FLOAT_EQ(s.At(4), 5e-4f);
  EXPECT_FLOAT_EQ(s.At(9), 1e-3f);
  EXPECT_FLOAT_EQ(s.At(10), 1e-3f);    // cosine starts at the peak
  EXPECT_FLOAT_EQ(s.At(60), 5.5e-4f);  // half way: (max + min) / 2
  EXPECT_FLOAT_EQ(s.At(35), 1e-4f + 9e-4f * 0.5f * (1.0f + std::cos(M_PI / 4)));
  EXPECT_FLOAT_EQ(s.At(110), 1e-4f);
  EXPECT_FLOAT_EQ(s.At(1000000), 1e-4f);
  const LrSchedule no_warmup(
      LrScheduleConfig{.max_lr = 2e-3f, .min_lr = 0.0f, .warmup_steps = 0, .decay_steps = 4});
  EXPECT_FLOAT_EQ(no_warmup.At(0), 2e-3f);
  EXPECT_FLOAT_EQ(no_warmup.At(2), 1e-3f);
  EXPECT_FLOAT_EQ(no_warmup.At(4), 0.0f);
}

// Megatron's --lr-decay-style linear and constant; DeepSpeed's WarmupLR
// (log warmup from warmup_min_lr, then constant) and WarmupDecayLR (linear
// warmup from warmup_min_lr, linear decay); FleetX's use_increments (the
// schedule counts samples: 8 a step here).
TEST(LrSchedule, OtherShapes) {
  const LrScheduleConfig base{
      .max_lr = 1e-3f, .min_lr = 0.0f, .warmup_steps = 10, .decay_steps = 110};
  LrScheduleConfig c = base;
  c.decay = LrDecay::kLinear;
  EXPECT_FLOAT_EQ(LrSchedule(c).At(60), 5e-4f);
  EXPECT_FLOAT_EQ(LrSchedule(c).At(85), 2.5e-4f);
  c.decay = LrDecay::kConstant;
  EXPECT_FLOAT_EQ(LrSchedule(c).At(500), 1e-3f);
  c.warmup = LrWarmup::kLog;
  c.warmup_min_lr = 1e-4f;
  EXPECT_FLOAT_EQ(LrSchedule(c).At(0), 1e-4f);  // log(1) = 0: DeepSpeed's first step
  EXPECT_FLOAT_EQ(LrSchedule(c).At(4), 1e-4f + 9e-4f * std::log(5.0) / std::log(10.0));
  c.warmup = LrWarmup::kLinearMin;
  EXPECT_FLOAT_EQ(LrSchedule(c).At(5), 1e-4f + 9e-4f * 0.5f);
  c = base;
  c.step_increment = 8;
  c.warmup_steps = 80;
  c.decay_steps = 880;
  EXPECT_FLOAT_EQ(LrSchedule(c).At(0), 1e-4f);  // samples 8 of 80 warmed up
  EXPECT_FLOAT_EQ(LrSchedule(c).At(60), 5e-4f);
  EXPECT_FLOAT_EQ(LrSchedule(c).At(110), 0.0f);
  c.step_increment = 0;
  EXPECT_FALSE(c.Validate().ok());
}

TEST(ClipFactor, PaddleGlobalNorm) {
  EXPECT_EQ(ClipFactor(0.5, 1.0f), 1.0f);
  EXPECT_EQ(ClipFactor(1.0, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(ClipFactor(4.0, 1.0f), 0.25f);
  EXPECT_EQ(ClipFactor(1e9, 0.0f), 1.0f);  // clipping off
  EXPECT_TRUE(std::isnan(ClipFactor(NAN, 1.0f)));
  EXPECT_TRUE(std::isinf(ClipFactor(INFINITY, 1.0f)));
}

TEST(ShardRange, ContiguousCeilShardsCoverEverything) {
  auto range = [](size_t n, int d, int r) {
    const ElementRange e = ShardRange(n, d, r);
    return std::pair{e.begin, e.end};
  };
  EXPECT_EQ(range(10, 3, 0), (std::pair<size_t, size_t>{0, 4}));
  EXPECT_EQ(range(10, 3, 1), (std::pair<size_t, size_t>{4, 8}));
  EXPECT_EQ(range(10, 3, 2), (std::pair<size_t, size_t>{8, 10}));
  EXPECT_EQ(range(2, 4, 3), (std::pair<size_t, size_t>{2, 2}));  // empty shard
  EXPECT_EQ(range(7, 1, 0), (std::pair<size_t, size_t>{0, 7}));
  EXPECT_EQ(range(1000, 8, 7), (std::pair<size_t, size_t>{875, 1000}));  // equal shards
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{1001}}) {
    for (int d : {1, 2, 3, 8}) {
      size_t next = 0;
      for (int r = 0; r < d; ++r) {
        const ElementRange e = ShardRange(n, d, r);
        EXPECT_EQ(e.begin, next);
        next = e.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(AdamWRule, DecaysMatricesAndEmbeddingsOnly) {
  GptConfig c;
  c.num_layers = 1;
  for (const ParamSpec& spec : GptParamTable(c)) {
    const bool is_matrix =
        spec.name == "wte" || spec.name == "wpe" ||
        (spec.name.ends_with(".weight") && spec.name.find("ln_") == std::string::npos);
    EXPECT_EQ(AdamWRule::Decays(spec), is_matrix) << spec.name;
  }
}

// What a sharded optimizer does: every rank updates its own shard with its
// own m and v; the shards cut through tensors. The result is bit for bit
// the unsharded update.
TEST(AdamWRule, ShardedUpdatesEqualTheWholeUpdate) {
  GptConfig c;
  c.vocab_size = 13;
  c.max_position_embeddings = 5;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_layers = 2;
  const ParamTable table = GptParamTable(c);
  const size_t n = static_cast<size_t>(GptParamCount(c));
  const AdamWConfig config{.weight_decay = 0.1f};
  const AdamWRule rule(table, config);
  ThreadPool pool(1);
  CpuGptKernels kernels(&pool);
  const auto p0 = RandomVector(n, 1);
  std::vector<std::vector<float>> grads = {RandomVector(n, 2), RandomVector(n, 3)};
  // Whole arena, two steps.
  std::vector<float> p = p0, m(n), v(n);
  for (int t = 1; t <= 2; ++t) {
    rule.Update(&kernels, p.data(), grads[t - 1].data(), m.data(), v.data(), 0, n, t, 1e-2f, 0.5f);
  }
  for (int degree : {2, 3, 7}) {
    std::vector<float> ps = p0;
    for (int r = 0; r < degree; ++r) {
      const ElementRange e = ShardRange(n, degree, r);
      std::vector<float> ms(e.size()), vs(e.size());  // the shard's own state
      for (int t = 1; t <= 2; ++t) {
        rule.Update(&kernels, ps.data() + e.begin, grads[t - 1].data() + e.begin, ms.data(),
                    vs.data(), e.begin, e.end, t, 1e-2f, 0.5f);
      }
    }
    EXPECT_EQ(ps, p) << "degree " << degree;
  }
}

TEST(AdamWConfig, RejectsBadValuesNamingTheKey) {
  auto expect_key = [](AdamWConfig c, const std::string& key) {
    EXPECT_TRUE(testing::IsInvalidArgumentNaming(c.Validate(), key));
  };
  expect_key({.beta1 = 1.0f}, "Optimizer.beta1");
  expect_key({.beta2 = -0.1f}, "Optimizer.beta2");
  expect_key({.eps = 0.0f}, "Optimizer.epsilon");
  expect_key({.weight_decay = -1.0f}, "Optimizer.weight_decay");
  expect_key({.clip_norm = NAN}, "Optimizer.grad_clip.clip_norm");
  EXPECT_TRUE(AdamWConfig{}.Validate().ok());

  auto expect_lr_key = [](LrScheduleConfig c, const std::string& key) {
    EXPECT_TRUE(testing::IsInvalidArgumentNaming(c.Validate(), key));
  };
  expect_lr_key({.max_lr = 0.0f}, "Optimizer.lr.max_lr");
  expect_lr_key({.max_lr = 1e-4f, .min_lr = 1e-3f}, "Optimizer.lr.min_lr");
  expect_lr_key({.warmup_steps = 10, .decay_steps = 5}, "Optimizer.lr.warmup_rate");
  expect_lr_key({.decay_steps = 0}, "Optimizer.lr.decay_steps");
  EXPECT_TRUE(LrScheduleConfig{}.Validate().ok());
}

// AdamW is an Optimizer like Sgd and Adam: the checkpoint code saves and
// restores its moments and step.
TEST(AdamW, CheckpointRoundTrip) {
  CpuBackend backend;
  RefGptKernels kernels;
  auto make = [&] {
    auto arena = ParamArena::Create({{"w", Shape{4, 3}}, {"b", Shape{3}}}, &backend);
    EXPECT_TRUE(arena.ok());
    return std::move(*arena);
  };
  ParamArena a = make();
  ASSERT_TRUE(a.ParamsFromHost(RandomVector(15, 5)).ok());
  AdamW opt_a(&a, &kernels, AdamWConfig{}, 1e-2f);
  for (int i = 0; i < 2; ++i) {
    const auto g = RandomVector(15, 6 + i);
    backend.CopyFromHost(a.grads().data(), g.data(), g.size() * sizeof(float));
    opt_a.Step();
  }
  const std::string path = ::testing::TempDir() + "adamw_ckpt_" + std::to_string(::getpid());
  ASSERT_TRUE(SaveCheckpoint(path, a, opt_a).ok());
  ParamArena b = make();
  AdamW opt_b(&b, &kernels, AdamWConfig{}, 1e-2f);
  const Status st = LoadCheckpoint(path, &b, &opt_b);
  std::remove(path.c_str());
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(opt_b.step(), 2);
  EXPECT_EQ(b.ParamsToHost(), a.ParamsToHost());
  for (size_t s = 0; s < 2; ++s) {
    std::vector<float> sa(15), sb(15);
    backend.CopyToHost(sa.data(), opt_a.state()[s].data(), 15 * sizeof(float));
    backend.CopyToHost(sb.data(), opt_b.state()[s].data(), 15 * sizeof(float));
    EXPECT_EQ(sa, sb) << "state " << s;
  }
}

}  // namespace
}  // namespace fleet::trainer
