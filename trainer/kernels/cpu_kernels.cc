#include "trainer/kernels/cpu_kernels.h"

#include <cblas.h>
#include <glog/logging.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "comm/vector_clones.h"

namespace fleet::trainer::kernels {

void SetBlasThreads(int num_threads) { openblas_set_num_threads(std::max(1, num_threads)); }
int BlasThreads() { return openblas_get_num_threads(); }
const char* BlasKernels() { return openblas_get_corename(); }

void ParallelRange(ThreadPool* pool, size_t n, size_t grain,
                   absl::FunctionRef<void(size_t, size_t)> fn) {
  grain = std::max<size_t>(grain, 1);
  if (pool == nullptr || n < 2 * grain) {
    if (n) fn(0, n);
    return;
  }
  // One chunk per worker (pool threads + caller), never below the grain.
  const size_t workers = static_cast<size_t>(pool->size()) + 1;
  const size_t chunks = std::min(workers, n / grain);
  const size_t step = (n + chunks - 1) / chunks;
  pool->ParallelFor(chunks, [&](size_t c) {
    const size_t begin = c * step;
    const size_t end = std::min(n, begin + step);
    if (begin < end) fn(begin, end);
  });
}

// Rows of work per chunk so that a chunk has about kParallelGrain elements.
static size_t RowGrain(int cols) { return std::max<size_t>(1, kParallelGrain / std::max(1, cols)); }

// ---- GEMM -----------------------------------------------------------------

void GemmBlas(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
              const float* B, float beta, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS leaves C alone when K == 0 only for beta == 1; be explicit.
    for (int64_t i = 0; i < int64_t{M} * N; ++i) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
    return;
  }
  const int lda = trans_a ? M : K;
  const int ldb = trans_b ? K : N;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
}

void GemmNaive(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
               const float* B, float beta, float* C) {
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int k = 0; k < K; ++k) {
        const float a = trans_a ? A[int64_t{k} * M + i] : A[int64_t{i} * K + k];
        const float b = trans_b ? B[int64_t{j} * K + k] : B[int64_t{k} * N + j];
        acc += double{a} * b;
      }
      float& c = C[int64_t{i} * N + j];
      c = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : double{beta} * c));
    }
  }
}

// ---- bias -----------------------------------------------------------------

void BiasAddForward(float* y, const float* bias, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    float* yr = y + int64_t{r} * cols;
    for (int c = 0; c < cols; ++c) yr[c] += bias[c];
  }
}

void BiasBackward(float* dbias, const float* dy, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    const float* dyr = dy + int64_t{r} * cols;
    for (int c = 0; c < cols; ++c) dbias[c] += dyr[c];
  }
}

// ---- activations ----------------------------------------------------------

// The element-wise loops below are compiled for AVX-512, AVX2 and the
// baseline (FLEET_VECTOR_CLONES); this file's -O3 vectorises them. Each
// takes __restrict pointers: its buffers must not overlap.

// Runs body(begin, end) over [0, n) on the pool and the caller (see
// ParallelRange).
template <typename Body>
static void ForChunks(size_t n, ThreadPool* pool, Body body) {
  ParallelRange(pool, n, kParallelGrain, body);
}

