// CudaGptKernels: cuBLAS for the matmuls, gpt_cuda_ops.cu for the rest, all
// on the backend's stream. Compiled only when FLEET_CUDA is ON.
#include "trainer/kernels/gpt_cuda_kernels.h"

#include <string>

#include "trainer/kernels/cuda_backend.h"
#include "trainer/kernels/cuda_check.h"
#include "trainer/kernels/gpt_cuda_ops.h"

namespace fleet::trainer {
namespace {

namespace ops = cuda::gpt;

// Plain float32 for kFp32 (the handle's default math mode: no TF32, so the
// results stay comparable with the CPU twin); bf16 / fp16 inputs with
// float32 accumulation for the reduced precisions.
cublasComputeType_t ComputeType(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case Precision::kFp16:
      return CUBLAS_COMPUTE_32F_FAST_16F;
    case Precision::kFp32:
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

ops::TileType TileTypeOf(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return ops::TileType::kBf16;
    case Precision::kFp16:
      return ops::TileType::kFp16;
    case Precision::kFp32:
      break;
  }
  return ops::TileType::kFloat;
}

// The attention kernels keep hs / 32 output dimensions per lane in registers.
void CheckHeadSize(int C, int NH) {
  CHECK(NH > 0 && C % NH == 0 && C / NH <= ops::kMaxHeadSize)
      << "CudaGptKernels attention: head size C / NH = " << C << " / " << NH
      << " must be a whole number <= " << ops::kMaxHeadSize;
}

}  // namespace

Result<std::unique_ptr<CudaGptKernels>> CudaGptKernels::Create(Backend* backend,
                                                               Precision precision) {
  if (backend == nullptr || !backend->device().is_cuda()) {
    return Status::InvalidArgument("CudaGptKernels needs a CUDA backend, got",
                                   backend ? backend->device().ToString() : "none");
  }
  const Device device = backend->device();
  const std::string which = device.ToString();
  const cudaStream_t stream = CudaBackendStream(*backend);
  if (stream == nullptr) {
    return Status::InvalidArgument("CudaGptKernels needs a backend made by CreateCudaBackend",
                                   which);
  }
  if (cudaError_t e = cudaSetDevice(device.index); e != cudaSuccess) {
    return Status::Unavailable(std::string("cudaSetDevice failed: ") + cudaGetErrorString(e),
                               which);
  }
  cublasHandle_t handle = nullptr;
  if (cublasStatus_t s = cublasCreate(&handle); s != CUBLAS_STATUS_SUCCESS) {
    return Status::Unavailable(std::string("cublasCreate failed: ") + cublasGetStatusString(s),
                               which);
  }
  if (cublasSetStream(handle, stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle);
    return Status::Unavailable("cannot bind cuBLAS to the backend's stream", which);
  }
  void* partials = nullptr;
  if (cudaError_t e = cudaMalloc(&partials, ops::kSumOfSquaresBlocks * sizeof(double));
      e != cudaSuccess) {
    cublasDestroy(handle);
    return Status::Unavailable(
        std::string("cannot allocate SumOfSquares' buffer: ") + cudaGetErrorString(e), which);
  }
  return std::unique_ptr<CudaGptKernels>(new CudaGptKernels(
      device, precision, stream, handle, static_cast<double*>(partials)));
}

CudaGptKernels::CudaGptKernels(Device device, Precision precision, cudaStream_t stream,
                               cublasHandle_t handle, double* partials)
    : device_(device),
      precision_(precision),
      stream_(stream),
      handle_(handle),
      partials_(partials) {}

CudaGptKernels::~CudaGptKernels() {
  cudaSetDevice(device_.index);
  cudaStreamSynchronize(stream_);  // nothing of ours may still use the handle or buffer
  cublasDestroy(handle_);
  cudaFree(partials_);
}

void CudaGptKernels::Enter() const { FLEET_CUDA_CHECK(cudaSetDevice(device_.index)); }

void CudaGptKernels::Gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // op(A) op(B) is zero: C = beta C, i.e. untouched for beta 1
    if (beta == 0.0f) {
      FLEET_CUDA_CHECK(cudaMemset2DAsync(C, size_t(ldc) * sizeof(float), 0, size_t(N) * sizeof(float),
                                         size_t(M), stream_));
    }
    return;
  }
  const float alpha = 1.0f;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  FLEET_CUBLAS_CHECK(cublasGemmEx(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                                  CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                                  ComputeType(precision_), CUBLAS_GEMM_DEFAULT));
}

void CudaGptKernels::EncoderForward(float* out, const int32_t* tokens, const float* wte,
                                    const float* wpe, int B, int T, int C) {
  Enter();
  FLEET_CUDA_CHECK(ops::EncoderForward(out, tokens, wte, wpe, B, T, C, stream_));
}

