// Launchers of the CUDA kernels of the MLP and CTR-DNN towers (cuda_kernels.cu). Each is
// the device twin of the same-named function in cpu_kernels.h: same shapes,
// forward overwrites, backward adds. All buffers are device pointers; every
// launcher enqueues on `stream` and returns the launch error (cudaSuccess when
// there was nothing to do). Kept free of C++20 so nvcc compiles it as C++17.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace fleet::trainer::cuda {

// y: [rows, cols] += bias: [cols]
cudaError_t BiasAddForward(float* y, const float* bias, int rows, int cols, cudaStream_t s);
// dbias: [cols] += column sums of dy: [rows, cols]
cudaError_t BiasBackward(float* dbias, const float* dy, int rows, int cols, cudaStream_t s);
// y = tanh(x); x, y: [n]
cudaError_t TanhForward(float* y, const float* x, size_t n, cudaStream_t s);
// dx += dy * (1 - y^2); dx, y, dy: [n]
cudaError_t TanhBackward(float* dx, const float* y, const float* dy, size_t n, cudaStream_t s);
// y[r, c] = act(y[r, c] + bias[c]), in place; act 0 none, 1 tanh, 2 ReLU
// (kernels::Activation's order).   y: [rows, cols], bias: [cols]
cudaError_t BiasActForward(float* y, const float* bias, int rows, int cols, int act,
                           cudaStream_t s);
// dz = dy * act'(y) (WRITTEN), y the forward output.   dz, y, dy: [n]
cudaError_t ActBackward(float* dz, const float* y, const float* dy, size_t n, int act,
                        cudaStream_t s);
// probs = sigmoid(logits), row_loss = max(x, 0) - x t + log1p(exp(-|x|));
// all [n], targets in [0, 1]
cudaError_t SigmoidBceForward(float* probs, float* row_loss, const float* logits,
                              const float* targets, size_t n, cudaStream_t s);
// dlogits += scale * (probs - targets); all [n]
cudaError_t SigmoidBceBackward(float* dlogits, const float* probs, const float* targets, size_t n,
                               float scale, cudaStream_t s);
// One input of a concatenation along the last dim: out[b, offset + j] = in[b, j].
//   out: [B, out_cols], in: [B, width]
cudaError_t ConcatColumnsForward(float* out, int out_cols, int offset, const float* in, int width,
                                 int B, cudaStream_t s);
// din[b, j] += dout[b, offset + j].   dout: [B, out_cols], din: [B, width]
cudaError_t ConcatColumnsBackward(float* din, const float* dout, int out_cols, int offset,
                                  int width, int B, cudaStream_t s);
// probs, logits: [B, C]; labels, row_loss: [B]
cudaError_t SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                       const int32_t* labels, int B, int C, cudaStream_t s);
// dlogits [B, C] += scale * (probs - onehot(labels))
cudaError_t SoftmaxCrossEntropyBackward(float* dlogits, const float* probs,
                                        const int32_t* labels, int B, int C, float scale,
                                        cudaStream_t s);
// x: [n] = value
cudaError_t Fill(float* x, size_t n, float value, cudaStream_t s);
// p -= lr * (g + wd * p); p, g: [n]
cudaError_t SgdUpdate(float* p, const float* g, size_t n, float lr, float wd, cudaStream_t s);
// Bias-corrected Adam; bc1 = 1 - beta1^t, bc2 = 1 - beta2^t. p, m, v, g: [n]
cudaError_t AdamUpdate(float* p, float* m, float* v, const float* g, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                       cudaStream_t s);

}  // namespace fleet::trainer::cuda
