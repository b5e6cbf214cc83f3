#include "trainer/kernels/gpt_cpu_kernels.h"

#include <cblas.h>
#include <glog/logging.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "comm/vector_clones.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/kernels/fast_exp.h"
#include "trainer/kernels/philox.h"

// The element-wise loops below are written so that GCC vectorises them
// (this file is built with -O3 -fno-math-errno -fopenmp-simd
// -ffp-contract=off); the hot ones are compiled for AVX-512, AVX2 and
// baseline x86-64 (FLEET_VECTOR_CLONES). ExpF is trainer/kernels/fast_exp.h's.

namespace fleet::trainer {

namespace {

// ---- building blocks ---------------------------------------------------------------

// C = alpha op(A) op(B) + beta C (row-major, explicit leading dimensions).
void Sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[int64_t{i} * ldc + j];
        c = beta == 0.0f ? 0.0f : beta * c;
      }
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// [0, n) cut into `count` blocks of `step` (the last may be shorter).
struct Blocks {
  int64_t n = 0, step = 1;
  size_t count = 0;
  int64_t begin(size_t i) const { return static_cast<int64_t>(i) * step; }
  int64_t end(size_t i) const { return std::min(n, begin(i) + step); }
};

// About `per_worker` blocks per worker (for balance when another process
// takes a core for a while), none smaller than `min_block`, each a multiple
// of `align` long.
Blocks Split(int64_t n, int workers, int64_t min_block, int per_worker, int64_t align = 1) {
  Blocks b;
  b.n = n;
  if (n <= 0) return b;
  const int64_t want = std::max<int64_t>(
      1, std::min<int64_t>(int64_t{workers} * per_worker, n / std::max<int64_t>(1, min_block)));
  int64_t step = (n + want - 1) / want;
  step = (step + align - 1) / align * align;
  b.step = step;
  b.count = static_cast<size_t>((n + step - 1) / step);
  return b;
}

// GEMM blocks: a few per worker, at least 64 rows (OpenBLAS's kernels work on
// panels of 16-32 rows; below ~64 the per-call packing of the other operand
// stops paying for itself), aligned to 16.
constexpr int kGemmBlocksPerWorker = 2;
constexpr int64_t kGemmMinRows = 64;
// Element-wise work: blocks of at least this many elements.
constexpr int64_t kMinElements = 16384;
constexpr int kBlocksPerWorker = 4;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// tanh(u) = 1 - 2 / (exp(2u) + 1); saturates correctly at both ends.
FLEET_INLINE float TanhF(float u) { return 1.0f - 2.0f / (ExpF(2.0f * u) + 1.0f); }

// ---- vectorised row and range loops ---------------------------------------------------

FLEET_VECTOR_CLONES void GeluForwardRange(float* out, const float* inp, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + TanhF(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

FLEET_VECTOR_CLONES void GeluBackwardRange(float* dinp, const float* inp, const float* dout,
                                         size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float th = TanhF(kGeluScale * (x + kGeluCubic * x * x * x));
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluScale *
                                                (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = grad * dout[i];
  }
}

FLEET_VECTOR_CLONES float MaxOf(const float* x, int n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum_i exp(x[i] - shift), summed in float lanes then double.
FLEET_VECTOR_CLONES double SumExp(const float* x, int n, float shift) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += ExpF(x[i] - shift);
  return s;
}

// x[i] = exp(x[i] - shift); returns the sum.
FLEET_VECTOR_CLONES double ExpInPlace(float* x, int n, float shift) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) {
    x[i] = ExpF(x[i] - shift);
    s += x[i];
  }
  return s;
}

FLEET_VECTOR_CLONES void ScaleRange(float* x, int n, float a) {
#pragma omp simd
  for (int i = 0; i < n; ++i) x[i] *= a;
}

// The causal softmax of one row of scores: p[j] = exp(p[j] - max) / sum over
// j in [0, len); p[j] = 0 for j in [len, zero_to).
FLEET_VECTOR_CLONES void CausalSoftmaxRow(float* p, int len, int zero_to) {
  const float m = MaxOf(p, len);
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < len; ++j) {
    p[j] = ExpF(p[j] - m);
    s += p[j];
  }
  const float inv = 1.0f / s;
#pragma omp simd
  for (int j = 0; j < len; ++j) p[j] *= inv;
  for (int j = len; j < zero_to; ++j) p[j] = 0.0f;
}

