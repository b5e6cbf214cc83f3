// Launchers of the CUDA kernels of the MLP path (cuda_kernels.cu). Each is
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
