// DynamicLossScaler on the CPU twin with fake gradients: a clean step applies
// and unscales exactly, an inf or NaN gradient skips the step and halves the
// scale, a clean run doubles it, the scale stays in its bounds, and the
// config and Restore reject bad values naming them.
#include "collective/loss_scaler.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/gpt_cpu_kernels.h"

namespace fleet::trainer {
namespace {

using testing::RandomVector;

DynamicLossScaler MakeScaler(const LossScalerConfig& config) {
  auto scaler = DynamicLossScaler::Create(config);
  EXPECT_TRUE(scaler.ok()) << scaler.status().ToString();
  return std::move(scaler).value();
}

// Gradients of a loss multiplied by `scale`: the true ones times scale.
std::vector<float> Scaled(const std::vector<float>& g, float scale) {
  std::vector<float> out(g);
  for (float& x : out) x *= scale;
  return out;
}

double SumSq(const std::vector<float>& g) {
  double s = 0.0;
  for (float x : g) s += double{x} * x;
  return s;
}

TEST(DynamicLossScaler, DefaultsArePaddles) {
  const LossScalerConfig c;
  EXPECT_EQ(c.init_scale, 32768.0);
  EXPECT_EQ(c.incr_every_n_steps, 1000);
  EXPECT_EQ(c.incr_ratio, 2.0);
  EXPECT_EQ(c.decr_ratio, 0.5);
  EXPECT_TRUE(c.Validate().ok());
}

// The skip / apply decision drives a real AdamW update on the CPU twin: an
// overflowing step leaves parameters and moments untouched, a clean step
// equals the update with the unscaled gradients bit for bit (the scales are
// powers of two, so scaling and unscaling is exact).
TEST(DynamicLossScaler, OverflowSkipsTheStepAndCleanStepsUnscaleExactly) {
  CpuGptKernels kernels(nullptr);
  LossScalerConfig config;
  config.init_scale = 1024.0;
  config.incr_every_n_steps = 1000;
  DynamicLossScaler scaler = MakeScaler(config);
  const size_t n = 3000;
  const std::vector<float> grad = RandomVector(n, 1, -1e-3f, 1e-3f);
  std::vector<float> p = RandomVector(n, 2), m(n), v(n);
  std::vector<float> p_ref = p, m_ref(n), v_ref(n);
  AdamWStep step{.lr = 1e-2f, .weight_decay = 0.1f};

  // Step 1 overflows (one inf among the gradients): skipped, scale halves.
  std::vector<float> bad = Scaled(grad, scaler.scale());
  bad[1234] = std::numeric_limits<float>::infinity();
  const std::vector<float> p_before = p;
  LossScaleDecision d = scaler.Check(&kernels, bad.data(), n);
  EXPECT_FALSE(d.apply);
  EXPECT_FALSE(std::isfinite(d.grad_sum_of_squares));
  if (d.apply) kernels.AdamWUpdate(p.data(), bad.data(), m.data(), v.data(), n, step);
  EXPECT_EQ(p, p_before);
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_EQ(scaler.clean_steps(), 0);

  // A NaN also overflows.
  bad = Scaled(grad, scaler.scale());
  bad[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(scaler.Check(&kernels, bad.data(), n).apply);
  EXPECT_EQ(scaler.scale(), 256.0f);

  // Step 3 is clean: applied with inv_scale 1/256, equal to the unscaled update.
  const std::vector<float> good = Scaled(grad, scaler.scale());
  d = scaler.Check(&kernels, good.data(), n);
  ASSERT_TRUE(d.apply);
  EXPECT_EQ(d.inv_scale, 1.0f / 256.0f);
  EXPECT_NEAR(d.grad_sum_of_squares, SumSq(grad), 1e-6 * SumSq(grad));
  AdamWStep scaled_step = step;
  scaled_step.grad_scale = d.inv_scale;
  kernels.AdamWUpdate(p.data(), good.data(), m.data(), v.data(), n, scaled_step);
  kernels.AdamWUpdate(p_ref.data(), grad.data(), m_ref.data(), v_ref.data(), n, step);
  EXPECT_EQ(p, p_ref);
  EXPECT_EQ(m, m_ref);
  EXPECT_EQ(v, v_ref);
  EXPECT_EQ(scaler.scale(), 256.0f);  // one clean step of 1000
  EXPECT_EQ(scaler.clean_steps(), 1);
}

TEST(DynamicLossScaler, DoublesAfterNCleanStepsAndAnOverflowRestartsTheCount) {
  CpuGptKernels kernels(nullptr);
  LossScalerConfig config;
  config.init_scale = 8.0;
  config.incr_every_n_steps = 3;
  DynamicLossScaler scaler = MakeScaler(config);
  const std::vector<float> g = RandomVector(100, 3);
  std::vector<float> bad = g;
  bad[7] = -std::numeric_limits<float>::infinity();
  // Expected scale after each step: clean, clean, inf (halve, count reset),
  // clean x3 (double), clean x3 (double).
  const std::vector<std::pair<bool, float>> script = {
      {true, 8}, {true, 8}, {false, 4}, {true, 4}, {true, 4}, {true, 8},
      {true, 8}, {true, 8}, {true, 16}};
  for (size_t i = 0; i < script.size(); ++i) {
    const auto& [clean, want] = script[i];
    const float used = scaler.scale();
    const LossScaleDecision d = scaler.Check(&kernels, (clean ? g : bad).data(), g.size());
    EXPECT_EQ(d.apply, clean) << "step " << i;
    EXPECT_EQ(d.inv_scale, 1.0f / used) << "step " << i;
    EXPECT_EQ(scaler.scale(), want) << "step " << i;
  }
}

// Paddle's decr_every_n_nan_or_inf / DeepSpeed's hysteresis: the scale
// shrinks at the second overflow in a row, a clean step restarts the count;
// a static scale (DeepSpeed's loss_scale > 0) never moves but still skips.
TEST(DynamicLossScaler, HysteresisAndStaticScales) {
  LossScalerConfig config;
  config.init_scale = 64.0;
  config.incr_every_n_steps = 2;
  config.decr_every_n_overflows = 2;
  DynamicLossScaler scaler = MakeScaler(config);
  const std::vector<std::pair<double, float>> script = {{INFINITY, 64}, {1.0, 64}, {INFINITY, 64},
                                                        {NAN, 32},      {1.0, 32}, {1.0, 64}};
  for (size_t i = 0; i < script.size(); ++i) {
    const LossScaleDecision d = scaler.Update(script[i].first);
    EXPECT_EQ(d.apply, std::isfinite(script[i].first)) << "step " << i;
    EXPECT_EQ(scaler.scale(), script[i].second) << "step " << i;
  }
  config.dynamic = false;
  DynamicLossScaler fixed = MakeScaler(config);
  for (double sum : {double{INFINITY}, double{INFINITY}, 1.0, 1.0, 1.0}) fixed.Update(sum);
  EXPECT_FALSE(fixed.Update(INFINITY).apply);
  EXPECT_EQ(fixed.scale(), 64.0f);
}

TEST(DynamicLossScaler, StaysWithinItsBounds) {
  LossScalerConfig config;
  config.init_scale = 4.0;
  config.min_scale = 1.0;
  config.max_scale = 16.0;
  config.incr_every_n_steps = 1;
  DynamicLossScaler scaler = MakeScaler(config);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(scaler.Update(INFINITY).apply);
  EXPECT_EQ(scaler.scale(), 1.0f);  // 4 -> 2 -> 1, then held at min_scale
  EXPECT_FALSE(scaler.Update(NAN).apply);  // still skipped at the floor
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(scaler.Update(1.0).apply);
  EXPECT_EQ(scaler.scale(), 16.0f);  // 1 -> 16, then held at max_scale
  const LossScaleDecision d = scaler.Update(256.0);
  EXPECT_EQ(d.grad_sum_of_squares, 1.0);  // 256 / 16^2
}

TEST(DynamicLossScaler, RejectsBadConfigsAndRestoresNamingTheProblem) {
  auto bad = [](auto edit) {
    LossScalerConfig c;
    edit(c);
    return DynamicLossScaler::Create(c).status();
  };
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.init_scale = 0.5; }),
                                               "scale_loss"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.init_scale = NAN; }),
                                               "init_scale"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.incr_every_n_steps = 0; }),
                                               "incr_every_n_steps"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.decr_every_n_overflows = 0; }),
                                               "decr_every_n_overflows"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.incr_ratio = 1.0; }),
                                               "incr_ratio"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.decr_ratio = 1.0; }),
                                               "decr_ratio"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.min_scale = 0.0; }),
                                               "min_scale"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(bad([](auto& c) { c.max_scale = 0.5; }),
                                               "max_scale"));

  DynamicLossScaler scaler = MakeScaler(LossScalerConfig{});
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(scaler.Restore(1e30, 0), "loss scale"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(scaler.Restore(1024, -1), "clean step"));
  EXPECT_EQ(scaler.scale(), 32768.0f);  // unchanged
  ASSERT_TRUE(scaler.Restore(1024, 999).ok());
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.Update(0.0).apply);  // the 1000th clean step
  EXPECT_EQ(scaler.scale(), 2048.0f);
}

}  // namespace
}  // namespace fleet::trainer