// Softmax backward of one row, in place on dp: dp[j] = scale p[j] (dp[j] -
// sum_k p[k] dp[k]) for j < len; 0 for j in [len, zero_to).
FLEET_VECTOR_CLONES void SoftmaxBackwardRow(float* dp, const float* p, int len, int zero_to,
                                          float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < len; ++j) dot += p[j] * dp[j];
#pragma omp simd
  for (int j = 0; j < len; ++j) dp[j] = scale * p[j] * (dp[j] - dot);
  for (int j = len; j < zero_to; ++j) dp[j] = 0.0f;
}

FLEET_VECTOR_CLONES void LayerNormRow(float* out, float* mean_out, float* rstd_out, const float* x,
                                    const float* w, const float* b, int C) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < C; ++c) s += x[c];
  const float m = s / C;
  float v = 0.0f;
#pragma omp simd reduction(+ : v)
  for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
  const float rs = 1.0f / std::sqrt(v / C + kLayerNormEps);
#pragma omp simd
  for (int c = 0; c < C; ++c) out[c] = (x[c] - m) * rs * w[c] + b[c];
  *mean_out = m;
  *rstd_out = rs;
}

FLEET_VECTOR_CLONES void LayerNormBackwardRow(float* dx, const float* d, const float* x,
                                            const float* w, float m, float rs, int C) {
  float dmean = 0.0f, dnorm_mean = 0.0f;
#pragma omp simd reduction(+ : dmean, dnorm_mean)
  for (int c = 0; c < C; ++c) {
    const float dn = w[c] * d[c];
    dmean += dn;
    dnorm_mean += dn * (x[c] - m) * rs;
  }
  dmean /= C;
  dnorm_mean /= C;
#pragma omp simd
  for (int c = 0; c < C; ++c) {
    const float norm = (x[c] - m) * rs;
    dx[c] += (w[c] * d[c] - dmean - norm * dnorm_mean) * rs;
  }
}

// dw[c] += norm(x)[c] d[c]; db[c] += d[c] over c in one row's column range.
FLEET_VECTOR_CLONES void LayerNormParamRow(float* dw, float* db, const float* d, const float* x,
                                         float m, float rs, int n) {
#pragma omp simd
  for (int c = 0; c < n; ++c) {
    dw[c] += (x[c] - m) * rs * d[c];
    db[c] += d[c];
  }
}

FLEET_VECTOR_CLONES void AddRange(float* y, const float* x, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += x[i];
}

FLEET_VECTOR_CLONES double SumOfSquaresRange(const float* x, size_t n) {
  // Float lanes over short stretches, folded into double, so that the sum of
  // a 100M-element arena keeps its precision.
  double total = 0.0;
  constexpr size_t kStretch = 4096;
  for (size_t i0 = 0; i0 < n; i0 += kStretch) {
    const size_t i1 = std::min(n, i0 + kStretch);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (size_t i = i0; i < i1; ++i) s += x[i] * x[i];
    total += s;
  }
  return total;
}

FLEET_VECTOR_CLONES void AdamWRange(float* p, const float* g, float* m, float* v, size_t n,
                                  AdamWStep s) {
  const float inv_bc1 = 1.0f / s.bias_correction1;
  const float inv_bc2 = 1.0f / s.bias_correction2;
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= s.lr * ((mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + s.eps) + s.weight_decay * p[i]);
  }
}

// out[i] = (residual ? residual[i] : 0) + (kept(index0 + i) ? in[i] * scale : 0)
// for i < n, element index0 + i of the dropout stream (stream, lane); the
// mask's bits are drawn four elements at a time. out may alias in or
// residual.
void DropoutRange(float* out, const float* in, const float* residual, size_t n, uint64_t index0,
                  const DropoutSpec& d, uint32_t stream, uint32_t lane) {
  const uint32_t threshold = philox::DropoutThreshold(d.p);
  const float scale = d.scale();
  philox::Bits4 bits{};
  for (size_t i = 0; i < n; ++i) {
    const uint64_t index = index0 + i;
    if (i == 0 || (index & 3) == 0) {
      bits = philox::DropoutGroupBits(d.seed, d.site, stream, lane, index >> 2);
    }
    const float kept = bits.v[index & 3] >= threshold ? in[i] * scale : 0.0f;
    out[i] = residual != nullptr ? residual[i] + kept : kept;
  }
}

}  // namespace

