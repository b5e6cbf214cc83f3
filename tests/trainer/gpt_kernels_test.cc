// The GPT-2 kernels, three ways:
//  1. Finite differences: every backward of the reference kernels, evaluated
//     in double, against central differences of its forward (every element
//     of every input and parameter).
//  2. Golden values: both twins (reference and CPU, serial and threaded)
//     against float64 NumPy (golden/make_gpt_golden.py).
//  3. Twin against oracle: the CPU twin against the float reference on
//     shapes that exercise its blocking (odd sizes, several attention row
//     blocks, few rows, more workers than cores), and its determinism.
// And dropout's generator (philox.h): Random123's known answers, the keep
// rate, and the same mask on both twins.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/gpt_ref_kernels.h"
#include "trainer/kernels/philox.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;
namespace ref = kernels::gpt_ref;

std::vector<double> RandomDoubles(size_t n, uint32_t seed, double scale = 1.0) {
  std::vector<double> out;
  for (float f : RandomVector(n, seed)) out.push_back(scale * f);
  return out;
}

std::vector<int32_t> RandomIds(size_t n, int hi, uint32_t seed) {
  std::vector<int32_t> out;
  for (float f : RandomVector(n, seed, 0.0f, 1.0f)) {
    out.push_back(std::min(hi - 1, static_cast<int>(f * static_cast<float>(hi))));
  }
  return out;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of f with respect to every element of x, against the
// analytic gradient `grad` (same size as x).
void ExpectGradient(const std::string& name, std::vector<double>* x,
                    const std::function<double()>& f, const std::vector<double>& grad) {
  ASSERT_EQ(x->size(), grad.size()) << name;
  constexpr double h = 1e-6;
  size_t bad = 0;
  for (size_t i = 0; i < x->size(); ++i) {
    const double saved = (*x)[i];
    (*x)[i] = saved + h;
    const double up = f();
    (*x)[i] = saved - h;
    const double down = f();
    (*x)[i] = saved;
    const double num = (up - down) / (2 * h);
    if (std::fabs(num - grad[i]) > 1e-6 + 1e-6 * std::fabs(num)) {
      if (bad++ < 3) {
        ADD_FAILURE() << name << "[" << i << "]: analytic " << grad[i] << ", numeric " << num;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << name << ": " << bad << " of " << x->size() << " elements differ";
}

// ---- 1. finite differences of the double reference ------------------------------------

TEST(GptKernelGradcheck, Encoder) {
  const int B = 2, T = 3, C = 4, V = 5, P = 4;
  auto tokens = RandomIds(B * T, V, 1);
  tokens[4] = tokens[0];  // a repeated token
  auto wte = RandomDoubles(V * C, 2), wpe = RandomDoubles(P * C, 3);
  const auto r = RandomDoubles(B * T * C, 4);
  std::vector<double> out(B * T * C), dwte(V * C), dwpe(P * C);
  auto f = [&] {
    ref::EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(out, r);
  };
  ref::EncoderBackward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  ExpectGradient("dwte", &wte, f, dwte);
  ExpectGradient("dwpe", &wpe, f, dwpe);
}

TEST(GptKernelGradcheck, LayerNorm) {
  const int N = 3, C = 5;
  auto x = RandomDoubles(N * C, 5, 2.0), w = RandomDoubles(C, 6), b = RandomDoubles(C, 7);
  const auto r = RandomDoubles(N * C, 8);
  std::vector<double> out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  auto f = [&] {
    ref::LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return Dot(out, r);
  };
  f();
  ref::LayerNormBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                         rstd.data(), N, C);
  ExpectGradient("dinp", &x, f, dx);
  ExpectGradient("dweight", &w, f, dw);
  ExpectGradient("dbias", &b, f, db);
}

TEST(GptKernelGradcheck, Matmul) {
  const int N = 4, IC = 3, OC = 5;
  auto x = RandomDoubles(N * IC, 9), w = RandomDoubles(OC * IC, 10), b = RandomDoubles(OC, 11);
  const auto r = RandomDoubles(N * OC, 12);
  std::vector<double> out(N * OC), dx(N * IC), dw(OC * IC), db(OC);
  auto f = [&] {
    ref::MatmulForward(out.data(), x.data(), w.data(), b.data(), N, IC, OC, false);
    return Dot(out, r);
  };
  ref::MatmulBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, IC, OC);
  ExpectGradient("dinp", &x, f, dx);
  ExpectGradient("dweight", &w, f, dw);
  ExpectGradient("dbias", &b, f, db);
}

// Without dropout, and with the attention probabilities dropped out (half
// of them, heads offset as a tensor-parallel rank's): the mask is fixed for
// the key, so the function stays differentiable.
TEST(GptKernelGradcheck, Attention) {
  const int B = 2, T = 4, C = 6, NH = 2;
  const uint32_t streams[B] = {7, 70000};
  DropoutSpec dropped;
  dropped.p = 0.5f;
  dropped.seed = 99;
  dropped.site = 4;
  dropped.streams = streams;
  dropped.head_offset = 2;
  for (const DropoutSpec& dropout : {DropoutSpec{}, dropped}) {
    auto qkv = RandomDoubles(B * T * 3 * C, 13);
    const auto r = RandomDoubles(B * T * C, 14);
    std::vector<double> out(B * T * C), saved(B * NH * T * T), scratch(B * NH * T * T),
        dqkv(B * T * 3 * C);
    auto f = [&] {
      ref::AttentionForward(out.data(), saved.data(), qkv.data(), B, T, C, NH, dropout);
      return Dot(out, r);
    };
    f();
    ref::AttentionBackward(dqkv.data(), scratch.data(), r.data(), qkv.data(), saved.data(), B, T, C,
                           NH, dropout);
    ExpectGradient(dropout.enabled() ? "dqkv (dropout)" : "dqkv", &qkv, f, dqkv);
  }
}

TEST(GptKernelGradcheck, Gelu) {
  auto x = RandomDoubles(50, 15, 4.0);
  const auto r = RandomDoubles(50, 16);
  std::vector<double> out(50), dx(50);
  auto f = [&] {
    ref::GeluForward(out.data(), x.data(), x.size());
    return Dot(out, r);
  };
  ref::GeluBackward(dx.data(), x.data(), r.data(), x.size());
  ExpectGradient("dinp", &x, f, dx);
}

TEST(GptKernelGradcheck, CrossEntropy) {
  const int N = 4, V = 6;
  const double dloss = 0.3;
  auto logits = RandomDoubles(N * V, 17, 3.0);
  std::vector<int32_t> targets = {2, -1, 5, 0};
  std::vector<double> losses(N), work(N * V);
  auto f = [&] {
    work = logits;
    ref::CrossEntropyForward(losses.data(), work.data(), targets.data(), N, V, 0.0, false);
    double s = 0.0;
    for (double l : losses) s += dloss * l;
    return s;
  };
  std::vector<double> dlogits = logits;
  ref::CrossEntropyForward(losses.data(), dlogits.data(), targets.data(), N, V, dloss, true);
  EXPECT_EQ(losses[1], 0.0);
  ExpectGradient("dlogits", &logits, f, dlogits);
}

// ---- twins --------------------------------------------------------------------------------

// A twin to test: the reference, or the CPU twin with 0, 1 or 3 pool threads.
struct Twin {
  std::string name;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<GptKernels> kernels;
};

Twin MakeTwin(int pool_threads) {
  Twin t;
  if (pool_threads < 0) {
    t.name = "reference";
    t.kernels = std::make_unique<RefGptKernels>();
    return t;
  }
  t.name = "cpu/pool" + std::to_string(pool_threads);
  if (pool_threads > 0) t.pool = std::make_unique<ThreadPool>(pool_threads);
  t.kernels = std::make_unique<CpuGptKernels>(t.pool.get());
  return t;
}

std::string TwinName(const ::testing::TestParamInfo<int>& info) {
  return info.param < 0 ? "Reference" : "CpuPool" + std::to_string(info.param);
}

// ---- 2. golden values -------------------------------------------------------------------

class GptKernelGolden : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    golden_ = new std::map<std::string, testing::GoldenTensor>(
        testing::ReadGolden(testing::GoldenDir() + "/gpt_kernels.golden"));
  }
  static void TearDownTestSuite() {
    delete golden_;
    golden_ = nullptr;
  }
  void SetUp() override { twin_ = MakeTwin(GetParam()); }

  static std::vector<float> G(const std::string& name) {
    auto it = golden_->find(name);
    if (it == golden_->end()) {
      ADD_FAILURE() << "golden file has no tensor " << name;
      return {};
    }
    return it->second.data;
  }
  static std::vector<int32_t> Ids(const std::string& name) {
    std::vector<int32_t> out;
    for (float f : G(name)) out.push_back(static_cast<int32_t>(f));
    return out;
  }
  void Expect(const std::string& name, const std::vector<float>& got) {
    EXPECT_TRUE(AllClose(twin_.name + " " + name, got, G(name), 2e-5, 1e-4));
  }

  static std::map<std::string, testing::GoldenTensor>* golden_;
  Twin twin_;
};
std::map<std::string, testing::GoldenTensor>* GptKernelGolden::golden_ = nullptr;

