// Finite-difference gradient check of every layer.
//
// Each check perturbs one input element by +-eps (float, eps = 1e-3) and
// evaluates a scalar objective accumulated in double: the loss itself for
// loss layers, else sum_i out_i * R_i for a fixed random R (so the analytic
// input gradient is Backward(dy = R)). Central differences then carry only
// O(eps^2) truncation and float rounding of the outputs, well inside
// abs 1e-3 + rel 1e-2. ReLU inputs are kept away from its kink.
//
// Each check also verifies that Backward ADDS: gradients start at 0.25, and
// the analytic gradient is what was added.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/layers/layers.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

constexpr float kEps = 1e-3f;
constexpr float kPrefill = 0.25f;

// Numeric d(objective)/d(x[i]) for every i.
std::vector<float> NumericGrad(float* x, size_t n, const std::function<double()>& objective) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    const float saved = x[i];
    x[i] = saved + kEps;
    const double up = objective();
    x[i] = saved - kEps;
    const double down = objective();
    x[i] = saved;
    g[i] = static_cast<float>((up - down) / (2.0 * double{kEps}));
  }
  return g;
}

// `added` is a gradient buffer that started at kPrefill before Backward.
::testing::AssertionResult CheckGrad(const std::string& name, float* x, size_t n,
                                     std::span<const float> added,
                                     const std::function<double()>& objective) {
  std::vector<float> analytic(added.begin(), added.end());
  for (float& v : analytic) v -= kPrefill;
  return AllClose(name, analytic, NumericGrad(x, n, objective), 1e-3, 1e-2);
}

double Dot(const Tensor& t, const std::vector<float>& r) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += double{t[i]} * r[i];
  return s;
}

std::vector<float> Prefilled(size_t n) { return std::vector<float>(n, kPrefill); }

// Batch rows and output features of a Linear layer under test; {1, 1} is a
// batch of one sample into a one-logit head (its scratch once went unallocated).
struct LinearShape {
  int batch;
  int out;
};

// Linear with each fused activation; dx either added (prefilled at 0.25) or
// overwritten (prefilled with garbage that must not survive).
class LinearGradCheck
    : public ::testing::TestWithParam<std::tuple<kernels::Activation, GradMode, LinearShape>> {};

TEST_P(LinearGradCheck, MatchesFiniteDifferences) {
  const auto [act, dx_mode, shape] = GetParam();
  CpuBackend backend;
  const int B = shape.batch, in = 5, out = shape.out;
  ParamTable table;
  AddLinearParams(&table, "fc", in, out);
  auto arena = ParamArena::Create(table, &backend);
  ASSERT_TRUE(arena.ok());
  ASSERT_TRUE(arena->ParamsFromHost(RandomVector(arena->size(), 1)).ok());
  Linear layer(*arena, "fc", act);

  auto x = RandomVector(B * in, 2);
  const auto r = RandomVector(B * out, 3);
  std::vector<float> y(B * out);
  Tensor xt(x.data(), Shape{B, in}), yt(y.data(), Shape{B, out});
  const auto objective = [&] {
    layer.Forward(xt, &yt);
    return Dot(yt, r);
  };
  {
    // Every pre-activation stays away from ReLU's kink (|z| >= 0.05), so
    // +-eps never crosses it.
    Linear plain(*arena, "fc");
    std::vector<float> z(B * out);
    Tensor zt(z.data(), Shape{B, out});
    plain.Forward(xt, &zt);
    ASSERT_TRUE(std::all_of(z.begin(), z.end(), [](float v) { return std::fabs(v) >= 0.05f; }));
  }

  backend.Fill(arena->grads().data(), arena->size(), kPrefill);
  const bool add = dx_mode == GradMode::kAdd;
  std::vector<float> dx(B * in, add ? kPrefill : 1e6f);
  Tensor dxt(dx.data(), Shape{B, in});
  std::vector<float> rr = r;
  objective();
  layer.Backward(Tensor(rr.data(), Shape{B, out}), &dxt, dx_mode);
  if (!add) {
    for (float& v : dx) v += kPrefill;  // CheckGrad subtracts the prefill
  }

  EXPECT_TRUE(CheckGrad("dx", x.data(), x.size(), dx, objective));
  const Tensor w = arena->param("fc.weight"), b = arena->param("fc.bias");
  const Tensor dw = arena->grad("fc.weight"), db = arena->grad("fc.bias");
  EXPECT_TRUE(CheckGrad("dW", w.data(), w.numel(), {dw.data(), size_t(dw.numel())}, objective));
  EXPECT_TRUE(CheckGrad("db", b.data(), b.numel(), {db.data(), size_t(db.numel())}, objective));
}