// ---- CpuGptKernels --------------------------------------------------------------------

CpuGptKernels::CpuGptKernels(ThreadPool* pool)
    : pool_(pool), workers_(pool ? pool->size() + 1 : 1) {}

void CpuGptKernels::For(size_t n, const std::function<void(size_t)>& fn) const {
  if (pool_ == nullptr || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool_->ParallelFor(n, fn);
}

// The whole vocabulary is the shard [0, INT_MAX): one code path for both.
void CpuGptKernels::EncoderForward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int B, int T, int C) {
  EncoderShardForward(out, tokens, wte, wpe, B, T, C, 0, std::numeric_limits<int>::max());
}

void CpuGptKernels::EncoderBackward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int B, int T, int C) {
  EncoderShardBackward(dwte, dwpe, dout, tokens, B, T, C, 0, std::numeric_limits<int>::max());
}

void CpuGptKernels::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* weight, const float* bias, int N, int C) {
  const Blocks rows = Split(N, workers_, std::max<int64_t>(1, kMinElements / C), kBlocksPerWorker);
  For(rows.count, [&](size_t blk) {
    for (int64_t i = rows.begin(blk); i < rows.end(blk); ++i) {
      LayerNormRow(out + i * C, mean + i, rstd + i, inp + i * C, weight, bias, C);
    }
  });
}

void CpuGptKernels::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, const float* mean,
                                      const float* rstd, int N, int C) {
  // Input gradient by row blocks, parameter gradients by column blocks (each
  // summed over all rows in order): no shared accumulators, fixed order.
  const Blocks rows = Split(N, workers_, std::max<int64_t>(1, kMinElements / C), kBlocksPerWorker);
  const Blocks cols = dweight != nullptr ? Split(C, workers_, 16, 1, 16) : Blocks{};
  For(rows.count + cols.count, [&](size_t task) {
    if (task < rows.count) {
      for (int64_t i = rows.begin(task); i < rows.end(task); ++i) {
        LayerNormBackwardRow(dinp + i * C, dout + i * C, inp + i * C, weight, mean[i], rstd[i], C);
      }
      return;
    }
    const size_t blk = task - rows.count;
    const int64_t c0 = cols.begin(blk), n = cols.end(blk) - c0;
    for (int64_t i = 0; i < N; ++i) {
      LayerNormParamRow(dweight + c0, dbias + c0, dout + i * C + c0, inp + i * C + c0, mean[i],
                        rstd[i], static_cast<int>(n));
    }
  });
}

void CpuGptKernels::MatmulForward(float* out, const float* inp, const float* weight,
                                  const float* bias, int N, int IC, int OC, bool accumulate) {
  // Blocks of output rows when there are enough rows; else of output columns
  // (e.g. the head over a few positions while generating).
  const bool by_rows = N >= workers_ * kGemmMinRows || N >= OC;
  const Blocks blocks = Split(by_rows ? N : OC, workers_, kGemmMinRows, kGemmBlocksPerWorker, 16);
  For(blocks.count, [&](size_t blk) {
    const int64_t b0 = blocks.begin(blk), n = blocks.end(blk) - b0;
    const int64_t r0 = by_rows ? b0 : 0, rows = by_rows ? n : N;
    const int64_t o0 = by_rows ? 0 : b0, cols = by_rows ? OC : n;
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias) {
      for (int64_t r = r0; r < r0 + rows; ++r) {
        float* o = out + r * OC + o0;
        if (accumulate) {
          AddRange(o, bias + o0, static_cast<int>(cols));
        } else {
          std::memcpy(o, bias + o0, cols * sizeof(float));
        }
      }
      beta = 1.0f;
    }
    Sgemm(false, true, static_cast<int>(rows), static_cast<int>(cols), IC, 1.0f, inp + r0 * IC, IC,
          weight + o0 * IC, IC, beta, out + r0 * OC + o0, OC);
  });
}