TEST_P(GptKernelGolden, EncoderLayerNormMatmulGelu) {
  const auto shape = G("shape");
  ASSERT_EQ(shape.size(), 6u);
  const int B = shape[0], T = shape[1], C = shape[2], V = shape[3], P = shape[4], F = shape[5];
  const int N = B * T;
  GptKernels* k = twin_.kernels.get();

  std::vector<float> out(N * C), dwte(V * C), dwpe(P * C);
  const auto tokens = Ids("enc.tokens");
  k->EncoderForward(out.data(), tokens.data(), G("enc.wte").data(), G("enc.wpe").data(), B, T, C);
  Expect("enc.out", out);
  k->EncoderBackward(dwte.data(), dwpe.data(), G("enc.dout").data(), tokens.data(), B, T, C);
  Expect("enc.dwte", dwte);
  Expect("enc.dwpe", dwpe);

  std::vector<float> mean(N), rstd(N), dx(N * C), dw(C), db(C);
  k->LayerNormForward(out.data(), mean.data(), rstd.data(), G("ln.inp").data(),
                      G("ln.weight").data(), G("ln.bias").data(), N, C);
  Expect("ln.out", out);
  Expect("ln.mean", mean);
  Expect("ln.rstd", rstd);
  k->LayerNormBackward(dx.data(), dw.data(), db.data(), G("ln.dout").data(), G("ln.inp").data(),
                       G("ln.weight").data(), mean.data(), rstd.data(), N, C);
  Expect("ln.dinp", dx);
  Expect("ln.dweight", dw);
  Expect("ln.dbias", db);

  std::vector<float> y(N * F), mdx(N * C), mdw(F * C), mdb(F);
  k->MatmulForward(y.data(), G("mm.inp").data(), G("mm.weight").data(), G("mm.bias").data(), N, C,
                   F, false);
  Expect("mm.out", y);
  k->MatmulBackward(mdx.data(), mdw.data(), mdb.data(), G("mm.dout").data(), G("mm.inp").data(),
                    G("mm.weight").data(), N, C, F);
  Expect("mm.dinp", mdx);
  Expect("mm.dweight", mdw);
  Expect("mm.dbias", mdb);

  const auto gx = G("gelu.inp");
  std::vector<float> gy(gx.size()), gdx(gx.size());
  k->GeluForward(gy.data(), gx.data(), gx.size());
  Expect("gelu.out", gy);
  k->GeluBackward(gdx.data(), gx.data(), G("gelu.dout").data(), gx.size());
  Expect("gelu.dinp", gdx);
}

