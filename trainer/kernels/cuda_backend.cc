// The CUDA Backend: cuBLAS for GEMM, cuda_kernels.cu for the rest, all on one
// stream per backend. Compiled only when FLEET_CUDA is ON.
#include "trainer/kernels/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "trainer/kernels/ctr_cuda_kernels.h"
#include "trainer/kernels/cuda_check.h"
#include "trainer/kernels/cuda_kernels.h"

namespace fleet::trainer {
namespace {

// The kernels take the activation as an int (nvcc builds them as C++17,
// without the host headers): kernels::Activation's values.
static_assert(static_cast<int>(kernels::Activation::kNone) == 0 &&
              static_cast<int>(kernels::Activation::kTanh) == 1 &&
              static_cast<int>(kernels::Activation::kRelu) == 2);

class CudaBackend final : public Backend {
 public:
  CudaBackend(int index, cudaStream_t stream, cublasHandle_t handle)
      : index_(index), stream_(stream), handle_(handle) {}
  ~CudaBackend() override {
    cudaSetDevice(index_);
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device{Device::Kind::kCuda, index_}; }
  cudaStream_t stream() const { return stream_; }

  std::shared_ptr<float> AllocateFloats(size_t n) override {
    return std::static_pointer_cast<float>(AllocateBytes(n * sizeof(float)));
  }
  std::shared_ptr<void> AllocateBytes(size_t bytes) override {
    bytes = bytes ? bytes : 1;
    FLEET_CUDA_CHECK(cudaSetDevice(index_));
    void* p = nullptr;
    FLEET_CUDA_CHECK(cudaMalloc(&p, bytes));
    FLEET_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    FLEET_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const int index = index_;
    return std::shared_ptr<void>(p, [index](void* q) {
      cudaSetDevice(index);
      cudaFree(q);
    });
  }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override {
    FLEET_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    FLEET_CUDA_CHECK(cudaStreamSynchronize(stream_));  // src may go away after we return
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    FLEET_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    FLEET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override {
    FLEET_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void Fill(float* x, size_t n, float value) override {
    FLEET_CUDA_CHECK(cuda::Fill(x, n, value, stream_));
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so the
  // operands swap places and no data is transposed.
  void Gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
            const float* B, float beta, float* C) override {
    if (M == 0 || N == 0) return;
    const int lda = std::max(1, trans_a ? M : K);
    const int ldb = std::max(1, trans_b ? K : N);
    FLEET_CUBLAS_CHECK(cublasSgemm(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                   A, lda, &beta, C, N));
  }
  void BiasAddForward(float* y, const float* bias, int rows, int cols) override {
    FLEET_CUDA_CHECK(cuda::BiasAddForward(y, bias, rows, cols, stream_));
  }
  void BiasBackward(float* dbias, const float* dy, int rows, int cols) override {
    FLEET_CUDA_CHECK(cuda::BiasBackward(dbias, dy, rows, cols, stream_));
  }
  void TanhForward(float* y, const float* x, size_t n) override {
    FLEET_CUDA_CHECK(cuda::TanhForward(y, x, n, stream_));
  }
  void TanhBackward(float* dx, const float* y, const float* dy, size_t n) override {
    FLEET_CUDA_CHECK(cuda::TanhBackward(dx, y, dy, n, stream_));
  }
  // Bias and activation in one kernel each way (ReLU included, which the
  // Backend defaults lack).
  void BiasActForward(float* y, const float* bias, int rows, int cols,
                      kernels::Activation act) override {
    FLEET_CUDA_CHECK(cuda::BiasActForward(y, bias, rows, cols, static_cast<int>(act), stream_));
  }
  void BiasActBackward(float* dz, float* dbias, const float* y, const float* dy, int rows, int cols,
                       kernels::Activation act) override {
    FLEET_CUDA_CHECK(
        cuda::ActBackward(dz, y, dy, size_t(rows) * cols, static_cast<int>(act), stream_));
    FLEET_CUDA_CHECK(cuda::BiasBackward(dbias, dz, rows, cols, stream_));
  }
  void SigmoidBceForward(float* probs, float* row_loss, const float* logits, const float* targets,
                         size_t n) override {
    FLEET_CUDA_CHECK(cuda::SigmoidBceForward(probs, row_loss, logits, targets, n, stream_));
  }
  void SigmoidBceBackward(float* dlogits, const float* probs, const float* targets, size_t n,
                          float scale) override {
    FLEET_CUDA_CHECK(cuda::SigmoidBceBackward(dlogits, probs, targets, n, scale, stream_));
  }
  // One launch per input: a tower concatenates a few dozen slots once per
  // step, far less work than its GEMMs.
  void ConcatForward(float* out, std::span<const float* const> ins, std::span<const int> widths,
                     int B) override {
    CHECK_EQ(ins.size(), widths.size());
    int total = 0, offset = 0;
    for (int w : widths) total += w;
    for (size_t i = 0; i < ins.size(); ++i) {
      FLEET_CUDA_CHECK(
          cuda::ConcatColumnsForward(out, total, offset, ins[i], widths[i], B, stream_));
      offset += widths[i];
    }
  }
  void ConcatBackward(std::span<float* const> dins, const float* dout, std::span<const int> widths,
                      int B) override {
    CHECK_EQ(dins.size(), widths.size());
    int total = 0, offset = 0;
    for (int w : widths) total += w;
    for (size_t i = 0; i < dins.size(); ++i) {
      if (dins[i] != nullptr) {
        FLEET_CUDA_CHECK(
            cuda::ConcatColumnsBackward(dins[i], dout, total, offset, widths[i], B, stream_));
      }
      offset += widths[i];
    }
  }
  void SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                  const int32_t* labels, int B, int C) override {
    FLEET_CUDA_CHECK(
        cuda::SoftmaxCrossEntropyForward(probs, row_loss, logits, labels, B, C, stream_));
  }
  void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* labels,
                                   int B, int C, float scale) override {
    FLEET_CUDA_CHECK(
        cuda::SoftmaxCrossEntropyBackward(dlogits, probs, labels, B, C, scale, stream_));
  }
  void FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                       int field_stride, int offset, float beta) override {
    FLEET_CUDA_CHECK(
        cuda::FieldSumForward(out, x, B, F, W, row_stride, field_stride, offset, beta, stream_));
  }
  void FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                        int field_stride, int offset) override {
    FLEET_CUDA_CHECK(
        cuda::FieldSumBackward(dx, dout, B, F, W, row_stride, field_stride, offset, stream_));
  }
  void FmForward(float* out, const float* x, int B, int F, int D, int row_stride, int field_stride,
                 int offset, float beta) override {
    FLEET_CUDA_CHECK(
        cuda::FmForward(out, x, B, F, D, row_stride, field_stride, offset, beta, stream_));
  }
  void FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D, int row_stride,
                  int field_stride, int offset) override {
    FLEET_CUDA_CHECK(
        cuda::FmBackward(dx, x, dout, B, F, D, row_stride, field_stride, offset, stream_));
  }
  void CrossForward(float* y, const float* x0, const float* u, const float* xl, size_t n) override {
    FLEET_CUDA_CHECK(cuda::CrossForward(y, x0, u, xl, n, stream_));
  }
  void CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                     const float* dy, size_t n) override {
    FLEET_CUDA_CHECK(cuda::CrossBackward(dx0, du, dxl, x0, u, dy, n, stream_));
  }
  void SgdUpdate(float* p, const float* g, size_t n, float lr, float weight_decay) override {
    FLEET_CUDA_CHECK(cuda::SgdUpdate(p, g, n, lr, weight_decay, stream_));
  }
  void AdamUpdate(float* p, float* m, float* v, const float* g, size_t n,
                  const kernels::AdamHyper& h, int64_t t) override {
    const float bc1 = static_cast<float>(1.0 - std::pow(double{h.beta1}, double(t)));
    const float bc2 = static_cast<float>(1.0 - std::pow(double{h.beta2}, double(t)));
    FLEET_CUDA_CHECK(cuda::AdamUpdate(p, m, v, g, n, h.lr, h.beta1, h.beta2, h.eps,
                                      h.weight_decay, bc1, bc2, stream_));
  }

 private:
  const int index_;
  const cudaStream_t stream_;
  const cublasHandle_t handle_;
};

}  // namespace

int CudaDeviceCountImpl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device / no driver" error
    return 0;
  }
  return count;
}

cudaStream_t CudaBackendStream(const Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda != nullptr ? cuda->stream() : nullptr;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(int index) {
  const std::string which = "cuda:" + std::to_string(index);
  const int count = CudaDeviceCountImpl();
  if (index < 0 || index >= count) {
    return Status::Unavailable("no such CUDA device (" + std::to_string(count) + " visible)",
                               which);
  }
  if (cudaError_t e = cudaSetDevice(index); e != cudaSuccess) {
    return Status::Unavailable(std::string("cudaSetDevice failed: ") + cudaGetErrorString(e),
                               which);
  }
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return Status::Unavailable(std::string("cudaStreamCreate failed: ") + cudaGetErrorString(e),
                               which);
  }
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(stream);
    return Status::Unavailable("cublasCreate failed", which);
  }
  cublasSetStream(handle, stream);
  // Plain FP32 (no TF32) so results stay comparable with the CPU oracle.
  cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(index, stream, handle));
}

}  // namespace fleet::trainer
