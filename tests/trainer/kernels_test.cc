// Optimised kernels against their oracles: BLAS GEMM vs the triple loop over
// shapes that include 1, odd sizes and every transpose; pool-parallel
// element-wise kernels vs the serial path; and the numerically delicate
// losses at extreme inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_kernels.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

class GemmTest : public ::testing::TestWithParam<std::tuple<int, int, int, bool, bool>> {};

TEST_P(GemmTest, BlasMatchesNaive) {
  const auto [M, N, K, ta, tb] = GetParam();
  const auto A = RandomVector(size_t(M) * K, 1);
  const auto B = RandomVector(size_t(K) * N, 2);
  const auto C0 = RandomVector(size_t(M) * N, 3);
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    std::vector<float> blas = C0, naive = C0;
    kernels::GemmBlas(ta, tb, M, N, K, 0.75f, A.data(), B.data(), beta, blas.data());
    kernels::GemmNaive(ta, tb, M, N, K, 0.75f, A.data(), B.data(), beta, naive.data());
    EXPECT_TRUE(AllClose("C beta=" + std::to_string(beta), blas, naive, 1e-5, 1e-5));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTest,
                         ::testing::Combine(::testing::Values(1, 7, 64),
                                            ::testing::Values(1, 10, 33),
                                            ::testing::Values(1, 5, 129), ::testing::Bool(),
                                            ::testing::Bool()));

// OpenBLAS runs kernels that use this CPU's vector units: on a CPU the
// library does not know it falls back to SSE3 ones ~4x slower, and
// blas_core.cc then restarts the program with better ones. A core the user
// chose through OPENBLAS_CORETYPE is theirs.
TEST(GemmTest, BlasKernelsUseTheCpusVectorUnits) {
  const char* chosen = std::getenv("OPENBLAS_CORETYPE");
  const std::string core = kernels::BlasKernels();
  const char* best = kernels::BlasKernelsForThisCpu();
  if (best == nullptr) GTEST_SKIP() << "no AVX2 here: OpenBLAS's " << core << " kernels are what it has";
  if (chosen != nullptr && std::string(chosen) != best)
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << chosen << " chose the kernels";
  if (std::string(best) == "SkylakeX") {
    EXPECT_TRUE(core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids") << core;
  } else {
    EXPECT_TRUE(core == "Haswell" || core == "Zen" || core == "SkylakeX" || core == "Cooperlake" ||
                core == "SapphireRapids" || core == "Excavator")
        << core;
  }
}

TEST(GemmTest, ZeroInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4}, c2 = c;
  kernels::GemmBlas(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 0.5f, c.data());
  kernels::GemmNaive(false, false, 2, 2, 0, 1.0f, nullptr, nullptr, 0.5f, c2.data());
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  EXPECT_EQ(c2, c);
}

// Every element-wise kernel gives the same bits on 2 threads as on one, for
// sizes below, at and well above the parallel grain.
TEST(ParallelKernelsTest, PoolMatchesSerial) {
  ThreadPool pool(1);
  for (size_t n : {size_t{1}, size_t{1000}, 2 * kernels::kParallelGrain + 7, size_t{100003}}) {
    const auto x = RandomVector(n, 11, -3, 3);
    const auto dy = RandomVector(n, 12);
    const auto g = RandomVector(n, 13);
    using Fwd = void (*)(float*, const float*, size_t, ThreadPool*);
    using Bwd = void (*)(float*, const float*, const float*, size_t, ThreadPool*);
    const std::vector<std::tuple<const char*, Fwd, Bwd>> acts = {
        {"tanh", kernels::TanhForward, kernels::TanhBackward},
        {"relu", kernels::ReluForward, kernels::ReluBackward},
        {"sigmoid", kernels::SigmoidForward, kernels::SigmoidBackward}};
    for (const auto& [name, fwd, bwd] : acts) {
      std::vector<float> y1(n), y2(n), dx1(n, 0.5f), dx2(n, 0.5f);
      fwd(y1.data(), x.data(), n, nullptr);
      fwd(y2.data(), x.data(), n, &pool);
      EXPECT_TRUE(AllClose(std::string(name) + " fwd", y2, y1, 0, 0));
      bwd(dx1.data(), y1.data(), dy.data(), n, nullptr);
      bwd(dx2.data(), y1.data(), dy.data(), n, &pool);
      EXPECT_TRUE(AllClose(std::string(name) + " bwd", dx2, dx1, 0, 0));
    }
    std::vector<float> p1 = x, p2 = x, m1(n), m2(n), v1(n), v2(n);
    for (int t = 1; t <= 2; ++t) {
      kernels::AdamUpdate(p1.data(), m1.data(), v1.data(), g.data(), n, {}, t, nullptr);
      kernels::AdamUpdate(p2.data(), m2.data(), v2.data(), g.data(), n, {}, t, &pool);
    }
    EXPECT_TRUE(AllClose("adam", p2, p1, 0, 0));
  }
  // Softmax-CE splits by rows.
  const int B = 2000, C = 37;
  const auto logits = RandomVector(size_t(B) * C, 14, -5, 5);
  std::vector<int32_t> labels(B);
  for (int b = 0; b < B; ++b) labels[b] = (b * 7) % C;
  std::vector<float> p1(B * C), p2(B * C), l1(B), l2(B), d1(B * C), d2(B * C);
  kernels::SoftmaxCrossEntropyForward(p1.data(), l1.data(), logits.data(), labels.data(), B, C,
                                      nullptr);
  kernels::SoftmaxCrossEntropyForward(p2.data(), l2.data(), logits.data(), labels.data(), B, C,
                                      &pool);
  EXPECT_TRUE(AllClose("softmax probs", p2, p1, 0, 0));
  EXPECT_TRUE(AllClose("softmax loss", l2, l1, 0, 0));
  kernels::SoftmaxCrossEntropyBackward(d1.data(), p1.data(), labels.data(), B, C, 0.1f, nullptr);
  kernels::SoftmaxCrossEntropyBackward(d2.data(), p1.data(), labels.data(), B, C, 0.1f, &pool);
  EXPECT_TRUE(AllClose("softmax dlogits", d2, d1, 0, 0));
}

