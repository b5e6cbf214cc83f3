// CPU kernels: plain functions with explicit shapes. Every buffer's shape is
// given in the comment beside it; all buffers are contiguous row-major float
// arrays in host memory, and no kernel allocates.
//
// Conventions (as in llm.c):
// * "Forward" kernels overwrite their outputs.
// * "Backward" kernels ADD into their gradient outputs, which the caller
//   zeroed before the step; so gradients of a tensor used twice accumulate.
// * Every optimised kernel has a naive oracle: GemmNaive for GemmBlas, and
//   for the element-wise and reduction kernels the serial path (pool ==
//   nullptr) is the oracle of the parallel one. Tests compare them.
//
// Threads. GemmBlas runs on OpenBLAS's own threads, whose number is
// OpenBLAS's setting (OPENBLAS_NUM_THREADS, or SetBlasThreads()). The other
// kernels split their work over the ThreadPool passed in (nullptr = run on
// the calling thread) and only when the work is large enough to pay for the
// hand-off (kParallelGrain elements). Do not give both sides the cores:
// OpenBLAS's threads keep spinning for a while after each GEMM and then
// fight the pool's threads. On this 2-core machine use EITHER
// SetBlasThreads(1) with a 1-thread pool (the caller is the second worker)
// OR OpenBLAS at 2 threads with no pool. Measured on the 784-128-128-10 MLP,
// batch 64: OpenBLAS 2 threads + pool was ~3x slower than either choice.
//
// The project's policy, wherever a thread count is set (ps_worker's
// train.blas_threads, mnist_mlp's --blas_threads, the benchmarks): cores
// go to processes first (ranks, workers, servers), and each process gives
// its share to OpenBLAS; the dense models pass no pool, since their
// element-wise work is now a few percent of a step and runs fused next to
// the GEMMs on the caller. So processes x BLAS threads <= cores: one
// process alone on 2 cores runs 2 BLAS threads, 2 ranks or a PS job's
// several workers and servers run 1 each (bench/README.md has the figures).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/functional/function_ref.h"
#include "comm/thread_pool.h"
#include "trainer/kernel_types.h"