void CpuGptKernels::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, int N, int IC, int OC) {
  // One round of tasks: blocks of dinp (rows, or columns when N is small)
  // and blocks of dweight/dbias rows. They write disjoint memory.
  const bool by_rows = N >= workers_ * kGemmMinRows || N >= IC;
  const Blocks in_blocks =
      dinp ? Split(by_rows ? N : IC, workers_, kGemmMinRows, kGemmBlocksPerWorker, 16) : Blocks{};
  // A frozen weight (dweight null) gets no weight or bias gradient tasks.
  const Blocks w_blocks =
      dweight ? Split(OC, workers_, kGemmMinRows, kGemmBlocksPerWorker, 16) : Blocks{};
  For(in_blocks.count + w_blocks.count, [&](size_t task) {
    if (task < in_blocks.count) {
      const int64_t b0 = in_blocks.begin(task), n = in_blocks.end(task) - b0;
      if (by_rows) {
        Sgemm(false, false, static_cast<int>(n), IC, OC, 1.0f, dout + b0 * OC, OC, weight, IC, 1.0f,
              dinp + b0 * IC, IC);
      } else {
        Sgemm(false, false, N, static_cast<int>(n), OC, 1.0f, dout, OC, weight + b0, IC, 1.0f,
              dinp + b0, IC);
      }
      return;
    }
    const size_t blk = task - in_blocks.count;
    const int64_t o0 = w_blocks.begin(blk), n = w_blocks.end(blk) - o0;
    Sgemm(true, false, static_cast<int>(n), IC, N, 1.0f, dout + o0, OC, inp, IC, 1.0f,
          dweight + o0 * IC, IC);
    if (dbias) {
      for (int64_t i = 0; i < N; ++i) AddRange(dbias + o0, dout + i * OC + o0, static_cast<int>(n));
    }
  });
}

int CpuGptKernels::AttentionTasks(int B, int NH) const {
  return std::max(1, std::min(B * NH, workers_ * kBlocksPerWorker));
}

size_t CpuGptKernels::AttentionSavedFloats(int B, int T, int NH) const {
  return size_t(B) * NH * T * T;
}

size_t CpuGptKernels::AttentionScratchFloats(int B, int T, int NH) const {
  return size_t(AttentionTasks(B, NH)) * std::min(T, kAttentionRowBlock) * T;
}

void CpuGptKernels::AttentionForward(float* out, float* saved, float* scratch, const float* qkv,
                                     int B, int T, int C, int NH, const DropoutSpec& dropout) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int tasks = AttentionTasks(B, NH);
  const Blocks pairs = Split(int64_t{B} * NH, tasks, 1, 1);
  const int64_t block_floats = int64_t{std::min(T, kAttentionRowBlock)} * T;
  For(pairs.count, [&](size_t task) {
    // With dropout: the row block's dropped probabilities [rows, i1] (the
    // saved ones stay whole for backward).
    float* dropped = scratch + static_cast<int64_t>(task) * block_floats;
    for (int64_t bh = pairs.begin(task); bh < pairs.end(task); ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const float* q = qkv + b * T * 3 * C + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* att = saved + bh * T * T;
      float* o = out + b * T * C + h * hs;
      for (int i0 = 0; i0 < T; i0 += kAttentionRowBlock) {
        const int i1 = std::min(T, i0 + kAttentionRowBlock), rows = i1 - i0;
        // Scores of queries [i0, i1) against keys [0, i1): the keys they see.
        Sgemm(false, true, rows, i1, hs, scale, q + int64_t{i0} * 3 * C, 3 * C, k, 3 * C, 0.0f,
              att + int64_t{i0} * T, T);
        for (int i = i0; i < i1; ++i) CausalSoftmaxRow(att + int64_t{i} * T, i + 1, i1);
        const float* weights = att + int64_t{i0} * T;
        int ld = T;
        if (dropout.enabled()) {
          for (int i = i0; i < i1; ++i) {
            float* row = dropped + int64_t{i - i0} * i1;
            DropoutRange(row, att + int64_t{i} * T, nullptr, i + 1, uint64_t(i) * T, dropout,
                         dropout.streams[b], static_cast<uint32_t>(dropout.head_offset + h));
            std::fill(row + i + 1, row + i1, 0.0f);
          }
          weights = dropped;
          ld = i1;
        }
        Sgemm(false, false, rows, hs, i1, 1.0f, weights, ld, v, 3 * C, 0.0f, o + int64_t{i0} * C,
              C);
      }
    }
  });
}