INSTANTIATE_TEST_SUITE_P(
    Activations, LinearGradCheck,
    ::testing::Combine(::testing::Values(kernels::Activation::kNone, kernels::Activation::kTanh,
                                         kernels::Activation::kRelu),
                       ::testing::Values(GradMode::kAdd, GradMode::kOverwrite),
                       ::testing::Values(LinearShape{3, 4}, LinearShape{1, 1})));

// Activations: forward(x) -> y, backward(dy) adds into dx.
template <typename Layer>
void CheckActivation(const std::string& name, Layer& layer, std::vector<float> x) {
  const int B = 3;
  const int W = static_cast<int>(x.size()) / B;
  const auto r = RandomVector(x.size(), 7);
  std::vector<float> y(x.size());
  Tensor xt(x.data(), Shape{B, W}), yt(y.data(), Shape{B, W});
  const auto objective = [&] {
    layer.Forward(xt, &yt);
    return Dot(yt, r);
  };
  objective();
  auto dx = Prefilled(x.size());
  std::vector<float> rr = r;
  Tensor dxt(dx.data(), Shape{B, W});
  layer.Backward(Tensor(rr.data(), Shape{B, W}), &dxt);
  EXPECT_TRUE(CheckGrad(name + " dx", x.data(), x.size(), dx, objective));
}

TEST(GradCheck, Tanh) {
  CpuBackend backend;
  Tanh layer(&backend);
  CheckActivation("tanh", layer, RandomVector(21, 4, -2, 2));
}

TEST(GradCheck, Relu) {
  Relu layer;
  auto x = RandomVector(21, 5, -2, 2);
  for (float& v : x) v += v >= 0 ? 0.1f : -0.1f;  // away from the kink
  CheckActivation("relu", layer, x);
}

TEST(GradCheck, Sigmoid) {
  Sigmoid layer;
  CheckActivation("sigmoid", layer, RandomVector(21, 6, -4, 4));
}

// Batches of 4 samples and of one sample (whose loss scratch once went
// unallocated and was written through null).
class SoftmaxCrossEntropyGradCheck : public ::testing::TestWithParam<int> {};

TEST_P(SoftmaxCrossEntropyGradCheck, MatchesFiniteDifferences) {
  CpuBackend backend;
  SoftmaxCrossEntropy layer(&backend);
  const int B = GetParam(), C = 6;
  auto logits = RandomVector(B * C, 8, -3, 3);
  const std::vector<int32_t> labels = {0, 5, 2, 2};  // the first B are used
  std::vector<float> probs(B * C);
  Tensor lt(logits.data(), Shape{B, C}), pt(probs.data(), Shape{B, C});
  const auto objective = [&] { return double{layer.Forward(lt, labels.data(), &pt)}; };
  objective();
  auto d = Prefilled(B * C);
  Tensor dt(d.data(), Shape{B, C});
  layer.Backward(1.0f, &dt);
  EXPECT_TRUE(CheckGrad("dlogits", logits.data(), logits.size(), d, objective));
}

INSTANTIATE_TEST_SUITE_P(Batches, SoftmaxCrossEntropyGradCheck, ::testing::Values(4, 1));

// Batches of 6 samples and of one sample (SigmoidBceForward once got a null
// row_loss for n = 1: `-o train.batch_size=1` crashed every CTR worker).
class SigmoidBceGradCheck : public ::testing::TestWithParam<int> {};

TEST_P(SigmoidBceGradCheck, MatchesFiniteDifferences) {
  CpuBackend backend;
  SigmoidBce layer(&backend);
  const int B = GetParam();
  auto logits = RandomVector(B, 9, -4, 4);
  // Soft labels allowed; the first B are used.
  const std::vector<float> targets = {0, 1, 1, 0, 0.3f, 1};
  std::vector<float> probs(B);
  Tensor lt(logits.data(), Shape{B, 1}), pt(probs.data(), Shape{B, 1});
  const auto objective = [&] { return double{layer.Forward(lt, targets.data(), &pt)}; };
  objective();
  auto d = Prefilled(B);
  Tensor dt(d.data(), Shape{B, 1});
  layer.Backward(1.0f, &dt);
  EXPECT_TRUE(CheckGrad("dlogits", logits.data(), logits.size(), d, objective));
}

INSTANTIATE_TEST_SUITE_P(Batches, SigmoidBceGradCheck, ::testing::Values(6, 1));