TEST_P(GptKernelGolden, Attention) {
  const auto shape = G("attn.shape");
  ASSERT_EQ(shape.size(), 4u);
  const int B = shape[0], T = shape[1], C = shape[2], NH = shape[3];
  GptKernels* k = twin_.kernels.get();
  std::vector<float> out(B * T * C), saved(k->AttentionSavedFloats(B, T, NH)),
      scratch(k->AttentionScratchFloats(B, T, NH)), dqkv(B * T * 3 * C);
  k->AttentionForward(out.data(), saved.data(), scratch.data(), G("attn.qkv").data(), B, T, C, NH,
                      {});
  Expect("attn.out", out);
  k->AttentionBackward(dqkv.data(), scratch.data(), G("attn.dout").data(), G("attn.qkv").data(),
                       out.data(), saved.data(), B, T, C, NH, {});
  Expect("attn.dqkv", dqkv);
}

TEST_P(GptKernelGolden, CrossEntropy) {
  const auto targets = Ids("ce.targets");
  const int N = static_cast<int>(targets.size());
  auto logits = G("ce.logits");
  const int V = static_cast<int>(logits.size()) / N;
  std::vector<float> losses(N);
  auto eval = logits;
  twin_.kernels->CrossEntropyForward(losses.data(), eval.data(), targets.data(), N, V, 0.0f, false);
  Expect("ce.losses", losses);
  EXPECT_EQ(eval, logits) << "logits changed without write_dlogits";
  twin_.kernels->CrossEntropyForward(losses.data(), logits.data(), targets.data(), N, V,
                                     G("ce.dloss")[0], true);
  Expect("ce.losses", losses);
  Expect("ce.dlogits", logits);
}

INSTANTIATE_TEST_SUITE_P(Twins, GptKernelGolden, ::testing::Values(-1, 0, 1, 3), TwinName);

// ---- 3. CPU twin against the reference oracle ----------------------------------------

class GptCpuVsReference : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { cpu_ = MakeTwin(GetParam()); }
  GptKernels* cpu() { return cpu_.kernels.get(); }
  RefGptKernels ref_;
  Twin cpu_;
};

constexpr double kAbs = 1e-5, kRel = 1e-4;

