// Launchers of the CUDA twins of the CTR interaction kernels
// (ctr_cuda_kernels.cu): the wide part's and FM's sums over fields and
// DCN's cross combination. Each is the device twin of the same-named
// function in cpu_kernels.h: same field layout, shapes and results (FM's
// sums in double, one thread per sample), forward as there (beta), backward
// adds. Device pointers; every launcher enqueues on `stream` and returns
// the launch error (cudaSuccess when there was nothing to do). Written for
// the CPU emulation too (cuda_emulatable.h), so ctr_kernels_emulated_test
// runs them against the CPU kernels without a GPU. C++17 (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace fleet::trainer::cuda {

cudaError_t FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                            int field_stride, int offset, float beta, cudaStream_t stream);
cudaError_t FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                             int field_stride, int offset, cudaStream_t stream);
cudaError_t FmForward(float* out, const float* x, int B, int F, int D, int row_stride,
                      int field_stride, int offset, float beta, cudaStream_t stream);
cudaError_t FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D,
                       int row_stride, int field_stride, int offset, cudaStream_t stream);
cudaError_t CrossForward(float* y, const float* x0, const float* u, const float* xl, size_t n,
                         cudaStream_t stream);
cudaError_t CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                          const float* dy, size_t n, cudaStream_t stream);

}  // namespace fleet::trainer::cuda