void CpuGptKernels::AttentionBackward(float* dqkv, float* scratch, const float* dout,
                                      const float* qkv, const float* /*out*/, const float* saved,
                                      int B, int T, int C, int NH, const DropoutSpec& dropout) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int tasks = AttentionTasks(B, NH);
  const Blocks pairs = Split(int64_t{B} * NH, tasks, 1, 1);
  const int64_t block_floats = int64_t{std::min(T, kAttentionRowBlock)} * T;
  For(pairs.count, [&](size_t task) {
    float* dp = scratch + static_cast<int64_t>(task) * block_floats;  // [rows, i1]
    for (int64_t bh = pairs.begin(task); bh < pairs.end(task); ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const uint32_t stream = dropout.enabled() ? dropout.streams[b] : 0;
      const uint32_t lane = static_cast<uint32_t>(dropout.head_offset + h);
      const float* q = qkv + b * T * 3 * C + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + b * T * 3 * C + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* att = saved + bh * T * T;
      const float* dO = dout + b * T * C + h * hs;
      for (int i0 = 0; i0 < T; i0 += kAttentionRowBlock) {
        const int i1 = std::min(T, i0 + kAttentionRowBlock), rows = i1 - i0;
        const float* p = att + int64_t{i0} * T;
        if (dropout.enabled()) {
          // dV += P'^T dO with P' the dropped probabilities (built in dp
          // first), then dP = mask * (dO V^T): the softmax's backward takes
          // the gradient of the probabilities before dropout.
          for (int i = i0; i < i1; ++i) {
            float* row = dp + int64_t{i - i0} * i1;
            DropoutRange(row, p + int64_t{i - i0} * T, nullptr, i + 1, uint64_t(i) * T, dropout,
                         stream, lane);
            std::fill(row + i + 1, row + i1, 0.0f);
          }
          Sgemm(true, false, i1, hs, rows, 1.0f, dp, i1, dO + int64_t{i0} * C, C, 1.0f, dv, 3 * C);
          Sgemm(false, true, rows, i1, hs, 1.0f, dO + int64_t{i0} * C, C, v, 3 * C, 0.0f, dp, i1);
          for (int i = i0; i < i1; ++i) {
            float* row = dp + int64_t{i - i0} * i1;
            DropoutRange(row, row, nullptr, i + 1, uint64_t(i) * T, dropout, stream, lane);
          }
        } else {
          // dP = dO V^T;  dV += P^T dO.
          Sgemm(false, true, rows, i1, hs, 1.0f, dO + int64_t{i0} * C, C, v, 3 * C, 0.0f, dp, i1);
          Sgemm(true, false, i1, hs, rows, 1.0f, p, T, dO + int64_t{i0} * C, C, 1.0f, dv, 3 * C);
        }
        // dS = scale * P (dP - rowsum(P dP)), zero above the diagonal.
        for (int i = i0; i < i1; ++i) {
          SoftmaxBackwardRow(dp + int64_t{i - i0} * i1, p + int64_t{i - i0} * T, i + 1, i1, scale);
        }
        // dQ += dS K;  dK += dS^T Q.
        Sgemm(false, false, rows, hs, i1, 1.0f, dp, i1, k, 3 * C, 1.0f, dq + int64_t{i0} * 3 * C,
              3 * C);
        Sgemm(true, false, i1, hs, rows, 1.0f, dp, i1, q + int64_t{i0} * 3 * C, 3 * C, 1.0f, dk,
              3 * C);
      }
    }
  });
}

void CpuGptKernels::AttentionDecodeForward(float* out, float* k_cache, float* v_cache,
                                           float* scratch, const float* qkv, int B, int T, int past,
                                           int maxT, int C, int NH) {
  for (int64_t b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* row = qkv + (b * T + t) * 3 * C;
      const int64_t dst = (b * maxT + past + t) * C;
      std::memcpy(k_cache + dst, row + C, C * sizeof(float));
      std::memcpy(v_cache + dst, row + 2 * C, C * sizeof(float));
    }
  }
  const int hs = C / NH, S = past + T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const Blocks pairs = Split(int64_t{B} * NH, AttentionTasks(B, NH), 1, 1);
  For(pairs.count, [&](size_t task) {
    for (int64_t bh = pairs.begin(task); bh < pairs.end(task); ++bh) {
      const int64_t b = bh / NH, h = bh % NH;
      const float* q = qkv + b * T * 3 * C + h * hs;
      const float* k = k_cache + b * maxT * C + h * hs;
      const float* v = v_cache + b * maxT * C + h * hs;
      float* att = scratch + bh * T * S;
      // Scores of the T queries against every key up to the last new one;
      // query t sees keys [0, past + t].
      Sgemm(false, true, T, S, hs, scale, q, 3 * C, k, C, 0.0f, att, S);
      for (int t = 0; t < T; ++t) CausalSoftmaxRow(att + int64_t{t} * S, past + t + 1, S);
      Sgemm(false, false, T, hs, S, 1.0f, att, S, v, C, 0.0f, out + b * T * C + h * hs, C);
    }
  });
}