namespace fleet::trainer::kernels {

// Below this many elements an element-wise kernel runs on the caller only.
inline constexpr size_t kParallelGrain = 16384;

// Sets the number of OpenBLAS threads for the whole process (OpenBLAS's
// setting is global). Call once at start-up, before any GEMM, from main().
void SetBlasThreads(int num_threads);
int BlasThreads();
// The kernels OpenBLAS runs, e.g. "SkylakeX" (see blas_core.cc).
const char* BlasKernels();
// The kernels blas_core.cc restarts a program with when OpenBLAS fell back
// to pre-AVX2 ones: "SkylakeX" on AVX-512, "Haswell" on AVX2 and FMA, else
// null.
const char* BlasKernelsForThisCpu();

// Runs fn(begin, end) over [0, n) in chunks of at least `grain` elements,
// on the pool and the caller. Serial when pool is null or n < 2 * grain.
// fn is borrowed for the call (a FunctionRef: a kernel's lambda is not
// copied to the heap on every call, as a std::function of more than two
// pointers' captures would be).
void ParallelRange(ThreadPool* pool, size_t n, size_t grain,
                   absl::FunctionRef<void(size_t, size_t)> fn);

// ---- GEMM -----------------------------------------------------------------
// C = alpha * op(A) * op(B) + beta * C, row-major.
//   op(A): [M, K]; A is [M, K] when !trans_a, else [K, M]
//   op(B): [K, N]; B is [K, N] when !trans_b, else [N, K]
//   C:     [M, N]
// REQUIRES: M, N, K >= 0. With beta == 0, C's old contents are ignored.
void GemmBlas(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
              const float* B, float beta, float* C);
// The triple-loop oracle of GemmBlas (accumulates in double).
void GemmNaive(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
               const float* B, float beta, float* C);

// ---- bias -----------------------------------------------------------------
// y[r, c] += bias[c].           y: [rows, cols], bias: [cols]
void BiasAddForward(float* y, const float* bias, int rows, int cols);
// dbias[c] += sum_r dy[r, c].   dbias: [cols], dy: [rows, cols]
void BiasBackward(float* dbias, const float* dy, int rows, int cols);

// ---- bias + activation, fused (one pass next to the GEMM) ------------------
// y[r, c] = act(y[r, c] + bias[c]), in place.   y: [rows, cols], bias: [cols]
void BiasActForward(float* y, const float* bias, int rows, int cols, Activation act);
// dz[r, c] = dy[r, c] * act'(y[r, c]) (WRITTEN, not added) and
// dbias[c] += sum_r dz[r, c], in one pass. y is the forward OUTPUT.
//   dz, y, dy: [rows, cols], dbias: [cols]. REQUIRES: dz overlaps none of the others.
void BiasActBackward(float* dz, float* dbias, const float* y, const float* dy, int rows, int cols,
                     Activation act);

// ---- activations (element-wise over n elements) ---------------------------
// Backward kernels take the forward OUTPUT y (cheaper than recomputing).
// y = tanh(x).                 x, y: [n]
void TanhForward(float* y, const float* x, size_t n, ThreadPool* pool);
// dx += dy * (1 - y^2).        dx, y, dy: [n]
void TanhBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool);
// y = max(x, 0).               x, y: [n]
void ReluForward(float* y, const float* x, size_t n, ThreadPool* pool);
// dx += dy * (y > 0).          dx, y, dy: [n]
void ReluBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool);
// y = 1 / (1 + exp(-x)), computed without overflow.   x, y: [n]
void SigmoidForward(float* y, const float* x, size_t n, ThreadPool* pool);
// dx += dy * y * (1 - y).      dx, y, dy: [n]
void SigmoidBackward(float* dx, const float* y, const float* dy, size_t n, ThreadPool* pool);

// ---- softmax and losses ---------------------------------------------------
// Row-wise softmax, max-subtracted.   probs, logits: [B, C]
void SoftmaxForward(float* probs, const float* logits, int B, int C, ThreadPool* pool);
// probs = softmax(logits); row_loss[b] = -log(probs[b, labels[b]]) computed
// as logsumexp - logit (finite even when the probability underflows).
//   probs, logits: [B, C], labels: [B] in [0, C), row_loss: [B]
// REQUIRES: labels in range (callers validate input labels first).
void SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                const int32_t* labels, int B, int C, ThreadPool* pool);
// dlogits[b, c] += scale * (probs[b, c] - [c == labels[b]]).
// For the mean loss, scale = dloss / B.   dlogits, probs: [B, C], labels: [B]
void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* labels, int B,
                                 int C, float scale, ThreadPool* pool);
// Binary cross-entropy on logits, stable for any x:
//   row_loss[i] = max(x, 0) - x * t + log1p(exp(-|x|)),  probs[i] = sigmoid(x).
//   probs, row_loss, logits, targets: [n]; targets in [0, 1]
void SigmoidBceForward(float* probs, float* row_loss, const float* logits, const float* targets,
                       size_t n);
// dlogits[i] += scale * (probs[i] - targets[i]).   all: [n]
void SigmoidBceBackward(float* dlogits, const float* probs, const float* targets, size_t n,
                        float scale);

// ---- embedding-bag pooling ------------------------------------------------
// Bag b is rows offsets[b] .. offsets[b+1]-1. kMean divides by the bag size;
// an empty bag pools to zeros (and gets no gradient).
enum class PoolMode { kSum, kMean };
// out[b, :] = pool_{r in bag b} rows[r, :].
//   out: [num_bags, dim], rows: [num_rows, dim], offsets: [num_bags + 1]
// REQUIRES: offsets non-decreasing, offsets[0] == 0, offsets[num_bags] <= num_rows.
void EmbeddingBagForward(float* out, const float* rows, const int64_t* offsets, int num_bags,
                         int dim, PoolMode mode);
