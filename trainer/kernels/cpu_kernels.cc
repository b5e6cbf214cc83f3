#include "trainer/kernels/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <cblas.h>
#include <glog/logging.h>

namespace fleet::trainer::kernels {

void SetBlasThreads(int num_threads) { openblas_set_num_threads(std::max(1, num_threads)); }
int BlasThreads() { return openblas_get_num_threads(); }

void ParallelRange(ThreadPool* pool, size_t n, size_t grain,
                   const std::function<void(size_t, size_t)>& fn) {
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
static size_t RowGrain(int cols) {
  return std::max<size_t>(1, kParallelGrain / std::max(1, cols));
}

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

template <typename F>
static void ForEach(size_t n, ThreadPool* pool, F f) {
  ParallelRange(pool, n, kParallelGrain, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) f(i);
  });
}

void TanhForward(float* y, const float* x, size_t n, ThreadPool* pool) {
  ForEach(n, pool, [=](size_t i) { y[i] = std::tanh(x[i]); });
}
void TanhBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool) {
  ForEach(n, pool, [=](size_t i) { dx[i] += dy[i] * (1.0f - y[i] * y[i]); });
}
void ReluForward(float* y, const float* x, size_t n, ThreadPool* pool) {
  ForEach(n, pool, [=](size_t i) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; });
}
void ReluBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool) {
  ForEach(n, pool, [=](size_t i) { dx[i] += y[i] > 0.0f ? dy[i] : 0.0f; });
}

static inline float StableSigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

void SigmoidForward(float* y, const float* x, size_t n, ThreadPool* pool) {
  ForEach(n, pool, [=](size_t i) { y[i] = StableSigmoid(x[i]); });
}
void SigmoidBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool) {
  ForEach(n, pool, [=](size_t i) { dx[i] += dy[i] * y[i] * (1.0f - y[i]); });
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

void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* labels,
                                 int B, int C, float scale, ThreadPool* pool) {
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
  PoolBags(out, [=](int64_t r) { return rows + r * dim; }, offsets, num_bags, dim, mode);
}

void EmbeddingBagForwardPtr(float* out, const float* const* row_ptrs, const int64_t* offsets,
                            int num_bags, int dim, PoolMode mode) {
  PoolBags(out, [=](int64_t r) { return row_ptrs[r]; }, offsets, num_bags, dim, mode);
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

// ---- optimizer updates ----------------------------------------------------

void SgdUpdate(float* p, const float* g, size_t n, float lr, float weight_decay,
               ThreadPool* pool) {
  ForEach(n, pool, [=](size_t i) { p[i] -= lr * (g[i] + weight_decay * p[i]); });
}

void AdamUpdate(float* p, float* m, float* v, const float* g, size_t n, const AdamHyper& h,
                int64_t t, ThreadPool* pool) {
  CHECK_GE(t, 1);
  const float bc1 = static_cast<float>(1.0 - std::pow(double{h.beta1}, double(t)));
  const float bc2 = static_cast<float>(1.0 - std::pow(double{h.beta2}, double(t)));
  ForEach(n, pool, [=, &h](size_t i) {
    const float grad = g[i] + h.weight_decay * p[i];
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * grad;
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * grad * grad;
    const float mhat = m[i] / bc1;
    const float vhat = v[i] / bc2;
    p[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
  });
}

}  // namespace fleet::trainer::kernels