// tanh(x) to within a few ulp (checked against double tanh on a dense grid
// by kernels_test), branch-free so that loops over it vectorise; glibc's
// tanhf is a scalar call of ~20 ns. For |x| < 0.3 the odd Taylor series to
// x^13 (truncation below 1e-9 relative); above, (1 - e) / (1 + e) with
// e = exp(-2|x|), whose exp is a degree-7 polynomial on [-ln2/2, ln2/2]
// scaled by 2^n. |x| is clamped to 9, beyond which tanh rounds to 1.
static inline float TanhFast(float x) {
  const float a = std::min(std::fabs(x), 9.0f);
  const float a2 = a * a;
  float poly = 21844.0f / 6081075.0f;
  poly = -1382.0f / 155925.0f + a2 * poly;
  poly = 62.0f / 2835.0f + a2 * poly;
  poly = -17.0f / 315.0f + a2 * poly;
  poly = 2.0f / 15.0f + a2 * poly;
  poly = -1.0f / 3.0f + a2 * poly;
  const float small = a + a * a2 * poly;
  // exp(z), z = -2a in [-18, 0]: z = n ln2 + r, |r| <= ln2 / 2, n = round(z
  // log2 e) (0.5 - z log2 e > 0, so the conversion's truncation is a floor).
  const float z = -2.0f * a;
  const int32_t n = -static_cast<int32_t>(0.5f - z * 1.44269504f);
  const float nf = static_cast<float>(n);
  const float r = (z - nf * 0.693359375f) + nf * 2.12194440e-4f;  // ln2 in two parts
  float e = 1.0f / 5040.0f;
  e = 1.0f / 720.0f + r * e;
  e = 1.0f / 120.0f + r * e;
  e = 1.0f / 24.0f + r * e;
  e = 1.0f / 6.0f + r * e;
  e = 0.5f + r * e;
  e = 1.0f + r * e;
  e = 1.0f + r * e;
  e *= std::bit_cast<float>((n + 127) << 23);  // 2^n, n in [-26, 0]: a normal float
  const float large = (1.0f - e) / (1.0f + e);
  return std::copysign(a < 0.3f ? small : large, x);
}