TEST_P(GptCpuVsReference, Encoder) {
  for (auto [B, T, C, V] : {std::array{2, 5, 8, 11}, {3, 70, 100, 50}, {1, 1, 3, 2}}) {
    const auto tokens = RandomIds(B * T, V, 20);
    const auto wte = RandomVector(V * C, 21), wpe = RandomVector(T * C, 22),
               dout = RandomVector(B * T * C, 23);
    std::vector<float> a(B * T * C), b(B * T * C);
    cpu()->EncoderForward(a.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    ref_.EncoderForward(b.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    EXPECT_TRUE(AllClose("out", a, b, kAbs, kRel));
    std::vector<float> dwte_a(V * C, 0.5f), dwpe_a(T * C, 0.5f), dwte_b = dwte_a, dwpe_b = dwpe_a;
    cpu()->EncoderBackward(dwte_a.data(), dwpe_a.data(), dout.data(), tokens.data(), B, T, C);
    ref_.EncoderBackward(dwte_b.data(), dwpe_b.data(), dout.data(), tokens.data(), B, T, C);
    EXPECT_TRUE(AllClose("dwte", dwte_a, dwte_b, kAbs, kRel));
    EXPECT_TRUE(AllClose("dwpe", dwpe_a, dwpe_b, kAbs, kRel));
  }
}

TEST_P(GptCpuVsReference, LayerNorm) {
  for (auto [N, C] : {std::pair{10, 8}, {257, 100}, {64, 768}, {1, 1}}) {
    const auto x = RandomVector(N * C, 30, -3.0f, 5.0f), w = RandomVector(C, 31),
               b = RandomVector(C, 32), dout = RandomVector(N * C, 33);
    std::vector<float> ya(N * C), yb(N * C), ma(N), mb(N), ra(N), rb(N);
    cpu()->LayerNormForward(ya.data(), ma.data(), ra.data(), x.data(), w.data(), b.data(), N, C);
    ref_.LayerNormForward(yb.data(), mb.data(), rb.data(), x.data(), w.data(), b.data(), N, C);
    EXPECT_TRUE(AllClose("out", ya, yb, kAbs, kRel));
    EXPECT_TRUE(AllClose("rstd", ra, rb, kAbs, kRel));
    // Backward adds: start both from the same non-zero gradients.
    std::vector<float> dxa(N * C, 0.25f), dwa(C, 0.25f), dba(C, 0.25f);
    std::vector<float> dxb = dxa, dwb = dwa, dbb = dba;
    cpu()->LayerNormBackward(dxa.data(), dwa.data(), dba.data(), dout.data(), x.data(), w.data(),
                             ma.data(), ra.data(), N, C);
    ref_.LayerNormBackward(dxb.data(), dwb.data(), dbb.data(), dout.data(), x.data(), w.data(),
                           mb.data(), rb.data(), N, C);
    EXPECT_TRUE(AllClose("dinp", dxa, dxb, 1e-4, 1e-3));
    EXPECT_TRUE(AllClose("dweight", dwa, dwb, 1e-4, kRel));
    EXPECT_TRUE(AllClose("dbias", dba, dbb, 1e-4, kRel));
  }
}

// Frozen parameters (LoRA's base weights): null parameter gradients skip
// their work and leave the input gradient what it is with them.
TEST_P(GptCpuVsReference, FrozenParametersGetOnlyInputGradients) {
  const int N = 70, IC = 40, OC = 90;
  const auto x = RandomVector(N * IC, 50), w = RandomVector(OC * IC, 51),
             dout = RandomVector(N * OC, 52);
  std::vector<float> want(N * IC, 0.5f), dw(OC * IC, 0.0f), db(OC, 0.0f);
  ref_.MatmulBackward(want.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, IC,
                      OC);
  for (GptKernels* k : {cpu(), static_cast<GptKernels*>(&ref_)}) {
    std::vector<float> got(N * IC, 0.5f);
    k->MatmulBackward(got.data(), nullptr, nullptr, dout.data(), x.data(), w.data(), N, IC, OC);
    EXPECT_TRUE(AllClose(std::string(k->name()) + " matmul dinp", got, want, kAbs, kRel));
  }
  const int C = 96;
  const auto xin = RandomVector(N * C, 53, -3.0f, 5.0f), lw = RandomVector(C, 54),
             lb = RandomVector(C, 55), dy = RandomVector(N * C, 56);
  std::vector<float> y(N * C), mean(N), rstd(N), want_dx(N * C, 0.25f), ldw(C), ldb(C);
  ref_.LayerNormForward(y.data(), mean.data(), rstd.data(), xin.data(), lw.data(), lb.data(), N, C);
  ref_.LayerNormBackward(want_dx.data(), ldw.data(), ldb.data(), dy.data(), xin.data(), lw.data(),
                         mean.data(), rstd.data(), N, C);
  for (GptKernels* k : {cpu(), static_cast<GptKernels*>(&ref_)}) {
    std::vector<float> got(N * C, 0.25f);
    k->LayerNormBackward(got.data(), nullptr, nullptr, dy.data(), xin.data(), lw.data(),
                         mean.data(), rstd.data(), N, C);
    EXPECT_TRUE(AllClose(std::string(k->name()) + " layernorm dinp", got, want_dx, 1e-4, 1e-3));
  }
}

TEST_P(GptCpuVsReference, Matmul) {
  // Many rows (row blocks), few rows and many columns (column blocks), tiny.
  for (auto [N, IC, OC] :
       {std::array{10, 8, 12}, {130, 40, 70}, {5, 33, 300}, {300, 64, 3}, {1, 1, 1}}) {
    const auto x = RandomVector(N * IC, 40), w = RandomVector(OC * IC, 41),
               bias = RandomVector(OC, 42), dout = RandomVector(N * OC, 43),
               start = RandomVector(N * OC, 44);
    for (bool with_bias : {false, true}) {
      for (bool accumulate : {false, true}) {
        std::vector<float> ya = start, yb = start;
        const float* bp = with_bias ? bias.data() : nullptr;
        cpu()->MatmulForward(ya.data(), x.data(), w.data(), bp, N, IC, OC, accumulate);
        ref_.MatmulForward(yb.data(), x.data(), w.data(), bp, N, IC, OC, accumulate);
        EXPECT_TRUE(AllClose(
            "out bias=" + std::to_string(with_bias) + " accumulate=" + std::to_string(accumulate),
            ya, yb, kAbs, kRel));
      }
    }
    for (bool want_dinp : {false, true}) {
      std::vector<float> dxa(N * IC, 0.5f), dwa(OC * IC, 0.5f), dba(OC, 0.5f);
      std::vector<float> dxb = dxa, dwb = dwa, dbb = dba;
      cpu()->MatmulBackward(want_dinp ? dxa.data() : nullptr, dwa.data(), dba.data(), dout.data(),
                            x.data(), w.data(), N, IC, OC);
      ref_.MatmulBackward(want_dinp ? dxb.data() : nullptr, dwb.data(), dbb.data(), dout.data(),
                          x.data(), w.data(), N, IC, OC);
      EXPECT_TRUE(AllClose("dinp", dxa, dxb, kAbs, kRel));
      EXPECT_TRUE(AllClose("dweight", dwa, dwb, kAbs, kRel));
      EXPECT_TRUE(AllClose("dbias", dba, dbb, kAbs, kRel));
    }
  }
}

TEST_P(GptCpuVsReference, Attention) {
  // T = 1; one row block; several (with a partial last block); one head;
  // each without and with dropout of the probabilities.
  const std::vector<uint32_t> streams = {11, 4000000000u};
  for (auto [B, T, C, NH] :
       {std::array{1, 1, 8, 2}, {2, 64, 16, 2}, {2, 130, 32, 4}, {1, 65, 16, 1}}) {
    for (float p : {0.0f, 0.1f}) {
      DropoutSpec dropout;
      dropout.p = p;
      dropout.seed = 0x1234567890ULL;
      dropout.site = 5;
      dropout.streams = streams.data();
      dropout.head_offset = 3;
      const auto qkv = RandomVector(B * T * 3 * C, 50, -2.0f, 2.0f),
                 dout = RandomVector(B * T * C, 51);
      std::vector<float> ya(B * T * C), yb(B * T * C);
      std::vector<float> sa(cpu()->AttentionSavedFloats(B, T, NH)),
          sb(ref_.AttentionSavedFloats(B, T, NH));
      std::vector<float> scratch_a(cpu()->AttentionScratchFloats(B, T, NH), NAN),
          scratch_b(ref_.AttentionScratchFloats(B, T, NH));
      cpu()->AttentionForward(ya.data(), sa.data(), scratch_a.data(), qkv.data(), B, T, C, NH,
                              dropout);
      ref_.AttentionForward(yb.data(), sb.data(), scratch_b.data(), qkv.data(), B, T, C, NH,
                            dropout);
      const std::string shape =
          " B" + std::to_string(B) + " T" + std::to_string(T) + " p" + std::to_string(p);
      EXPECT_TRUE(AllClose("out" + shape, ya, yb, kAbs, kRel));
      std::vector<float> da(B * T * 3 * C, 0.5f), db = da;
      std::fill(scratch_a.begin(), scratch_a.end(), NAN);
      cpu()->AttentionBackward(da.data(), scratch_a.data(), dout.data(), qkv.data(), ya.data(),
                               sa.data(), B, T, C, NH, dropout);
      ref_.AttentionBackward(db.data(), scratch_b.data(), dout.data(), qkv.data(), yb.data(),
                             sb.data(), B, T, C, NH, dropout);
      EXPECT_TRUE(AllClose("dqkv" + shape, da, db, kAbs, kRel));
    }
  }
}

// Decoding a sequence chunk by chunk over the KV cache equals attention over
// the whole sequence, on both twins; the CPU twin equals the oracle chunk by
// chunk; cache rows past the last position are never written.
TEST_P(GptCpuVsReference, AttentionDecode) {
  struct Case {
    int B, C, NH, maxT;
    std::vector<int> chunks;  // new positions per call
  };
  const std::vector<Case> cases = {
      {1, 8, 2, 4, {1}},
      {2, 16, 2, 12, {1, 1, 1, 1, 1, 1, 1}},
      {2, 32, 4, 150, {70, 1, 1, 64, 3}},
      {3, 16, 1, 9, {9}},
  };
  constexpr float kUnwritten = 7.0f;
  for (const Case& c : cases) {
    int T = 0;
    for (int n : c.chunks) T += n;
    const int C = c.C, B = c.B;
    const auto qkv = RandomVector(size_t(B) * T * 3 * C, 52, -2.0f, 2.0f);
    std::vector<float> want(size_t(B) * T * C), saved(ref_.AttentionSavedFloats(B, T, c.NH));
    std::vector<float> scratch(ref_.AttentionScratchFloats(B, T, c.NH));
    ref_.AttentionForward(want.data(), saved.data(), scratch.data(), qkv.data(), B, T, C, c.NH, {});
    std::vector<float> got_twin[2];
    GptKernels* twins[2] = {&ref_, cpu()};
    for (int w = 0; w < 2; ++w) {
      std::vector<float> kc(size_t(B) * c.maxT * C, kUnwritten), vc = kc;
      std::vector<float>& got = got_twin[w];
      got.assign(size_t(B) * T * C, NAN);
      int past = 0;
      for (int n : c.chunks) {
        // The chunk's rows of every sequence, contiguous [B, n, 3C].
        std::vector<float> in(size_t(B) * n * 3 * C), out(size_t(B) * n * C, NAN);
        std::vector<float> scratch(size_t(B) * c.NH * n * (past + n), NAN);
        for (int b = 0; b < B; ++b)
          std::copy_n(qkv.begin() + (size_t(b) * T + past) * 3 * C, size_t(n) * 3 * C,
                      in.begin() + size_t(b) * n * 3 * C);
        twins[w]->AttentionDecodeForward(out.data(), kc.data(), vc.data(), scratch.data(),
                                         in.data(), B, n, past, c.maxT, C, c.NH);
        for (int b = 0; b < B; ++b)
          std::copy_n(out.begin() + size_t(b) * n * C, size_t(n) * C,
                      got.begin() + (size_t(b) * T + past) * C);
        past += n;
      }
      const std::string name = std::string(twins[w]->name()) + " B" + std::to_string(B) + " T" +
                               std::to_string(T) + " chunks " + std::to_string(c.chunks.size());
      EXPECT_TRUE(AllClose("decode vs full " + name, got, want, kAbs, kRel));
      for (int b = 0; b < B; ++b) {
        for (int t = 0; t < c.maxT; ++t) {
          for (int i = 0; i < C; ++i) {
            const size_t at = (size_t(b) * c.maxT + t) * C + i;
            const size_t src = (size_t(b) * T + t) * 3 * C + C + i;
            ASSERT_EQ(kc[at], t < T ? qkv[src] : kUnwritten) << name << " k b" << b << " t" << t;
            ASSERT_EQ(vc[at], t < T ? qkv[src + C] : kUnwritten)
                << name << " v b" << b << " t" << t;
          }
        }
      }
    }
    EXPECT_TRUE(AllClose("cpu vs reference decode", got_twin[1], got_twin[0], kAbs, kRel));
  }
}

TEST_P(GptCpuVsReference, Gelu) {
  for (size_t n : {size_t{1}, size_t{100}, size_t{100003}}) {
    const auto x = RandomVector(n, 60, -8.0f, 8.0f), dout = RandomVector(n, 61);
    std::vector<float> ya(n), yb(n), da(n), db(n);
    cpu()->GeluForward(ya.data(), x.data(), n);
    ref_.GeluForward(yb.data(), x.data(), n);
    EXPECT_TRUE(AllClose("out", ya, yb, kAbs, kRel));
    cpu()->GeluBackward(da.data(), x.data(), dout.data(), n);
    ref_.GeluBackward(db.data(), x.data(), dout.data(), n);
    EXPECT_TRUE(AllClose("dinp", da, db, kAbs, kRel));
    // In place, as the model runs it.
    std::vector<float> inplace = dout;
    cpu()->GeluBackward(inplace.data(), x.data(), inplace.data(), n);
    EXPECT_TRUE(AllClose("dinp in place", inplace, db, kAbs, kRel));
  }
}

TEST_P(GptCpuVsReference, CrossEntropy) {
  for (auto [N, V] : {std::pair{6, 13}, {40, 5003}, {1, 1}}) {
    auto logits = RandomVector(N * V, 70, -20.0f, 20.0f);
    auto targets = RandomIds(N, V, 71);
    targets[N / 2] = -1;
    for (bool write : {false, true}) {
      std::vector<float> la(N), lb(N), za = logits, zb = logits;
      cpu()->CrossEntropyForward(la.data(), za.data(), targets.data(), N, V, 0.125f, write);
      ref_.CrossEntropyForward(lb.data(), zb.data(), targets.data(), N, V, 0.125f, write);
      EXPECT_TRUE(AllClose("losses", la, lb, kAbs, kRel));
      EXPECT_TRUE(AllClose("dlogits", za, zb, 1e-7, kRel));
    }
  }
}

// The vocabulary-parallel pieces: the embedding lookup of a shard of wte
// rows (with and without wpe), and the cross-entropy of logits split into
// two column shards, combined as GptModel combines them over ranks (max,
// then sums), equals the whole row's CrossEntropyForward.
TEST_P(GptCpuVsReference, VocabularyShards) {
  const int B = 3, T = 7, C = 24, V = 41, N = B * T;
  const auto tokens = RandomIds(N, V, 80);
  const auto wte = RandomVector(V * C, 81), wpe = RandomVector(T * C, 82),
             dout = RandomVector(N * C, 83);
  std::vector<float> whole(N * C), sum(N * C, 0.0f);
  ref_.EncoderForward(whole.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  std::vector<float> dwte_whole(V * C, 0.0f), dwpe_whole(T * C, 0.0f);
  ref_.EncoderBackward(dwte_whole.data(), dwpe_whole.data(), dout.data(), tokens.data(), B, T, C);
  std::vector<float> dwte(V * C, 0.0f);
  for (auto [begin, rows] : {std::pair{0, 21}, {21, 20}}) {
    std::vector<float> a(N * C), b(N * C);
    const float* pe = begin == 0 ? wpe.data() : nullptr;  // added by one shard
    cpu()->EncoderShardForward(a.data(), tokens.data(), wte.data() + begin * C, pe, B, T, C, begin,
                               rows);
    ref_.EncoderShardForward(b.data(), tokens.data(), wte.data() + begin * C, pe, B, T, C, begin,
                             rows);
    EXPECT_TRUE(AllClose("shard out", a, b, kAbs, kRel));
    for (int i = 0; i < N * C; ++i) sum[i] += a[i];
    std::vector<float> dpe_a(T * C, 0.0f), dpe_b(T * C, 0.0f), dte_b(rows * C, 0.0f);
    cpu()->EncoderShardBackward(dwte.data() + begin * C, dpe_a.data(), dout.data(), tokens.data(),
                                B, T, C, begin, rows);
    ref_.EncoderShardBackward(dte_b.data(), dpe_b.data(), dout.data(), tokens.data(), B, T, C,
                              begin, rows);
    EXPECT_TRUE(
        AllClose("shard dwte",
                 std::vector<float>(dwte.begin() + begin * C, dwte.begin() + (begin + rows) * C),
                 dte_b, kAbs, kRel));
    EXPECT_TRUE(AllClose("shard dwpe", dpe_a, dwpe_whole, kAbs, kRel));
  }
  EXPECT_TRUE(AllClose("summed shards", sum, whole, kAbs, kRel));
  EXPECT_TRUE(AllClose("dwte of the shards", dwte, dwte_whole, kAbs, kRel));

  auto logits = RandomVector(N * V, 84, -20.0f, 20.0f);
  auto targets = RandomIds(N, V, 85);
  targets[4] = -1;
  for (bool write : {false, true}) {
    std::vector<float> want_losses(N), want = logits;
    ref_.CrossEntropyForward(want_losses.data(), want.data(), targets.data(), N, V, 0.25f, write);
    for (GptKernels* k : {cpu(), static_cast<GptKernels*>(&ref_)}) {
      const std::string what = std::string(k->name()) + (write ? " with dlogits" : "");
      // Two shards of columns [0, 17) and [17, V), each its own [N, Vs] block.
      const std::pair<int, int> shards[] = {{0, 17}, {17, V - 17}};
      std::vector<std::vector<float>> z(2);
      std::vector<float> row_max(N, -INFINITY), sums(2 * N, 0.0f);
      for (int s = 0; s < 2; ++s) {
        const auto [begin, cols] = shards[s];
        for (int i = 0; i < N; ++i) {
          z[s].insert(z[s].end(), logits.begin() + i * V + begin,
                      logits.begin() + i * V + begin + cols);
        }
        std::vector<float> m(N);
        k->CrossEntropyShardMax(m.data(), z[s].data(), N, cols);
        for (int i = 0; i < N; ++i) row_max[i] = std::max(row_max[i], m[i]);
      }
      for (int s = 0; s < 2; ++s) {
        std::vector<float> part(2 * N);
        k->CrossEntropyShardSums(part.data(), z[s].data(), row_max.data(), targets.data(), N,
                                 shards[s].second, shards[s].first);
        for (int i = 0; i < 2 * N; ++i) sums[i] += part[i];
      }
      std::vector<float> got = logits;
      for (int s = 0; s < 2; ++s) {
        const auto [begin, cols] = shards[s];
        std::vector<float> losses(N);
        k->CrossEntropyShardFinish(losses.data(), z[s].data(), row_max.data(), sums.data(),
                                   targets.data(), N, cols, begin, 0.25f, write);
        EXPECT_TRUE(AllClose(what + " losses", losses, want_losses, kAbs, kRel));
        for (int i = 0; i < N; ++i) {
          std::copy(z[s].begin() + i * cols, z[s].begin() + (i + 1) * cols,
                    got.begin() + i * V + begin);
        }
      }
      EXPECT_TRUE(AllClose(what + " logits", got, want, 1e-7, kRel));
    }
  }
}

TEST_P(GptCpuVsReference, SumOfSquaresAndAdamW) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000003}}) {
    const auto x = RandomVector(n, 80);
    EXPECT_NEAR(cpu()->SumOfSquares(x.data(), n), ref_.SumOfSquares(x.data(), n),
                1e-6 * std::max(1.0, ref_.SumOfSquares(x.data(), n)))
        << n;
  }
  const size_t n = 100003;
  auto p = RandomVector(n, 81), m = RandomVector(n, 82, 0.0f, 0.1f),
       v = RandomVector(n, 83, 0.0f, 0.1f);
  const auto g = RandomVector(n, 84);
  auto p2 = p, m2 = m, v2 = v;
  const AdamWStep step{.lr = 0.01f,
                       .beta1 = 0.9f,
                       .beta2 = 0.95f,
                       .eps = 1e-8f,
                       .weight_decay = 0.1f,
                       .bias_correction1 = 0.19f,
                       .bias_correction2 = 0.0975f,
                       .grad_scale = 0.7f};
  cpu()->AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, step);
  ref_.AdamWUpdate(p2.data(), g.data(), m2.data(), v2.data(), n, step);
  EXPECT_TRUE(AllClose("p", p, p2, 1e-6, 1e-5));
  EXPECT_TRUE(AllClose("m", m, m2, 1e-7, 1e-5));
  EXPECT_TRUE(AllClose("v", v, v2, 1e-7, 1e-5));
}