void CudaGptKernels::EncoderBackward(float* dwte, float* dwpe, const float* dout,
                                     const int32_t* tokens, int B, int T, int C) {
  Enter();
  FLEET_CUDA_CHECK(ops::EncoderBackward(dwte, dwpe, dout, tokens, B, T, C, stream_));
}

void CudaGptKernels::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                      const float* weight, const float* bias, int N, int C) {
  Enter();
  FLEET_CUDA_CHECK(
      ops::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, kLayerNormEps, stream_));
}

void CudaGptKernels::LayerNormBackward(float* dinp, float* dweight, float* dbias,
                                       const float* dout, const float* inp, const float* weight,
                                       const float* mean, const float* rstd, int N, int C) {
  Enter();
  FLEET_CUDA_CHECK(ops::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                          C, stream_));
}

void CudaGptKernels::MatmulForward(float* out, const float* inp, const float* weight,
                                   const float* bias, int N, int IC, int OC, bool accumulate) {
  Enter();
  // out [N, OC] (+)= inp [N, IC] weight [OC, IC]^T, then the bias.
  Gemm(false, true, N, OC, IC, inp, IC, weight, IC, accumulate ? 1.0f : 0.0f, out, OC);
  if (bias != nullptr) FLEET_CUDA_CHECK(ops::AddBias(out, bias, N, OC, stream_));
}

void CudaGptKernels::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, int N, int IC, int OC) {
  Enter();
  // dinp [N, IC] += dout [N, OC] weight [OC, IC].
  if (dinp != nullptr) Gemm(false, false, N, IC, OC, dout, OC, weight, IC, 1.0f, dinp, IC);
  // dweight [OC, IC] += dout^T [OC, N] inp [N, IC].
  Gemm(true, false, OC, IC, N, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias != nullptr) FLEET_CUDA_CHECK(ops::BiasBackward(dbias, dout, N, OC, stream_));
}

size_t CudaGptKernels::AttentionSavedFloats(int B, int T, int NH) const {
  return size_t(B) * NH * T;
}

size_t CudaGptKernels::AttentionScratchFloats(int B, int T, int NH) const {
  return size_t(B) * NH * T;
}

void CudaGptKernels::AttentionForward(float* out, float* saved, const float* qkv, int B, int T,
                                      int C, int NH) {
  CheckHeadSize(C, NH);
  Enter();
  FLEET_CUDA_CHECK(
      ops::AttentionForward(out, saved, qkv, B, T, C, NH, TileTypeOf(precision_), stream_));
}

void CudaGptKernels::AttentionBackward(float* dqkv, float* scratch, const float* dout,
                                       const float* qkv, const float* out, const float* saved,
                                       int B, int T, int C, int NH) {
  CheckHeadSize(C, NH);
  Enter();
  FLEET_CUDA_CHECK(ops::AttentionBackward(dqkv, scratch, dout, qkv, out, saved, B, T, C, NH,
                                          TileTypeOf(precision_), stream_));
}

void CudaGptKernels::AttentionDecodeForward(float* out, float* k_cache, float* v_cache,
                                            float* /*scratch*/, const float* qkv, int B, int T,
                                            int past, int maxT, int C, int NH) {
  CheckHeadSize(C, NH);
  CHECK(T >= 1 && past >= 0 && past + T <= maxT)
      << "AttentionDecodeForward: T " << T << ", past " << past << ", maxT " << maxT;
  Enter();
  FLEET_CUDA_CHECK(ops::AttentionDecodeForward(out, k_cache, v_cache, qkv, B, T, past, maxT, C, NH,
                                               TileTypeOf(precision_), stream_));
}

void CudaGptKernels::GeluForward(float* out, const float* inp, size_t n) {
  Enter();
  FLEET_CUDA_CHECK(ops::GeluForward(out, inp, n, stream_));
}

void CudaGptKernels::GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  Enter();
  FLEET_CUDA_CHECK(ops::GeluBackward(dinp, inp, dout, n, stream_));
}

void CudaGptKernels::CrossEntropyForward(float* losses, float* logits, const int32_t* targets,
                                         int N, int V, float dloss, bool write_dlogits) {
  Enter();
  FLEET_CUDA_CHECK(
      ops::CrossEntropyForward(losses, logits, targets, N, V, dloss, write_dlogits, stream_));
}

double CudaGptKernels::SumOfSquares(const float* x, size_t n) {
  Enter();
  FLEET_CUDA_CHECK(ops::SumOfSquares(partials_, x, n, stream_));
  double total = 0.0;
  FLEET_CUDA_CHECK(
      cudaMemcpyAsync(&total, partials_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  FLEET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return total;
}

void CudaGptKernels::AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                                 const AdamWStep& s) {
  Enter();
  FLEET_CUDA_CHECK(ops::AdamWUpdate(p, g, m, v, n, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay,
                                    s.bias_correction1, s.bias_correction2, s.grad_scale,
                                    stream_));
}

}  // namespace fleet::trainer