FLEET_VECTOR_CLONES
static void TanhRange(float* __restrict y, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = TanhFast(x[i]);
}
FLEET_VECTOR_CLONES
static void ReluRange(float* __restrict y, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
// dx += dy * act'(y).
FLEET_VECTOR_CLONES
static void ActBackwardRange(float* __restrict dx, const float* __restrict y,
                             const float* __restrict dy, size_t n, Activation act) {
  if (act == Activation::kTanh) {
    for (size_t i = 0; i < n; ++i) dx[i] += dy[i] * (1.0f - y[i] * y[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dx[i] += y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

void TanhForward(float* y, const float* x, size_t n, ThreadPool* pool) {
  ForChunks(n, pool, [=](size_t b, size_t e) { TanhRange(y + b, x + b, e - b); });
}
void TanhBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool) {
  ForChunks(n, pool, [=](size_t b, size_t e) {
    ActBackwardRange(dx + b, y + b, dy + b, e - b, Activation::kTanh);
  });
}
void ReluForward(float* y, const float* x, size_t n, ThreadPool* pool) {
  ForChunks(n, pool, [=](size_t b, size_t e) { ReluRange(y + b, x + b, e - b); });
}
void ReluBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool) {
  ForChunks(n, pool, [=](size_t b, size_t e) {
    ActBackwardRange(dx + b, y + b, dy + b, e - b, Activation::kRelu);
  });
}

// One row: y = act(y + bias).
FLEET_VECTOR_CLONES
static void BiasActRow(float* __restrict y, const float* __restrict bias, int cols,
                       Activation act) {
  switch (act) {
    case Activation::kNone:
      for (int c = 0; c < cols; ++c) y[c] += bias[c];
      break;
    case Activation::kTanh:
      for (int c = 0; c < cols; ++c) y[c] = TanhFast(y[c] + bias[c]);
      break;
    case Activation::kRelu:
      for (int c = 0; c < cols; ++c) y[c] = std::max(y[c] + bias[c], 0.0f);
      break;
  }
}

void BiasActForward(float* y, const float* bias, int rows, int cols, Activation act) {
  for (int r = 0; r < rows; ++r) BiasActRow(y + int64_t{r} * cols, bias, cols, act);
}

// One row: dz = dy * act'(y); dbias += dz. One loop per activation: GCC
// does not unswitch a switch inside the loop, which then stays scalar.
FLEET_VECTOR_CLONES
static void BiasActBackwardRow(float* __restrict dz, float* __restrict dbias,
                               const float* __restrict y, const float* __restrict dy, int cols,
                               Activation act) {
  switch (act) {
    case Activation::kNone:
      for (int c = 0; c < cols; ++c) {
        dz[c] = dy[c];
        dbias[c] += dy[c];
      }
      break;
    case Activation::kTanh:
      for (int c = 0; c < cols; ++c) {
        const float d = dy[c] * (1.0f - y[c] * y[c]);
        dz[c] = d;
        dbias[c] += d;
      }
      break;
    case Activation::kRelu:
      for (int c = 0; c < cols; ++c) {
        const float d = y[c] > 0.0f ? dy[c] : 0.0f;
        dz[c] = d;
        dbias[c] += d;
      }
      break;
  }
}

void BiasActBackward(float* dz, float* dbias, const float* y, const float* dy, int rows, int cols,
                     Activation act) {
  for (int r = 0; r < rows; ++r) {
    const int64_t o = int64_t{r} * cols;
    BiasActBackwardRow(dz + o, dbias, y + o, dy + o, cols, act);
  }
}

static inline float StableSigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

void SigmoidForward(float* y, const float* x, size_t n, ThreadPool* pool) {
  ForChunks(n, pool, [=](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) y[i] = StableSigmoid(x[i]);
  });
}
FLEET_VECTOR_CLONES
static void SigmoidBackwardRange(float* __restrict dx, const float* __restrict y,
                                 const float* __restrict dy, size_t n) {
  for (size_t i = 0; i < n; ++i) dx[i] += dy[i] * y[i] * (1.0f - y[i]);
}
void SigmoidBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool) {
  ForChunks(n, pool,
            [=](size_t b, size_t e) { SigmoidBackwardRange(dx + b, y + b, dy + b, e - b); });
}

// ---- softmax and losses ---------------------------------------------------

// probs[C] = softmax(logits[C]); returns log(sum(exp(logits - max))) + max.
static float SoftmaxRow(float* probs, const float* logits, int C) {
  float maxv = logits[0];
  for (int c = 1; c < C; ++c) maxv = std::max(maxv, logits[c]);
  double sum = 0.0;
  for (int c = 0; c < C; ++c) {
    probs[c] = std::exp(logits[c] - maxv);
    sum += probs[c];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int c = 0; c < C; ++c) probs[c] *= inv;
  return static_cast<float>(std::log(sum)) + maxv;
}

void SoftmaxForward(float* probs, const float* logits, int B, int C, ThreadPool* pool) {
  ParallelRange(pool, B, RowGrain(C), [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) SoftmaxRow(probs + b * C, logits + b * C, C);
  });
}

void SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                const int32_t* labels, int B, int C, ThreadPool* pool) {
  ParallelRange(pool, B, RowGrain(C), [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      const float lse = SoftmaxRow(probs + b * C, logits + b * C, C);
      row_loss[b] = lse - logits[b * C + labels[b]];
    }
  });
}

void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* labels, int B,
                                 int C, float scale, ThreadPool* pool) {
  ParallelRange(pool, B, RowGrain(C), [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      float* d = dlogits + b * C;
      const float* p = probs + b * C;
      for (int c = 0; c < C; ++c) d[c] += scale * (p[c] - (c == labels[b] ? 1.0f : 0.0f));
    }
  });
}

void SigmoidBceForward(float* probs, float* row_loss, const float* logits, const float* targets,
                       size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = logits[i];
    probs[i] = StableSigmoid(x);
    row_loss[i] = std::max(x, 0.0f) - x * targets[i] + std::log1p(std::exp(-std::fabs(x)));
  }
}

void SigmoidBceBackward(float* dlogits, const float* probs, const float* targets, size_t n,
                        float scale) {
  for (size_t i = 0; i < n; ++i) dlogits[i] += scale * (probs[i] - targets[i]);
}

// ---- embedding-bag pooling ------------------------------------------------