// Recompute relies on it: the same inputs give the same bits, call after call.
TEST_P(GptCpuVsReference, DeterministicBits) {
  const int B = 2, T = 100, C = 64, NH = 4, N = B * T;
  const auto qkv = RandomVector(N * 3 * C, 90), dout = RandomVector(N * C, 91),
             w = RandomVector(C * 3 * C, 92);
  auto run = [&] {
    std::vector<float> y(N * C), saved(cpu()->AttentionSavedFloats(B, T, NH)),
        scratch(cpu()->AttentionScratchFloats(B, T, NH)), dqkv(N * 3 * C), dw(3 * C * C), db(3 * C),
        dx(N * C), mean(N), rstd(N), ln(N * C), lnw(C), lnb(C);
    cpu()->AttentionForward(y.data(), saved.data(), scratch.data(), qkv.data(), B, T, C, NH, {});
    cpu()->AttentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), y.data(),
                             saved.data(), B, T, C, NH, {});
    cpu()->MatmulBackward(dx.data(), dw.data(), db.data(), dqkv.data(), y.data(), w.data(), N, C,
                          3 * C);
    cpu()->LayerNormForward(ln.data(), mean.data(), rstd.data(), dx.data(), w.data(), w.data() + C,
                            N, C);
    cpu()->LayerNormBackward(dx.data(), lnw.data(), lnb.data(), dout.data(), y.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
    std::vector<float> all = dqkv;
    for (const auto* v : {&dw, &db, &dx, &lnw, &lnb}) all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const auto first = run();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(), first) << "run " << i;
}