TEST(GradCheck, EmbeddingBag) {
  const int D = 3, num_rows = 8;
  const std::vector<int64_t> offsets = {0, 2, 2, 7};  // bag 1 empty, row 7 unused
  const int B = 3;
  for (auto mode : {kernels::PoolMode::kSum, kernels::PoolMode::kMean}) {
    const std::string name = mode == kernels::PoolMode::kSum ? "sum" : "mean";
    EmbeddingBag layer(mode);
    auto rows = RandomVector(num_rows * D, 10);
    const auto r = RandomVector(B * D, 11);
    std::vector<float> out(B * D);
    Tensor rt(rows.data(), Shape{num_rows, D}), ot(out.data(), Shape{B, D});
    const auto objective = [&] {
      EXPECT_TRUE(layer.Forward(rt, offsets, &ot).ok());
      return Dot(ot, r);
    };
    objective();
    auto drows = Prefilled(num_rows * D);
    std::vector<float> rr = r;
    Tensor dt(drows.data(), Shape{num_rows, D});
    layer.Backward(Tensor(rr.data(), Shape{B, D}), &dt);
    EXPECT_TRUE(CheckGrad(name + " drows", rows.data(), rows.size(), drows, objective));
  }
}

TEST(EmbeddingBagTest, RejectsBadOffsets) {
  EmbeddingBag layer(kernels::PoolMode::kSum);
  std::vector<float> rows(4 * 2), out(2 * 2, 7.0f);
  Tensor rt(rows.data(), Shape{4, 2}), ot(out.data(), Shape{2, 2});
  const std::vector<std::vector<int64_t>> bad = {{}, {1, 2, 3}, {0, 3, 2}, {0, 2, 5}};
  for (const auto& offsets : bad) {
    Status st = layer.Forward(rt, offsets, &ot);
    EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  }
  EXPECT_EQ(out, std::vector<float>(4, 7.0f));  // untouched
}

TEST(GradCheck, Concat) {
  CpuBackend backend;
  Concat layer(&backend);
  const int B = 3;
  const std::vector<int> widths = {2, 4, 1};
  std::vector<std::vector<float>> ins;
  for (size_t i = 0; i < widths.size(); ++i) ins.push_back(RandomVector(B * widths[i], 12 + i));
  const auto r = RandomVector(B * 7, 20);
  std::vector<float> out(B * 7);
  Tensor ot(out.data(), Shape{B, 7});
  const auto objective = [&] {
    std::vector<Tensor> ts;
    for (size_t i = 0; i < ins.size(); ++i) ts.emplace_back(ins[i].data(), Shape{B, widths[i]});
    layer.Forward(ts, &ot);
    return Dot(ot, r);
  };
  objective();
  std::vector<std::vector<float>> d;
  std::vector<Tensor> dts;
  for (int w : widths) d.push_back(Prefilled(B * w));
  for (size_t i = 0; i < widths.size(); ++i) dts.emplace_back(d[i].data(), Shape{B, widths[i]});
  std::vector<Tensor*> dptrs = {&dts[0], &dts[1], &dts[2]};
  std::vector<float> rr = r;
  layer.Backward(Tensor(rr.data(), Shape{B, 7}), dptrs);
  for (size_t i = 0; i < ins.size(); ++i) {
    EXPECT_TRUE(CheckGrad("dins[" + std::to_string(i) + "]", ins[i].data(), ins[i].size(), d[i],
                          objective));
  }
}

// The CTR interactions over rows of F fields of P floats plus 2 other
// features: each field's float 0 is a first-order weight, floats 1.. its
// embedding. Both sums add into an output that holds something already.
struct CtrRows {
  static constexpr int B = 3, F = 4, P = 3, kOther = 2, kRow = F * P + kOther;
  FieldLayout layout{F, P, kRow};
};

TEST(GradCheck, FieldSum) {
  CpuBackend backend;
  CtrRows c;
  for (const auto& [offset, width] : {std::pair{0, 1}, std::pair{1, 2}}) {
    FieldSum layer(&backend, c.layout, offset, width);
    auto x = RandomVector(c.B * c.kRow, 30 + offset);
    const auto r = RandomVector(c.B * width, 31);
    const auto base = RandomVector(c.B * width, 32);
    std::vector<float> out;
    Tensor xt(x.data(), Shape{c.B, c.kRow});
    const auto objective = [&] {
      out = base;
      Tensor ot(out.data(), Shape{c.B, width});
      layer.Forward(xt, &ot, /*beta=*/1.0f);
      return Dot(ot, r);
    };
    objective();
    // beta 1 keeps what was there: the sum is out - base.
    std::vector<float> alone(c.B * width);
    Tensor at(alone.data(), Shape{c.B, width});
    layer.Forward(xt, &at, /*beta=*/0.0f);
    for (size_t i = 0; i < alone.size(); ++i) EXPECT_FLOAT_EQ(out[i] - base[i], alone[i]);
    auto dx = Prefilled(x.size());
    Tensor dxt(dx.data(), Shape{c.B, c.kRow});
    std::vector<float> rr = r;
    layer.Backward(Tensor(rr.data(), Shape{c.B, width}), &dxt);
    EXPECT_TRUE(CheckGrad("field sum dx", x.data(), x.size(), dx, objective));
  }
}