template <typename RowAt>
static void PoolBags(float* out, RowAt row_at, const int64_t* offsets, int num_bags, int dim,
                     PoolMode mode) {
  for (int b = 0; b < num_bags; ++b) {
    float* o = out + int64_t{b} * dim;
    std::fill(o, o + dim, 0.0f);
    const int64_t begin = offsets[b], end = offsets[b + 1];
    for (int64_t r = begin; r < end; ++r) {
      const float* row = row_at(r);
      for (int d = 0; d < dim; ++d) o[d] += row[d];
    }
    if (mode == PoolMode::kMean && end > begin) {
      const float inv = 1.0f / static_cast<float>(end - begin);
      for (int d = 0; d < dim; ++d) o[d] *= inv;
    }
  }
}

void EmbeddingBagForward(float* out, const float* rows, const int64_t* offsets, int num_bags,
                         int dim, PoolMode mode) {
  PoolBags(
      out, [=](int64_t r) { return rows + r * dim; }, offsets, num_bags, dim, mode);
}

void EmbeddingBagForwardPtr(float* out, const float* const* row_ptrs, const int64_t* offsets,
                            int num_bags, int dim, PoolMode mode) {
  PoolBags(
      out, [=](int64_t r) { return row_ptrs[r]; }, offsets, num_bags, dim, mode);
}

void EmbeddingBagBackward(float* drows, const float* dout, const int64_t* offsets, int num_bags,
                          int dim, PoolMode mode) {
  for (int b = 0; b < num_bags; ++b) {
    const int64_t begin = offsets[b], end = offsets[b + 1];
    if (end == begin) continue;
    const float scale = mode == PoolMode::kMean ? 1.0f / static_cast<float>(end - begin) : 1.0f;
    const float* g = dout + int64_t{b} * dim;
    for (int64_t r = begin; r < end; ++r) {
      float* dr = drows + r * dim;
      for (int d = 0; d < dim; ++d) dr[d] += scale * g[d];
    }
  }
}

// ---- concat ---------------------------------------------------------------

void ConcatForward(float* out, std::span<const float* const> ins, std::span<const int> widths,
                   int B) {
  CHECK_EQ(ins.size(), widths.size());
  int total = 0;
  for (int w : widths) total += w;
  for (int b = 0; b < B; ++b) {
    float* o = out + int64_t{b} * total;
    for (size_t i = 0; i < ins.size(); ++i) {
      std::memcpy(o, ins[i] + int64_t{b} * widths[i], sizeof(float) * widths[i]);
      o += widths[i];
    }
  }
}

void ConcatBackward(std::span<float* const> dins, const float* dout, std::span<const int> widths,
                    int B) {
  CHECK_EQ(dins.size(), widths.size());
  int total = 0;
  for (int w : widths) total += w;
  for (int b = 0; b < B; ++b) {
    const float* g = dout + int64_t{b} * total;
    for (size_t i = 0; i < dins.size(); ++i) {
      if (dins[i] != nullptr) {
        float* d = dins[i] + int64_t{b} * widths[i];
        for (int k = 0; k < widths[i]; ++k) d[k] += g[k];
      }
      g += widths[i];
    }
  }
}

// ---- CTR interactions -----------------------------------------------------

void FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                     int field_stride, int offset, float beta) {
  for (int b = 0; b < B; ++b) {
    const float* row = x + int64_t{b} * row_stride + offset;
    for (int w = 0; w < W; ++w) {
      float sum = 0.0f;
      for (int f = 0; f < F; ++f) sum += row[int64_t{f} * field_stride + w];
      float& o = out[int64_t{b} * W + w];
      o = beta == 0.0f ? sum : beta * o + sum;
    }
  }
}

void FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                      int field_stride, int offset) {
  for (int b = 0; b < B; ++b) {
    float* row = dx + int64_t{b} * row_stride + offset;
    for (int f = 0; f < F; ++f) {
      for (int w = 0; w < W; ++w) row[int64_t{f} * field_stride + w] += dout[int64_t{b} * W + w];
    }
  }
}

