#include "ps/table/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "ps/table/initializer.h"

namespace fleet::ps {
namespace {

// Runs `steps` updates of rule on w0 with gradients grads[step] and returns w.
std::vector<float> ApplySteps(const OptimizerConfig& config, std::vector<float> w,
                       const std::vector<std::vector<float>>& grads) {
  auto rule = MakeOptimizerRule(config);
  std::vector<float> state(rule->state_size(w.size()));
  rule->InitState(w.size(), state);
  for (const auto& g : grads) rule->Update(w, state, g);
  return w;
}

const std::vector<float> kW0 = {0.5f, -1.0f, 2.0f};
const std::vector<std::vector<float>> kGrads = {{0.1f, -0.2f, 0.3f}, {-0.4f, 0.5f, 0.05f}, {0.2f, 0.2f, -0.6f}};

TEST(OptimizerTest, SgdMatchesFormula) {
  OptimizerConfig c;
  c.rule = OptimizerKind::kSgd;
  c.learning_rate = 0.1f;
  std::vector<float> w = ApplySteps(c, kW0, kGrads);
  for (size_t i = 0; i < 3; ++i) {
    double ref = kW0[i];
    for (const auto& g : kGrads) ref -= 0.1 * g[i];
    EXPECT_NEAR(w[i], ref, 1e-6) << i;
  }
}

TEST(OptimizerTest, AdagradMatchesFormula) {
  OptimizerConfig c;
  c.rule = OptimizerKind::kAdagrad;
  c.learning_rate = 0.1f;
  c.initial_g2sum = 0.1f;
  c.epsilon = 1e-8f;
  std::vector<float> w = ApplySteps(c, kW0, kGrads);
  for (size_t i = 0; i < 3; ++i) {
    double ref = kW0[i], g2 = 0.1;
    for (const auto& g : kGrads) {
      g2 += double(g[i]) * g[i];
      ref -= 0.1 * g[i] / (std::sqrt(g2) + 1e-8);
    }
    EXPECT_NEAR(w[i], ref, 1e-5) << i;
  }
}

TEST(OptimizerTest, AdamIsBiasCorrectedPerRow) {
  OptimizerConfig c;
  c.rule = OptimizerKind::kAdam;
  c.learning_rate = 0.01f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.epsilon = 1e-8f;
  std::vector<float> w = ApplySteps(c, kW0, kGrads);
  for (size_t i = 0; i < 3; ++i) {
    double ref = kW0[i], m = 0, v = 0;
    for (size_t t = 1; t <= kGrads.size(); ++t) {
      const double g = kGrads[t - 1][i];
      m = 0.9 * m + 0.1 * g;
      v = 0.999 * v + 0.001 * g * g;
      ref -= 0.01 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
    }
    EXPECT_NEAR(w[i], ref, 1e-5) << i;
  }
  // The first Adam step moves each weight by ~lr whatever the gradient's scale.
  std::vector<float> one = ApplySteps(c, {0.0f}, {{1000.0f}});
  EXPECT_NEAR(one[0], -0.01f, 1e-6);
}

TEST(OptimizerTest, ClipByValueThenL2) {
  OptimizerConfig c;
  c.rule = OptimizerKind::kSgd;
  c.learning_rate = 1.0f;
  c.clip_mode = ClipMode::kValue;
  c.clip_threshold = 0.5f;
  c.l2_decay = 0.1f;
  std::vector<float> w = ApplySteps(c, {1.0f, 1.0f, 1.0f}, {{2.0f, -3.0f, 0.25f}});
  // g = clamp(g, -0.5, 0.5) + 0.1 * w
  EXPECT_FLOAT_EQ(w[0], 1.0f - (0.5f + 0.1f));
  EXPECT_FLOAT_EQ(w[1], 1.0f - (-0.5f + 0.1f));
  EXPECT_FLOAT_EQ(w[2], 1.0f - (0.25f + 0.1f));
}

TEST(OptimizerTest, ClipByNormScalesTheWholeRow) {
  OptimizerConfig c;
  c.rule = OptimizerKind::kSgd;
  c.learning_rate = 1.0f;
  c.clip_mode = ClipMode::kNorm;
  c.clip_threshold = 1.0f;
  std::vector<float> w = ApplySteps(c, {0.0f, 0.0f}, {{3.0f, 4.0f}});  // norm 5 -> scaled by 1/5
  EXPECT_NEAR(w[0], -0.6f, 1e-6);
  EXPECT_NEAR(w[1], -0.8f, 1e-6);
  std::vector<float> small = ApplySteps(c, {0.0f, 0.0f}, {{0.3f, 0.4f}});  // norm 0.5: untouched
  EXPECT_NEAR(small[0], -0.3f, 1e-7);
  EXPECT_NEAR(small[1], -0.4f, 1e-7);
}

// UpdateRows (the sparse table's batched push) gives bit for bit what
// Update row by row gives, for every rule, with and without gradient
// preprocessing, and with a row that appears twice in one batch.
TEST(OptimizerTest, UpdateRowsEqualsUpdateOfEachRowInOrder) {
  constexpr size_t kDim = 3;
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kAdam}) {
    for (bool preprocess : {false, true}) {
      OptimizerConfig c;
      c.rule = kind;
      c.learning_rate = 0.05f;
      if (preprocess) {
        c.clip_mode = ClipMode::kValue;
        c.clip_threshold = 0.25f;
        c.l2_decay = 0.01f;
      }
      auto rule = MakeOptimizerRule(c);
      const size_t width = kDim + rule->state_size(kDim);
      std::vector<float> table(4 * width);
      for (size_t r = 0; r < 4; ++r) {
        for (size_t i = 0; i < kDim; ++i)
          table[r * width + i] = 0.1f * float(r + 1) - 0.07f * float(i);
        rule->InitState(kDim, std::span<float>(table).subspan(r * width + kDim, width - kDim));
      }
      std::vector<float> expected = table;
      const std::vector<size_t> batch_rows = {2, 0, 2, 3};  // row 2 twice
      std::vector<std::vector<float>> grads;
      for (size_t k = 0; k < batch_rows.size(); ++k)
        grads.push_back({0.3f - 0.2f * float(k), -0.1f * float(k), 0.05f + 0.1f * float(k)});
      std::vector<float*> rows;
      std::vector<const float*> row_grads;
      for (size_t k = 0; k < batch_rows.size(); ++k) {
        float* e = expected.data() + batch_rows[k] * width;
        rule->Update({e, kDim}, {e + kDim, width - kDim}, grads[k]);
        rows.push_back(table.data() + batch_rows[k] * width);
        row_grads.push_back(grads[k].data());
      }
      rule->UpdateRows(rows, row_grads, kDim);
      EXPECT_EQ(table, expected) << "rule " << static_cast<int>(kind) << ", preprocess "
                                 << preprocess;
    }
  }
}

TEST(InitializerTest, DeterministicPerKeyAndInRange) {
  InitializerConfig c;
  c.kind = InitializerKind::kUniform;
  c.range = 0.5f;
  c.seed = 42;
  Initializer init(c);
  std::vector<float> a(16), b(16), other(16);
  init.Fill(12345, 0, a);
  init.Fill(12345, 0, b);
  init.Fill(12346, 0, other);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  for (float v : a) {
    EXPECT_GE(v, -0.5f);
    EXPECT_LT(v, 0.5f);
  }
  c.kind = InitializerKind::kGaussian;
  c.stddev = 2.0f;
  Initializer gauss(c);
  std::vector<float> many(20000);
  gauss.Fill(7, 0, many);
  double sum = 0, sq = 0;
  for (float v : many) {
    sum += v;
    sq += double(v) * v;
  }
  const double mean = sum / many.size();
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(sq / many.size() - mean * mean), 2.0, 0.05);
}

}  // namespace
}  // namespace fleet::ps
