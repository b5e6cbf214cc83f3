// The mma.sync flash attention (trainer/kernels/gpt_cuda_flash_mma.cu) on the
// CPU emulation of CUDA (cuda_emulation.h), against attention in double
// precision: the kernels' indexing, fragment layouts, masks, online softmax
// and barriers are checked on every build, GPU or not. (On a GPU,
// trainer_gpt_cuda_kernels_test compares the same kernels with the CPU twin.)
//
// Tolerances, as there: the products take bf16 / fp16 operands (q, k, v,
// dout, and the probabilities and dS, each rounded once) with float32
// accumulation, so each output may differ by a few units of the operands'
// rounding relative to the largest term: |got - want| <= f * max|want| + f *
// |want| with f = 5e-2 (bf16) or 1e-2 (fp16).
//
// The kernel source is compiled here by the host compiler
// (FLEET_CUDA_EMULATION, from the fleet_cuda_emulation target).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "trainer/kernels/gpt_cuda_flash_mma.cu"

namespace fleet::trainer::cuda::gpt {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

::testing::AssertionResult Close(const std::string& name, const std::vector<float>& got,
                                 const std::vector<double>& want, TileType tile) {
  const double f = tile == TileType::kBf16 ? 5e-2 : 1e-2;
  double peak = 0.0;
  for (double w : want) peak = std::max(peak, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= f * peak + f * std::fabs(want[i]))) {
      return ::testing::AssertionFailure()
             << name << "[" << i << "]: " << got[i] << " vs " << want[i] << " (peak " << peak
             << ", tolerance " << f << " of peak and of the value)";
    }
  }
  return ::testing::AssertionSuccess();
}

// A layout of queries, keys and values as the kernels take them: Tq queries
// per sequence at positions past .. past + Tq - 1, keys and values at
// positions 0 .. past + Tq - 1.
struct Layout {
  const float* q;
  const float* k;
  const float* v;
  size_t q_batch, kv_batch, q_ld, kv_ld;
  int B, Tq, past, C, NH;
};

struct Forward {
  std::vector<double> out;  // [B, Tq, C]
  std::vector<double> lse;  // [B, NH, Tq]
};

// Causal attention in double precision.
Forward Reference(const Layout& x) {
  const int hs = x.C / x.NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  Forward r{std::vector<double>(size_t(x.B) * x.Tq * x.C),
            std::vector<double>(size_t(x.B) * x.NH * x.Tq)};
  for (int b = 0; b < x.B; ++b) {
    for (int h = 0; h < x.NH; ++h) {
      for (int i = 0; i < x.Tq; ++i) {
        const float* q = x.q + b * x.q_batch + i * x.q_ld + h * hs;
        const int keys = x.past + i + 1;
        std::vector<double> s(keys);
        double peak = -INFINITY;
        for (int j = 0; j < keys; ++j) {
          const float* k = x.k + b * x.kv_batch + j * x.kv_ld + h * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += double{q[d]} * k[d];
          s[j] = dot * scale;
          peak = std::max(peak, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < keys; ++j) sum += std::exp(s[j] - peak);
        r.lse[(size_t(b) * x.NH + h) * x.Tq + i] = peak + std::log(sum);
        for (int j = 0; j < keys; ++j) {
          const double p = std::exp(s[j] - peak) / sum;
          const float* v = x.v + b * x.kv_batch + j * x.kv_ld + h * hs;
          for (int d = 0; d < hs; ++d) r.out[(size_t(b) * x.Tq + i) * x.C + h * hs + d] += p * v[d];
        }
      }
    }
  }
  return r;
}

// Both ways of taking the transposed operands (MmaTransposes): each within
// tolerance of double precision, and the two with the same bits.
void CheckForward(const Layout& x, TileType tile, const std::string& at) {
  const Forward want = Reference(x);
  std::vector<float> outs[2], lses[2];
  for (const MmaTransposes transposes : {MmaTransposes::kCopies, MmaTransposes::kLdMatrix}) {
    const int i = transposes == MmaTransposes::kLdMatrix;
    const std::string where = at + (i ? " ldmatrix" : " copies");
    std::vector<float>& out = outs[i] = std::vector<float>(want.out.size(), -7.0f);
    std::vector<float>& lse = lses[i] = std::vector<float>(want.lse.size(), -7.0f);
    ASSERT_EQ(MmaAttentionForward(out.data(), lse.data(), x.q, x.k, x.v, x.q_batch, x.kv_batch,
                                  x.q_ld, x.kv_ld, x.B, x.Tq, x.past, x.C, x.NH, tile, transposes,
                                  nullptr),
              cudaSuccess)
        << where;
    EXPECT_TRUE(Close(where + " out", out, want.out, tile));
    EXPECT_TRUE(Close(where + " lse", lse, want.lse, tile));
  }
  EXPECT_EQ(outs[0], outs[1]) << at;
  EXPECT_EQ(lses[0], lses[1]) << at;
}

struct Shape {
  int B, T, C, NH;
};

std::string Name(const Shape& s, TileType tile) {
  return std::string(tile == TileType::kBf16 ? "bf16" : "fp16") + " B" + std::to_string(s.B) +
         " T" + std::to_string(s.T) + " C" + std::to_string(s.C) + " NH" + std::to_string(s.NH);
}

// Head sizes 16, 32, 64 and 128 (streamed tiles of 64 and of 32 rows); T
// below, at and past a 64-row block, not a multiple of 16.
const Shape kShapes[] = {{2, 21, 32, 2}, {1, 45, 96, 3}, {1, 100, 128, 2}, {1, 70, 256, 2}};

// Training's layout: q, k and v of each position side by side in qkv [B, T, 3C].
Layout Packed(const std::vector<float>& qkv, const Shape& s) {
  const size_t row = 3 * size_t(s.C);
  return Layout{qkv.data(),
                qkv.data() + s.C,
                qkv.data() + 2 * s.C,
                s.T * row,
                s.T * row,
                row,
                row,
                s.B,
                s.T,
                0,
                s.C,
                s.NH};
}

class MmaAttentionEmulated : public ::testing::TestWithParam<TileType> {};

TEST_P(MmaAttentionEmulated, ForwardOverPackedQkvMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    const auto qkv = Random(size_t(s.B) * s.T * 3 * s.C, 50 + s.T, -1.5f, 1.5f);
    const Layout x = Packed(qkv, s);
    CheckForward(x, GetParam(), Name(s, GetParam()));
  }
}

