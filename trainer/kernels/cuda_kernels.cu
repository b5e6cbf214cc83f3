// CUDA kernels of the MLP and CTR-DNN towers; see cuda_kernels.h for shapes
// and meaning. Kernels are deliberately plain (one thread per element or
// row): the towers' tensors are small and the GEMMs, done by cuBLAS, dominate.
#include "trainer/kernels/cuda_kernels.h"

#include <cmath>

namespace fleet::trainer::cuda {
namespace {

constexpr int kThreads = 256;
inline int Blocks(size_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

// y: [rows, cols], bias: [cols]
__global__ void BiasAddKernel(float* y, const float* bias, int rows, int cols) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size_t(rows) * cols) y[i] += bias[i % cols];
}
// dbias: [cols], dy: [rows, cols]; one thread per column.
__global__ void BiasBackwardKernel(float* dbias, const float* dy, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += dy[size_t(r) * cols + c];
  dbias[c] += acc;
}
// x, y: [n]
__global__ void TanhForwardKernel(float* y, const float* x, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = tanhf(x[i]);
}
// dx, y, dy: [n]
__global__ void TanhBackwardKernel(float* dx, const float* y, const float* dy, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dx[i] += dy[i] * (1.0f - y[i] * y[i]);
}
// y: [rows, cols], bias: [cols]; act 0 none, 1 tanh, 2 ReLU.
__global__ void BiasActForwardKernel(float* y, const float* bias, int rows, int cols, int act) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(rows) * cols) return;
  const float z = y[i] + bias[i % cols];
  y[i] = act == 1 ? tanhf(z) : act == 2 ? (z > 0.0f ? z : 0.0f) : z;
}
// dz, y, dy: [n]
__global__ void ActBackwardKernel(float* dz, const float* y, const float* dy, size_t n, int act) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  dz[i] = act == 1 ? dy[i] * (1.0f - y[i] * y[i]) : act == 2 ? (y[i] > 0.0f ? dy[i] : 0.0f) : dy[i];
}
// The CPU kernel's sigmoid: no overflow for any x.
__device__ float StableSigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}
// probs, row_loss, logits, targets: [n]
__global__ void SigmoidBceForwardKernel(float* probs, float* row_loss, const float* logits,
                                        const float* targets, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = logits[i];
  probs[i] = StableSigmoid(x);
  row_loss[i] = fmaxf(x, 0.0f) - x * targets[i] + log1pf(expf(-fabsf(x)));
}
// dlogits, probs, targets: [n]
__global__ void SigmoidBceBackwardKernel(float* dlogits, const float* probs, const float* targets,
                                         size_t n, float scale) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dlogits[i] += scale * (probs[i] - targets[i]);
}
// out: [B, out_cols], in: [B, width]; one thread per element of in.
__global__ void ConcatColumnsForwardKernel(float* out, int out_cols, int offset, const float* in,
                                           int width, int B) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * width) return;
  const size_t b = i / width, j = i % width;
  out[b * out_cols + offset + j] = in[i];
}
// din: [B, width], dout: [B, out_cols]
__global__ void ConcatColumnsBackwardKernel(float* din, const float* dout, int out_cols, int offset,
                                            int width, int B) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * width) return;
  const size_t b = i / width, j = i % width;
  din[i] += dout[b * out_cols + offset + j];
}
// probs, logits: [B, C], labels, row_loss: [B]; one thread per row (C is small).
__global__ void SoftmaxCeForwardKernel(float* probs, float* row_loss, const float* logits,
                                       const int32_t* labels, int B, int C) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const float* l = logits + size_t(b) * C;
  float* p = probs + size_t(b) * C;
  float maxv = l[0];
  for (int c = 1; c < C; ++c) maxv = fmaxf(maxv, l[c]);
  double sum = 0.0;
  for (int c = 0; c < C; ++c) {
    p[c] = expf(l[c] - maxv);
    sum += p[c];
  }
  const float inv = float(1.0 / sum);
  for (int c = 0; c < C; ++c) p[c] *= inv;
  row_loss[b] = float(log(sum)) + maxv - l[labels[b]];
}
// dlogits, probs: [B, C], labels: [B]
__global__ void SoftmaxCeBackwardKernel(float* dlogits, const float* probs, const int32_t* labels,
                                       int B, int C, float scale) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * C) return;
  const int b = int(i / C), c = int(i % C);
  dlogits[i] += scale * (probs[i] - (c == labels[b] ? 1.0f : 0.0f));
}
// x: [n]
__global__ void FillKernel(float* x, size_t n, float value) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}
// p, g: [n]
__global__ void SgdKernel(float* p, const float* g, size_t n, float lr, float wd) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] -= lr * (g[i] + wd * p[i]);
}
// p, m, v, g: [n]
__global__ void AdamKernel(float* p, float* m, float* v, const float* g, size_t n,
                           float lr, float beta1, float beta2, float eps, float wd,
                           float bc1, float bc2) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float grad = g[i] + wd * p[i];
  m[i] = beta1 * m[i] + (1.0f - beta1) * grad;
  v[i] = beta2 * v[i] + (1.0f - beta2) * grad * grad;
  p[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps);
}

}  // namespace