// Dropout: out = residual + mask * inp / (1 - p), with residual and in
// place; the backward overwrites with the same mask. The zero pattern must
// be the oracle's exactly (one generator), the values within rounding.
TEST_P(GptCpuVsReference, Dropout) {
  const std::vector<uint32_t> streams = {3, 9, 0xfffffffeu};
  for (auto [B, n] : {std::pair{1, size_t{1}}, {3, size_t{37}}, {2, size_t{70001}}}) {
    DropoutSpec d;
    d.p = 0.3f;
    d.seed = 42;
    d.site = 2;
    d.streams = streams.data();
    const auto inp = RandomVector(B * n, 60), residual = RandomVector(B * n, 61);
    std::vector<float> a(B * n), b(B * n);
    cpu()->DropoutForward(a.data(), inp.data(), residual.data(), B, n, d);
    ref_.DropoutForward(b.data(), inp.data(), residual.data(), B, n, d);
    const std::string shape = " B" + std::to_string(B) + " n" + std::to_string(n);
    EXPECT_TRUE(AllClose("out" + shape, a, b, 1e-7, 1e-6));
    // In place, no residual: dropped elements are exactly 0.
    std::vector<float> x = inp;
    cpu()->DropoutForward(x.data(), x.data(), nullptr, B, n, d);
    ref_.DropoutForward(b.data(), inp.data(), nullptr, B, n, d);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x[i] == 0.0f, b[i] == 0.0f) << "mask differs at " << i << shape;
    }
    EXPECT_TRUE(AllClose("in place" + shape, x, b, 1e-7, 1e-6));
    std::vector<float> g = inp;
    cpu()->DropoutBackward(g.data(), g.data(), B, n, d);
    EXPECT_TRUE(AllClose("backward" + shape, g, x, 0, 0)) << "forward and backward masks differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Pools, GptCpuVsReference, ::testing::Values(0, 1, 3), TwinName);