// Decoding: a few new queries against cached keys and values (separate
// buffers with their own strides), past not a multiple of the tiles.
TEST_P(MmaAttentionEmulated, ForwardAfterCachedPositionsMatchesDoubleReference) {
  const int B = 2, maxT = 90, C = 128, NH = 2;
  const auto kc = Random(size_t(B) * maxT * C, 7), vc = Random(kc.size(), 8);
  for (const auto& [past, Tq] : {std::pair{37, 5}, std::pair{64, 1}, std::pair{3, 70}}) {
    const auto q = Random(size_t(B) * Tq * C, 9 + past);
    const Layout x{q.data(),
                   kc.data(),
                   vc.data(),
                   size_t(Tq) * C,
                   size_t(maxT) * C,
                   size_t(C),
                   size_t(C),
                   B,
                   Tq,
                   past,
                   C,
                   NH};
    CheckForward(x, GetParam(),
                 "past " + std::to_string(past) + " Tq " + std::to_string(Tq) +
                     (GetParam() == TileType::kBf16 ? " bf16" : " fp16"));
  }
}

// dqkv += the gradient, given the reference's lse and the rows' dout . out.
TEST_P(MmaAttentionEmulated, BackwardMatchesDoubleReference) {
  for (const Shape& s : kShapes) {
    const std::string at = Name(s, GetParam());
    const int hs = s.C / s.NH;
    const double scale = 1.0 / std::sqrt(double(hs));
    const size_t row = 3 * size_t(s.C);
    const auto qkv = Random(size_t(s.B) * s.T * row, 60 + s.T, -1.5f, 1.5f);
    const Layout x = Packed(qkv, s);
    const Forward fwd = Reference(x);
    const auto dout = Random(fwd.out.size(), 61 + s.T);
    std::vector<float> lse(fwd.lse.begin(), fwd.lse.end()), dots(fwd.lse.size());
    std::vector<double> want(qkv.size(), 0.0);
    for (int b = 0; b < s.B; ++b) {
      for (int h = 0; h < s.NH; ++h) {
        for (int i = 0; i < s.T; ++i) {
          const size_t o = (size_t(b) * s.T + i) * s.C + h * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += double{dout[o + d]} * fwd.out[o + d];
          dots[(size_t(b) * s.NH + h) * s.T + i] = static_cast<float>(dot);
          const double l = fwd.lse[(size_t(b) * s.NH + h) * s.T + i];
          const float* q = qkv.data() + (size_t(b) * s.T + i) * row + h * hs;
          for (int j = 0; j <= i; ++j) {
            const float* k = qkv.data() + (size_t(b) * s.T + j) * row + s.C + h * hs;
            const float* v = k + s.C;
            double qk = 0.0, dp = 0.0;
            for (int d = 0; d < hs; ++d) {
              qk += double{q[d]} * k[d];
              dp += double{dout[o + d]} * v[d];
            }
            const double p = std::exp(qk * scale - l);
            const double ds = p * (dp - dot) * scale;
            double* dq = want.data() + (size_t(b) * s.T + i) * row + h * hs;
            double* dk = want.data() + (size_t(b) * s.T + j) * row + s.C + h * hs;
            double* dv = dk + s.C;
            for (int d = 0; d < hs; ++d) {
              dq[d] += ds * k[d];
              dk[d] += ds * q[d];
              dv[d] += p * dout[o + d];
            }
          }
        }
      }
    }
    // The kernels add into dqkv: start from a non-zero gradient. Both ways
    // of taking the transposed operands, with the same bits.
    const auto start = Random(qkv.size(), 62);
    std::vector<float> results[2];
    for (const MmaTransposes transposes : {MmaTransposes::kCopies, MmaTransposes::kLdMatrix}) {
      const int t = transposes == MmaTransposes::kLdMatrix;
      const std::string where = at + (t ? " ldmatrix" : " copies");
      std::vector<float>& dqkv = results[t] = start;
      ASSERT_EQ(MmaAttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), dots.data(),
                                     s.B, s.T, s.C, s.NH, GetParam(), transposes, nullptr),
                cudaSuccess)
          << where;
      // q, k and v gradients separately: their scales differ.
      for (int part = 0; part < 3; ++part) {
        std::vector<float> got;
        std::vector<double> expected;
        for (size_t r = 0; r < size_t(s.B) * s.T; ++r) {
          for (int c = 0; c < s.C; ++c) {
            const size_t i = r * row + part * s.C + c;
            got.push_back(dqkv[i] - start[i]);
            expected.push_back(want[i]);
          }
        }
        EXPECT_TRUE(Close(where + " d" + "qkv"[part], got, expected, GetParam()));
      }
    }
    EXPECT_EQ(results[0], results[1]) << at;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiles, MmaAttentionEmulated,
                         ::testing::Values(TileType::kBf16, TileType::kFp16), [](const auto& info) {
                           return std::string(info.param == TileType::kBf16 ? "Bf16" : "Fp16");
                         });

}  // namespace
}  // namespace fleet::trainer::cuda::gpt