TEST(GradCheck, FmInteraction) {
  CpuBackend backend;
  CtrRows c;
  FmInteraction layer(&backend, c.layout, /*offset=*/1, /*dim=*/c.P - 1);
  auto x = RandomVector(c.B * c.kRow, 40);
  const auto r = RandomVector(c.B, 41);
  const auto base = RandomVector(c.B, 42);
  std::vector<float> out;
  Tensor xt(x.data(), Shape{c.B, c.kRow});
  const auto objective = [&] {
    out = base;
    Tensor ot(out.data(), Shape{c.B});
    layer.Forward(xt, &ot, /*beta=*/1.0f);
    return Dot(ot, r);
  };
  objective();
  // The pairwise sum it stands for, directly.
  for (int b = 0; b < c.B; ++b) {
    double pairs = 0;
    for (int f = 0; f < c.F; ++f)
      for (int g = f + 1; g < c.F; ++g)
        for (int d = 1; d < c.P; ++d)
          pairs += double{x[b * c.kRow + f * c.P + d]} * x[b * c.kRow + g * c.P + d];
    EXPECT_NEAR(out[b] - base[b], pairs, 1e-5) << "sample " << b;
  }
  auto dx = Prefilled(x.size());
  Tensor dxt(dx.data(), Shape{c.B, c.kRow});
  std::vector<float> rr = r;
  layer.Backward(Tensor(rr.data(), Shape{c.B}), &dxt);
  EXPECT_TRUE(CheckGrad("fm dx", x.data(), x.size(), dx, objective));
  // Floats outside the embeddings get nothing.
  for (int b = 0; b < c.B; ++b) {
    for (int f = 0; f < c.F; ++f) EXPECT_EQ(dx[b * c.kRow + f * c.P], kPrefill);
    EXPECT_EQ(dx[b * c.kRow + c.F * c.P], kPrefill);
  }
}

// A cross layer fed x0 and another xl, and the first layer (xl = x0, both
// gradients into one buffer).
TEST(GradCheck, CrossLayer) {
  CpuBackend backend;
  const int B = 3, in = 5;
  ParamTable table;
  AddLinearParams(&table, "cross1", in, in);
  auto arena = ParamArena::Create(table, &backend);
  ASSERT_TRUE(arena.ok());
  ASSERT_TRUE(arena->ParamsFromHost(RandomVector(arena->size(), 50)).ok());
  CrossLayer layer(*arena, "cross1");
  for (bool first : {false, true}) {
    SCOPED_TRACE(first ? "first layer" : "later layer");
    auto x0 = RandomVector(B * in, 51);
    auto xl = first ? x0 : RandomVector(B * in, 52);
    const auto r = RandomVector(B * in, 53);
    std::vector<float> y(B * in);
    Tensor yt(y.data(), Shape{B, in});
    const auto objective = [&] {
      if (first) xl = x0;
      layer.Forward(Tensor(x0.data(), Shape{B, in}), Tensor(xl.data(), Shape{B, in}), &yt);
      return Dot(yt, r);
    };
    objective();
    backend.Fill(arena->grads().data(), arena->size(), kPrefill);
    auto dx0 = Prefilled(x0.size());
    auto dxl = Prefilled(xl.size());
    Tensor dx0t(dx0.data(), Shape{B, in}), dxlt(dxl.data(), Shape{B, in});
    std::vector<float> rr = r;
    layer.Backward(Tensor(rr.data(), Shape{B, in}), &dx0t, first ? &dx0t : &dxlt);
    EXPECT_TRUE(CheckGrad("cross dx0", x0.data(), x0.size(), dx0, objective));
    if (!first) {
      EXPECT_TRUE(CheckGrad("cross dxl", xl.data(), xl.size(), dxl, objective));
    }
    const Tensor w = arena->param("cross1.weight"), b = arena->param("cross1.bias");
    const Tensor dw = arena->grad("cross1.weight"), db = arena->grad("cross1.bias");
    EXPECT_TRUE(
        CheckGrad("cross dW", w.data(), w.numel(), {dw.data(), size_t(dw.numel())}, objective));
    EXPECT_TRUE(
        CheckGrad("cross db", b.data(), b.numel(), {db.data(), size_t(db.numel())}, objective));
  }
}

}  // namespace
}  // namespace fleet::trainer