void CpuGptKernels::GeluForward(float* out, const float* inp, size_t n) {
  const Blocks blocks =
      Split(static_cast<int64_t>(n), workers_, kMinElements, kBlocksPerWorker, 16);
  For(blocks.count, [&](size_t blk) {
    const int64_t b0 = blocks.begin(blk);
    GeluForwardRange(out + b0, inp + b0, blocks.end(blk) - b0);
  });
}

void CpuGptKernels::GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  const Blocks blocks =
      Split(static_cast<int64_t>(n), workers_, kMinElements, kBlocksPerWorker, 16);
  For(blocks.count, [&](size_t blk) {
    const int64_t b0 = blocks.begin(blk);
    GeluBackwardRange(dinp + b0, inp + b0, dout + b0, blocks.end(blk) - b0);
  });
}

void CpuGptKernels::DropoutForward(float* out, const float* inp, const float* residual, int B,
                                   size_t n, const DropoutSpec& dropout) {
  // Blocks of each sequence's elements, aligned to the mask's groups of 4.
  const Blocks blocks =
      Split(static_cast<int64_t>(n), workers_, kMinElements, kBlocksPerWorker, 16);
  For(size_t(B) * blocks.count, [&](size_t task) {
    const size_t b = task / blocks.count, blk = task % blocks.count;
    const int64_t i0 = blocks.begin(blk);
    const size_t at = b * n + i0;
    DropoutRange(out + at, inp + at, residual ? residual + at : nullptr, blocks.end(blk) - i0,
                 uint64_t(i0), dropout, dropout.streams[b], 0);
  });
}

void CpuGptKernels::DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                                    const DropoutSpec& dropout) {
  DropoutForward(dinp, dout, nullptr, B, n, dropout);
}

void CpuGptKernels::CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N,
                                        int V, float dloss, bool write_dlogits) {
  const Blocks rows = Split(N, workers_, 1, kBlocksPerWorker);
  For(rows.count, [&](size_t blk) {
    for (int64_t i = rows.begin(blk); i < rows.end(blk); ++i) {
      float* z = logits + i * V;
      const int32_t target = targets[i];
      if (target < 0) {
        losses[i] = 0.0f;
        if (write_dlogits) std::memset(z, 0, sizeof(float) * V);
        continue;
      }
      const float m = MaxOf(z, V);
      const float picked = z[target];
      if (!write_dlogits) {
        losses[i] = static_cast<float>(std::log(SumExp(z, V, m)) + m - picked);
        continue;
      }
      const double sum = ExpInPlace(z, V, m);  // z = exp(z - max)
      losses[i] = static_cast<float>(std::log(sum) + m - picked);
      ScaleRange(z, V, static_cast<float>(dloss / sum));  // dloss * softmax
      z[target] -= dloss;
    }
  });
}

void CpuGptKernels::EncoderShardForward(float* out, const int32_t* tokens, const float* wte,
                                        const float* wpe, int B, int T, int C, int v_begin, int V) {
  const int64_t N = int64_t{B} * T;
  const Blocks rows = Split(N, workers_, std::max<int64_t>(1, kMinElements / C), kBlocksPerWorker);
  For(rows.count, [&](size_t blk) {
    for (int64_t i = rows.begin(blk); i < rows.end(blk); ++i) {
      float* o = out + i * C;
      const int64_t row = int64_t{tokens[i]} - v_begin;
      if (wpe != nullptr) {
        std::memcpy(o, wpe + (i % T) * C, sizeof(float) * C);
      } else {
        std::memset(o, 0, sizeof(float) * C);
      }
      if (row >= 0 && row < V) AddRange(o, wte + row * C, C);
    }
  });
}