void FmForward(float* out, const float* x, int B, int F, int D, int row_stride, int field_stride,
               int offset, float beta) {
  for (int b = 0; b < B; ++b) {
    const float* row = x + int64_t{b} * row_stride + offset;
    double term = 0.0;
    for (int d = 0; d < D; ++d) {
      double sum = 0.0, squares = 0.0;
      for (int f = 0; f < F; ++f) {
        const double v = row[int64_t{f} * field_stride + d];
        sum += v;
        squares += v * v;
      }
      term += sum * sum - squares;
    }
    const float fm = static_cast<float>(0.5 * term);
    out[b] = beta == 0.0f ? fm : beta * out[b] + fm;
  }
}

void FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D, int row_stride,
                int field_stride, int offset) {
  for (int b = 0; b < B; ++b) {
    const float* row = x + int64_t{b} * row_stride + offset;
    float* drow = dx + int64_t{b} * row_stride + offset;
    for (int d = 0; d < D; ++d) {
      double sum = 0.0;
      for (int f = 0; f < F; ++f) sum += row[int64_t{f} * field_stride + d];
      for (int f = 0; f < F; ++f) {
        const int64_t at = int64_t{f} * field_stride + d;
        drow[at] += static_cast<float>(dout[b] * (sum - row[at]));
      }
    }
  }
}

void CrossForward(float* y, const float* x0, const float* u, const float* xl, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = x0[i] * u[i] + xl[i];
}

void CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                   const float* dy, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    dx0[i] += dy[i] * u[i];
    du[i] = dy[i] * x0[i];
    dxl[i] += dy[i];
  }
}

// ---- input conversion -----------------------------------------------------

FLEET_VECTOR_CLONES
static void ScaleBytesRange(float* __restrict out, const uint8_t* __restrict in, size_t n,
                            float scale) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * scale;
}

void ScaleBytes(float* out, const uint8_t* in, size_t n, float scale) {
  ScaleBytesRange(out, in, n, scale);
}

// ---- optimizer updates ----------------------------------------------------

FLEET_VECTOR_CLONES
static void SgdRange(float* __restrict p, const float* __restrict g, size_t n, float lr, float wd) {
  for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
}

void SgdUpdate(float* p, const float* g, size_t n, float lr, float weight_decay, ThreadPool* pool) {
  ForChunks(n, pool, [=](size_t b, size_t e) { SgdRange(p + b, g + b, e - b, lr, weight_decay); });
}

// One pass over p, m, v, g (hyper-parameters by value, so no load can alias
// a store). As PyTorch computes it: p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2)
// + eps), with the two bias corrections folded into scalars, so each element
// costs one square root and one division (three divisions before: the loop
// was bound by the divider).
FLEET_VECTOR_CLONES
static void AdamRange(float* __restrict p, float* __restrict m, float* __restrict v,
                      const float* __restrict g, size_t n, float b1, float b2, float wd, float eps,
                      float step_size, float inv_sqrt_bc2) {
  for (size_t i = 0; i < n; ++i) {
    const float grad = g[i] + wd * p[i];
    const float mi = b1 * m[i] + (1.0f - b1) * grad;
    const float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

void AdamUpdate(float* p, float* m, float* v, const float* g, size_t n, const AdamHyper& h,
                int64_t t, ThreadPool* pool) {
  CHECK_GE(t, 1);
  const double bc1 = 1.0 - std::pow(double{h.beta1}, double(t));
  const double bc2 = 1.0 - std::pow(double{h.beta2}, double(t));
  const float step_size = static_cast<float>(h.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  ForChunks(n, pool, [=, &h](size_t b, size_t e) {
    AdamRange(p + b, m + b, v + b, g + b, e - b, h.beta1, h.beta2, h.weight_decay, h.eps, step_size,
              inv_sqrt_bc2);
  });
}

}  // namespace fleet::trainer::kernels