// Random123's known-answer vectors for philox4x32-10.
TEST(GptDropout, PhiloxMatchesRandom123) {
  struct Case {
    std::array<uint32_t, 4> counter;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> want;
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Case& c : cases) {
    const philox::Bits4 got = philox::Philox4x32(c.counter[0], c.counter[1], c.counter[2],
                                                 c.counter[3], c.key[0], c.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], c.want[i]) << "word " << i;
  }
}

// The fraction kept is 1 - p (within 5 standard deviations over 2^20
// elements), for every site and stream alike; distinct streams, sites and
// seeds draw different masks.
TEST(GptDropout, KeepsOneMinusPAndKeysEveryInput) {
  const size_t n = size_t{1} << 20;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t threshold = philox::DropoutThreshold(p);
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) kept += philox::DropoutKeep(7, 3, 11, 0, i, threshold);
    const double sd = std::sqrt(n * p * (1.0 - p));
    EXPECT_NEAR(static_cast<double>(kept), n * (1.0 - p), 5 * sd) << "p " << p;
  }
  const uint32_t threshold = philox::DropoutThreshold(0.5f);
  auto mask = [&](uint64_t seed, uint32_t site, uint32_t stream, uint32_t lane) {
    std::vector<bool> m(256);
    for (size_t i = 0; i < m.size(); ++i) {
      m[i] = philox::DropoutKeep(seed, site, stream, lane, i, threshold);
    }
    return m;
  };
  const auto base = mask(1, 2, 3, 4);
  EXPECT_NE(base, mask(2, 2, 3, 4));
  EXPECT_NE(base, mask(1, 5, 3, 4));
  EXPECT_NE(base, mask(1, 2, 6, 4));
  EXPECT_NE(base, mask(1, 2, 3, 7));
  EXPECT_EQ(base, mask(1, 2, 3, 4));
  EXPECT_EQ(philox::DropoutThreshold(0.0f), 0u);
}

}  // namespace
}  // namespace fleet::trainer