void CpuGptKernels::EncoderShardBackward(float* dwte, float* dwpe, const float* dout,
                                         const int32_t* tokens, int B, int T, int C, int v_begin,
                                         int V) {
  // Positions: each task owns rows of dwpe. Tokens: two rows may hit the same
  // dwte row, so each task owns a column range of dwte instead and walks all
  // rows in order (deterministic, no atomics).
  const Blocks pos =
      Split(T, workers_, std::max<int64_t>(1, kMinElements / (int64_t{B} * C)), kBlocksPerWorker);
  const Blocks cols = Split(C, workers_, 16, 1, 16);
  For(pos.count + cols.count, [&](size_t task) {
    if (task < pos.count) {
      for (int64_t t = pos.begin(task); t < pos.end(task); ++t) {
        for (int b = 0; b < B; ++b) AddRange(dwpe + t * C, dout + (int64_t{b} * T + t) * C, C);
      }
      return;
    }
    const size_t blk = task - pos.count;
    const int64_t c0 = cols.begin(blk), n = cols.end(blk) - c0;
    for (int64_t i = 0; i < int64_t{B} * T; ++i) {
      const int64_t row = int64_t{tokens[i]} - v_begin;
      if (row < 0 || row >= V) continue;
      AddRange(dwte + row * C + c0, dout + i * C + c0, static_cast<int>(n));
    }
  });
}

void CpuGptKernels::CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) {
  const Blocks rows = Split(N, workers_, 1, kBlocksPerWorker);
  For(rows.count, [&](size_t blk) {
    for (int64_t i = rows.begin(blk); i < rows.end(blk); ++i) row_max[i] = MaxOf(logits + i * V, V);
  });
}

void CpuGptKernels::CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                                          const int32_t* targets, int N, int V, int v_begin) {
  const Blocks rows = Split(N, workers_, 1, kBlocksPerWorker);
  For(rows.count, [&](size_t blk) {
    for (int64_t i = rows.begin(blk); i < rows.end(blk); ++i) {
      const float* z = logits + i * V;
      const int64_t target = int64_t{targets[i]} - v_begin;
      sums[i] = static_cast<float>(SumExp(z, V, row_max[i]));
      sums[N + i] = targets[i] >= 0 && target >= 0 && target < V ? z[target] : 0.0f;
    }
  });
}

void CpuGptKernels::CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                                            const float* sums, const int32_t* targets, int N, int V,
                                            int v_begin, float dloss, bool write_dlogits) {
  const Blocks rows = Split(N, workers_, 1, kBlocksPerWorker);
  For(rows.count, [&](size_t blk) {
    for (int64_t i = rows.begin(blk); i < rows.end(blk); ++i) {
      float* z = logits + i * V;
      if (targets[i] < 0) {
        losses[i] = 0.0f;
        if (write_dlogits) std::memset(z, 0, sizeof(float) * V);
        continue;
      }
      losses[i] = static_cast<float>(std::log(double{sums[i]}) + row_max[i] - sums[N + i]);
      if (!write_dlogits) continue;
      ExpInPlace(z, V, row_max[i]);  // z = exp(z - max)
      ScaleRange(z, V, static_cast<float>(dloss / sums[i]));
      const int64_t target = int64_t{targets[i]} - v_begin;
      if (target >= 0 && target < V) z[target] -= dloss;
    }
  });
}

double CpuGptKernels::SumOfSquares(const float* x, size_t n) {
  constexpr size_t kMaxBlocks = 64;
  const Blocks blocks =
      Split(static_cast<int64_t>(n), std::min(workers_, 16), kMinElements, kBlocksPerWorker, 16);
  CHECK_LE(blocks.count, kMaxBlocks);
  std::array<double, kMaxBlocks> partial{};
  For(blocks.count, [&](size_t blk) {
    const int64_t b0 = blocks.begin(blk);
    partial[blk] = SumOfSquaresRange(x + b0, blocks.end(blk) - b0);
  });
  double total = 0.0;
  for (size_t i = 0; i < blocks.count; ++i) total += partial[i];
  return total;
}

void CpuGptKernels::AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                                const AdamWStep& step) {
  const Blocks blocks =
      Split(static_cast<int64_t>(n), workers_, kMinElements, kBlocksPerWorker, 16);
  For(blocks.count, [&](size_t blk) {
    const int64_t b0 = blocks.begin(blk);
    AdamWRange(p + b0, g + b0, m + b0, v + b0, blocks.end(blk) - b0, step);
  });
}

std::unique_ptr<ThreadPool> SetUpGptCpuThreads(int num_threads) {
  CHECK_GE(num_threads, 1);
  kernels::SetBlasThreads(1);
  if (num_threads == 1) return nullptr;
  return std::make_unique<ThreadPool>(num_threads - 1);
}

}  // namespace fleet::trainer