TEST(LossKernelsTest, StableAtExtremeLogits) {
  const std::vector<float> logits = {-1000.0f, -30.0f, 0.0f, 30.0f, 1000.0f};
  const std::vector<float> targets = {1.0f, 0.0f, 1.0f, 1.0f, 0.0f};
  std::vector<float> probs(5), loss(5);
  kernels::SigmoidBceForward(probs.data(), loss.data(), logits.data(), targets.data(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(std::isfinite(loss[i])) << i;
    EXPECT_TRUE(probs[i] >= 0.0f && probs[i] <= 1.0f) << i;
  }
  EXPECT_NEAR(loss[0], 1000.0f, 1e-3);  // confidently wrong: loss = |x|
  EXPECT_NEAR(loss[2], std::log(2.0f), 1e-6);
  EXPECT_NEAR(loss[4], 1000.0f, 1e-3);

  // A label whose probability underflows still has a finite, exact loss.
  const std::vector<float> big = {0.0f, 200.0f, -200.0f};
  const int32_t label = 2;
  std::vector<float> p(3);
  float l = 0;
  kernels::SoftmaxCrossEntropyForward(p.data(), &l, big.data(), &label, 1, 3, nullptr);
  EXPECT_NEAR(l, 400.0f, 1e-3);
}

TEST(EmbeddingBagKernelTest, PointerAndBufferFormsAgree) {
  const int D = 5, num_rows = 7;
  const auto rows = RandomVector(size_t(num_rows) * D, 21);
  const std::vector<int64_t> offsets = {0, 3, 3, 7};  // the middle bag is empty
  std::vector<const float*> ptrs;
  for (int r = 0; r < num_rows; ++r) ptrs.push_back(rows.data() + r * D);
  for (auto mode : {kernels::PoolMode::kSum, kernels::PoolMode::kMean}) {
    std::vector<float> a(3 * D), b(3 * D);
    kernels::EmbeddingBagForward(a.data(), rows.data(), offsets.data(), 3, D, mode);
    kernels::EmbeddingBagForwardPtr(b.data(), ptrs.data(), offsets.data(), 3, D, mode);
    EXPECT_TRUE(AllClose("pooled", a, b, 0, 0));
    for (int d = 0; d < D; ++d) EXPECT_EQ(a[D + d], 0.0f);  // empty bag
  }
}

// The vectorised tanh against double-precision tanh: within 3 ulp on a
// dense grid over [-20, 20] (both branches of its formula and the clamp),
// exact at 0 and +/-inf, NaN for NaN.
TEST(ActivationKernelsTest, TanhWithinThreeUlpOfDouble) {
  std::vector<float> x;
  for (double v = -20.0; v <= 20.0; v += 3e-4) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-38f, 0.3f, -0.3f, 9.0f, 9.5f}) x.push_back(v);
  std::vector<float> y(x.size());
  kernels::TanhForward(y.data(), x.data(), x.size(), nullptr);
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(std::tanh(double{x[i]}));
    const float ulp = std::nextafter(std::fabs(want), 2.0f) - std::fabs(want);
    const double err = std::fabs(double{y[i]} - std::tanh(double{x[i]})) /
                       (ulp > 0 ? ulp : std::numeric_limits<float>::denorm_min());
    if (err > worst) worst = err, worst_x = x[i];
  }
  EXPECT_LE(worst, 3.0) << "at x = " << worst_x;
  const std::vector<float> special = {std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity(), std::nanf("")};
  std::vector<float> out(3);
  kernels::TanhForward(out.data(), special.data(), 3, nullptr);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_TRUE(std::isnan(out[2]));
}