// The same over rows given by pointer (e.g. rows pulled into a cache).
//   row_ptrs: [num_rows], each pointing at [dim] floats
void EmbeddingBagForwardPtr(float* out, const float* const* row_ptrs, const int64_t* offsets,
                            int num_bags, int dim, PoolMode mode);
// drows[r, :] += dout[b, :] (* 1/|bag b| for kMean) for r in bag b.
//   drows: [num_rows, dim], dout: [num_bags, dim], offsets: [num_bags + 1]
void EmbeddingBagBackward(float* drows, const float* dout, const int64_t* offsets, int num_bags,
                          int dim, PoolMode mode);

// ---- concat along the last dim ------------------------------------------------
// out[b, :] = [ins[0][b, :], ins[1][b, :], ...].
//   ins[i]: [B, widths[i]], out: [B, sum(widths)]
void ConcatForward(float* out, std::span<const float* const> ins, std::span<const int> widths,
                   int B);
// dins[i][b, :] += dout[b, slice i].   dout: [B, sum(widths)], dins[i]: [B, widths[i]]
// A null dins[i] is skipped (no gradient wanted for that input).
void ConcatBackward(std::span<float* const> dins, const float* dout, std::span<const int> widths,
                    int B);

// ---- CTR interactions (Wide&Deep, DeepFM, DCN) -------------------------------
// A batch row of x holds F fields of field_stride floats each, starting at
// column `offset` of the row's field, rows `row_stride` floats apart:
//   field f of sample b, element j = x[b * row_stride + f * field_stride + offset + j].
// (A CTR model's input row is [field 0 | field 1 | ... | dense features].)
//
// Sum over fields: out[b, w] = beta * out[b, w] + sum_f x(b, f, w), w < W.
//   out: [B, W]; beta 0 overwrites, 1 adds (into a logit, say).
void FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                     int field_stride, int offset, float beta);
// dx(b, f, w) += dout[b, w].   dout: [B, W]
void FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                      int field_stride, int offset);
// Factorisation machine's second-order term over the fields' D-wide vectors
// v_f = x(b, f, 0..D-1):
//   out[b] = beta * out[b] + 1/2 sum_d [(sum_f v_fd)^2 - sum_f v_fd^2]
// (= sum_{f < g} <v_f, v_g>), the sums taken in double.   out: [B]
void FmForward(float* out, const float* x, int B, int F, int D, int row_stride, int field_stride,
               int offset, float beta);
// dx(b, f, d) += dout[b] * (sum_g v_gd - v_fd).   dout: [B]
void FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D, int row_stride,
                int field_stride, int offset);
// DCN-v2's cross combination: y = x0 * u + xl (u = W xl + b, the layer's
// linear map).   y, x0, u, xl: [n]
void CrossForward(float* y, const float* x0, const float* u, const float* xl, size_t n);
// dx0 += dy * u; du = dy * x0 (WRITTEN: the linear map's output gradient);
// dxl += dy.   all: [n]
void CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                   const float* dy, size_t n);

// ---- input conversion --------------------------------------------------------
// out[i] = float(in[i]) * scale: 8-bit samples (image pixels) to the model's
// floats, with the same rounding as the scalar expression.   out, in: [n]
void ScaleBytes(float* out, const uint8_t* in, size_t n, float scale);

// ---- optimizer updates (element-wise over the parameter arena) --------------
// p -= lr * (g + weight_decay * p).       p, g: [n]
void SgdUpdate(float* p, const float* g, size_t n, float lr, float weight_decay, ThreadPool* pool);

// Bias-corrected Adam step number t (t >= 1), in one pass:
//   g' = g + wd * p; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// (computed as PyTorch does, the corrections folded into two scalars).
//   p, m, v, g: [n]
void AdamUpdate(float* p, float* m, float* v, const float* g, size_t n, const AdamHyper& h,
                int64_t t, ThreadPool* pool);

}  // namespace fleet::trainer::kernels