cudaError_t BiasAddForward(float* y, const float* bias, int rows, int cols, cudaStream_t s) {
  const size_t n = size_t(rows) * cols;
  if (n) BiasAddKernel<<<Blocks(n), kThreads, 0, s>>>(y, bias, rows, cols);
  return cudaGetLastError();
}
cudaError_t BiasBackward(float* dbias, const float* dy, int rows, int cols, cudaStream_t s) {
  if (cols) BiasBackwardKernel<<<Blocks(cols), kThreads, 0, s>>>(dbias, dy, rows, cols);
  return cudaGetLastError();
}
cudaError_t TanhForward(float* y, const float* x, size_t n, cudaStream_t s) {
  if (n) TanhForwardKernel<<<Blocks(n), kThreads, 0, s>>>(y, x, n);
  return cudaGetLastError();
}
cudaError_t TanhBackward(float* dx, const float* y, const float* dy, size_t n, cudaStream_t s) {
  if (n) TanhBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dx, y, dy, n);
  return cudaGetLastError();
}
cudaError_t BiasActForward(float* y, const float* bias, int rows, int cols, int act,
                           cudaStream_t s) {
  const size_t n = size_t(rows) * cols;
  if (n) BiasActForwardKernel<<<Blocks(n), kThreads, 0, s>>>(y, bias, rows, cols, act);
  return cudaGetLastError();
}
cudaError_t ActBackward(float* dz, const float* y, const float* dy, size_t n, int act,
                        cudaStream_t s) {
  if (n) ActBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dz, y, dy, n, act);
  return cudaGetLastError();
}
cudaError_t SigmoidBceForward(float* probs, float* row_loss, const float* logits,
                              const float* targets, size_t n, cudaStream_t s) {
  if (n)
    SigmoidBceForwardKernel<<<Blocks(n), kThreads, 0, s>>>(probs, row_loss, logits, targets, n);
  return cudaGetLastError();
}
cudaError_t SigmoidBceBackward(float* dlogits, const float* probs, const float* targets, size_t n,
                               float scale, cudaStream_t s) {
  if (n) SigmoidBceBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dlogits, probs, targets, n, scale);
  return cudaGetLastError();
}
cudaError_t ConcatColumnsForward(float* out, int out_cols, int offset, const float* in, int width,
                                 int B, cudaStream_t s) {
  const size_t n = size_t(B) * width;
  if (n)
    ConcatColumnsForwardKernel<<<Blocks(n), kThreads, 0, s>>>(out, out_cols, offset, in, width, B);
  return cudaGetLastError();
}
cudaError_t ConcatColumnsBackward(float* din, const float* dout, int out_cols, int offset,
                                  int width, int B, cudaStream_t s) {
  const size_t n = size_t(B) * width;
  if (n)
    ConcatColumnsBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(din, dout, out_cols, offset, width,
                                                               B);
  return cudaGetLastError();
}
cudaError_t SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                       const int32_t* labels, int B, int C, cudaStream_t s) {
  if (B) SoftmaxCeForwardKernel<<<Blocks(B), kThreads, 0, s>>>(probs, row_loss, logits, labels, B, C);
  return cudaGetLastError();
}
cudaError_t SoftmaxCrossEntropyBackward(float* dlogits, const float* probs,
                                        const int32_t* labels, int B, int C, float scale,
                                        cudaStream_t s) {
  const size_t n = size_t(B) * C;
  if (n) SoftmaxCeBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(dlogits, probs, labels, B, C, scale);
  return cudaGetLastError();
}
cudaError_t Fill(float* x, size_t n, float value, cudaStream_t s) {
  if (n == 0) return cudaGetLastError();
  // +0.0f is all zero bytes: the driver's memset writes at the copy engine's
  // rate (the per-element kernel zeroed a GPT-2 124M step's input-gradient
  // buffers at ~1.7 TB/s on an H200, 3.7 ms a step).
  if (value == 0.0f && !std::signbit(value)) return cudaMemsetAsync(x, 0, n * sizeof(float), s);
  FillKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, value);
  return cudaGetLastError();
}
cudaError_t SgdUpdate(float* p, const float* g, size_t n, float lr, float wd, cudaStream_t s) {
  if (n) SgdKernel<<<Blocks(n), kThreads, 0, s>>>(p, g, n, lr, wd);
  return cudaGetLastError();
}
cudaError_t AdamUpdate(float* p, float* m, float* v, const float* g, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                       cudaStream_t s) {
  if (n) AdamKernel<<<Blocks(n), kThreads, 0, s>>>(p, m, v, g, n, lr, beta1, beta2, eps, wd, bc1, bc2);
  return cudaGetLastError();
}

}  // namespace fleet::trainer::cuda