// The fused bias + activation kernels against their unfused oracle (bias
// add, then the element-wise activation; bias gradient, then the
// activation's backward), bit for bit.
TEST(ActivationKernelsTest, FusedBiasActivationMatchesUnfused) {
  const int rows = 33, cols = 70;
  const size_t n = size_t(rows) * cols;
  const auto x = RandomVector(n, 31, -3, 3);
  const auto bias = RandomVector(cols, 32);
  const auto dy = RandomVector(n, 33);
  using Fwd = void (*)(float*, const float*, size_t, ThreadPool*);
  using Bwd = void (*)(float*, const float*, const float*, size_t, ThreadPool*);
  const std::vector<std::tuple<kernels::Activation, Fwd, Bwd>> acts = {
      {kernels::Activation::kTanh, kernels::TanhForward, kernels::TanhBackward},
      {kernels::Activation::kRelu, kernels::ReluForward, kernels::ReluBackward}};
  for (const auto& [act, fwd, bwd] : acts) {
    const std::string name = act == kernels::Activation::kTanh ? "tanh" : "relu";
    std::vector<float> fused = x, unfused = x, y(n);
    kernels::BiasActForward(fused.data(), bias.data(), rows, cols, act);
    kernels::BiasAddForward(unfused.data(), bias.data(), rows, cols);
    fwd(y.data(), unfused.data(), n, nullptr);
    EXPECT_TRUE(AllClose(name + " fwd", fused, y, 0, 0));

    std::vector<float> dz(n, 7.0f), db(cols, 0.25f), dz_oracle(n, 0.0f), db_oracle(cols, 0.25f);
    kernels::BiasActBackward(dz.data(), db.data(), y.data(), dy.data(), rows, cols, act);
    bwd(dz_oracle.data(), y.data(), dy.data(), n, nullptr);
    kernels::BiasBackward(db_oracle.data(), dz_oracle.data(), rows, cols);
    EXPECT_TRUE(AllClose(name + " dz (written, not added)", dz, dz_oracle, 0, 0));
    EXPECT_TRUE(AllClose(name + " dbias (added)", db, db_oracle, 1e-6, 1e-6));
  }
  std::vector<float> plain = x, oracle = x;
  kernels::BiasActForward(plain.data(), bias.data(), rows, cols, kernels::Activation::kNone);
  kernels::BiasAddForward(oracle.data(), bias.data(), rows, cols);
  EXPECT_TRUE(AllClose("no activation", plain, oracle, 0, 0));
}

// The vectorised byte-to-float conversion against the scalar expression, bit
// for bit, over every byte value, at lengths around the vector widths and
// from unaligned starts.
TEST(InputKernelsTest, ScaleBytesMatchesScalar) {
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + i / 256);
  const float scale = 1.0f / 255.0f;
  for (const size_t offset : {0, 1, 3}) {
    for (const size_t n : {0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 784, 997}) {
      std::vector<float> out(n + 1, -1.0f), oracle(n + 1, -1.0f);
      kernels::ScaleBytes(out.data(), bytes.data() + offset, n, scale);
      for (size_t i = 0; i < n; ++i) oracle[i] = static_cast<float>(bytes[offset + i]) * scale;
      EXPECT_TRUE(AllClose("n=" + std::to_string(n) + " offset=" + std::to_string(offset), out,
                           oracle, 0, 0));  // including the untouched element past n
    }
  }
}

TEST(DeviceTest, ParsesCpuAndCuda) {
  ASSERT_TRUE(ParseDevice("cpu").ok());
  EXPECT_TRUE(ParseDevice("cpu")->is_cpu());
  auto d = ParseDevice("cuda:3");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->is_cuda());
  EXPECT_EQ(d->index, 3);
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU"}) {
    auto r = ParseDevice(bad);
    EXPECT_TRUE(r.status().IsInvalidArgument()) << bad;
  }
}

}  // namespace
}  // namespace fleet::trainer
