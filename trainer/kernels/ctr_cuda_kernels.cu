// CUDA twins of the CTR interaction kernels; see ctr_cuda_kernels.h. Plain
// kernels (one thread per output element, or per sample for FM): the
// towers' GEMMs dominate a step.
#include "trainer/kernels/ctr_cuda_kernels.h"
#include "trainer/kernels/cuda_emulatable.h"

namespace fleet::trainer::cuda {
namespace {

constexpr int kThreads = 256;
inline unsigned Blocks(size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// out: [B, W]; one thread per (b, w).
__global__ void FieldSumForwardKernel(float* out, const float* x, int B, int F, int W,
                                      int row_stride, int field_stride, int offset, float beta) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * W) return;
  const size_t b = i / W, w = i % W;
  const float* row = x + b * row_stride + offset + w;
  float sum = 0.0f;
  for (int f = 0; f < F; ++f) sum += row[size_t(f) * field_stride];
  out[i] = beta == 0.0f ? sum : beta * out[i] + sum;
}
// dx(b, f, w) += dout[b, w]; one thread per (b, f, w).
__global__ void FieldSumBackwardKernel(float* dx, const float* dout, int B, int F, int W,
                                       int row_stride, int field_stride, int offset) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * F * W) return;
  const size_t b = i / (size_t(F) * W), f = (i / W) % F, w = i % W;
  dx[b * row_stride + f * field_stride + offset + w] += dout[b * W + w];
}
// out: [B]; one thread per sample, sums in double as on the CPU.
__global__ void FmForwardKernel(float* out, const float* x, int B, int F, int D, int row_stride,
                                int field_stride, int offset, float beta) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const float* row = x + size_t(b) * row_stride + offset;
  double term = 0.0;
  for (int d = 0; d < D; ++d) {
    double sum = 0.0, squares = 0.0;
    for (int f = 0; f < F; ++f) {
      const double v = row[size_t(f) * field_stride + d];
      sum += v;
      squares += v * v;
    }
    term += sum * sum - squares;
  }
  const float fm = static_cast<float>(0.5 * term);
  out[b] = beta == 0.0f ? fm : beta * out[b] + fm;
}
// dx(b, f, d) += dout[b] * (sum_g v_gd - v_fd); one thread per (b, d).
__global__ void FmBackwardKernel(float* dx, const float* x, const float* dout, int B, int F, int D,
                                 int row_stride, int field_stride, int offset) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * D) return;
  const size_t b = i / D, d = i % D;
  const float* row = x + b * row_stride + offset + d;
  float* drow = dx + b * row_stride + offset + d;
  double sum = 0.0;
  for (int f = 0; f < F; ++f) sum += row[size_t(f) * field_stride];
  for (int f = 0; f < F; ++f) {
    const size_t at = size_t(f) * field_stride;
    drow[at] += static_cast<float>(dout[b] * (sum - row[at]));
  }
}
// y, x0, u, xl: [n]
__global__ void CrossForwardKernel(float* y, const float* x0, const float* u, const float* xl,
                                   size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x0[i] * u[i] + xl[i];
}
// all: [n]
__global__ void CrossBackwardKernel(float* dx0, float* du, float* dxl, const float* x0,
                                    const float* u, const float* dy, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  dx0[i] += dy[i] * u[i];
  du[i] = dy[i] * x0[i];
  dxl[i] += dy[i];
}

}  // namespace

cudaError_t FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                            int field_stride, int offset, float beta, cudaStream_t stream) {
  const size_t n = size_t(B) * W;
  if (n == 0) return cudaSuccess;
  return FLEET_LAUNCH(FieldSumForwardKernel, Blocks(n), kThreads, 0, stream, out, x, B, F, W,
                      row_stride, field_stride, offset, beta);
}
cudaError_t FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                             int field_stride, int offset, cudaStream_t stream) {
  const size_t n = size_t(B) * F * W;
  if (n == 0) return cudaSuccess;
  return FLEET_LAUNCH(FieldSumBackwardKernel, Blocks(n), kThreads, 0, stream, dx, dout, B, F, W,
                      row_stride, field_stride, offset);
}
cudaError_t FmForward(float* out, const float* x, int B, int F, int D, int row_stride,
                      int field_stride, int offset, float beta, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  return FLEET_LAUNCH(FmForwardKernel, Blocks(B), kThreads, 0, stream, out, x, B, F, D, row_stride,
                      field_stride, offset, beta);
}
cudaError_t FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D,
                       int row_stride, int field_stride, int offset, cudaStream_t stream) {
  const size_t n = size_t(B) * D;
  if (n == 0) return cudaSuccess;
  return FLEET_LAUNCH(FmBackwardKernel, Blocks(n), kThreads, 0, stream, dx, x, dout, B, F, D,
                      row_stride, field_stride, offset);
}
cudaError_t CrossForward(float* y, const float* x0, const float* u, const float* xl, size_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return FLEET_LAUNCH(CrossForwardKernel, Blocks(n), kThreads, 0, stream, y, x0, u, xl, n);
}
cudaError_t CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                          const float* dy, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return FLEET_LAUNCH(CrossBackwardKernel, Blocks(n), kThreads, 0, stream, dx0, du, dxl, x0, u, dy,
                      n);
}

}  // namespace fleet::trainer::cuda
