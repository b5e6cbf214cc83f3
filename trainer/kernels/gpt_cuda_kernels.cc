// CudaGptKernels: cuBLAS for the matmuls, gpt_cuda_ops.cu for the rest, all
// on the backend's stream. Compiled only when FLEET_CUDA is ON.
#include "trainer/kernels/gpt_cuda_kernels.h"

#include <cublasLt.h>
#include <glog/logging.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "trainer/kernels/cuda_backend.h"
#include "trainer/kernels/cuda_check.h"
#include "trainer/kernels/gpt_cuda_dropout_args.h"
#include "trainer/kernels/gpt_cuda_flash_tc.h"
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

// The 16-bit element type of a bf16 / fp16 precision's rounded operands.
cudaDataType_t Type16(Precision precision) {
  return precision == Precision::kFp16 ? CUDA_R_16F : CUDA_R_16BF;
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

// The attention kernels to launch: the tensor-core ones chosen by `kernel`
// where the device runs them (`tensor_cores`), else the float tiles.
ops::AttentionPath PathOf(bool tensor_cores, CudaGptKernels::AttentionKernel kernel) {
  if (!tensor_cores) return ops::AttentionPath::kTiles;
  switch (kernel) {
    case CudaGptKernels::AttentionKernel::kWmma:
      return ops::AttentionPath::kWmma;
    case CudaGptKernels::AttentionKernel::kMma:
      return ops::AttentionPath::kMma;
    case CudaGptKernels::AttentionKernel::kMmaLdMatrix:
      return ops::AttentionPath::kMmaLdMatrix;
  }
  return ops::AttentionPath::kMma;
}

// The attention kernels keep hs / 32 output dimensions per lane in registers.
void CheckHeadSize(int C, int NH) {
  CHECK(NH > 0 && C % NH == 0 && C / NH <= ops::kMaxHeadSize)
      << "CudaGptKernels attention: head size C / NH = " << C << " / " << NH
      << " must be a whole number <= " << ops::kMaxHeadSize;
}

// The largest power of two (up to 256) dividing a device address: what
// cuBLASLt's algorithms may assume about the operands (its heuristic
// preferences default to 256).
uint32_t AlignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// cuBLASLt's workspace, allocated once.
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

}  // namespace

struct CudaGptKernels::BiasGemm {
  // A cached matmul: descriptors, layouts, the chosen algorithm; `usable`
  // false when cuBLASLt offered none (the caller falls back).
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
  };
  // N, IC, OC, beta != 0, rounded operands, and the alignments of inp,
  // weight, out, bias.
  using Key = std::array<int64_t, 9>;

  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, Plan> plans;

  ~BiasGemm() {
    for (auto& [key, plan] : plans) {
      if (plan.c != nullptr) cublasLtMatrixLayoutDestroy(plan.c);
      if (plan.b != nullptr) cublasLtMatrixLayoutDestroy(plan.b);
      if (plan.a != nullptr) cublasLtMatrixLayoutDestroy(plan.a);
      if (plan.desc != nullptr) cublasLtMatmulDescDestroy(plan.desc);
    }
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

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
  auto bias_gemm = std::make_unique<BiasGemm>();
  if (cublasStatus_t s = cublasLtCreate(&bias_gemm->handle); s != CUBLAS_STATUS_SUCCESS) {
    bias_gemm->handle = nullptr;
    cublasDestroy(handle);
    cudaFree(partials);
    return Status::Unavailable(std::string("cublasLtCreate failed: ") + cublasGetStatusString(s),
                               which);
  }
  if (cudaError_t e = cudaMalloc(&bias_gemm->workspace, kLtWorkspaceBytes); e != cudaSuccess) {
    bias_gemm->workspace = nullptr;
    cublasDestroy(handle);
    cudaFree(partials);
    return Status::Unavailable(
        std::string("cannot allocate cuBLASLt's workspace: ") + cudaGetErrorString(e), which);
  }
  const bool tensor_core_attention =
      precision != Precision::kFp32 && ops::TensorCoreAttentionAvailable();
  return std::unique_ptr<CudaGptKernels>(
      new CudaGptKernels(device, precision, tensor_core_attention, stream, handle,
                         static_cast<double*>(partials), std::move(bias_gemm)));
}

CudaGptKernels::CudaGptKernels(Device device, Precision precision, bool tensor_core_attention,
                               cudaStream_t stream, cublasHandle_t handle, double* partials,
                               std::unique_ptr<BiasGemm> bias_gemm)
    : device_(device),
      precision_(precision),
      tensor_core_attention_(tensor_core_attention),
      stream_(stream),
      handle_(handle),
      partials_(partials),
      bias_gemm_(std::move(bias_gemm)) {}

CudaGptKernels::~CudaGptKernels() {
  cudaSetDevice(device_.index);
  cudaStreamSynchronize(stream_);  // nothing of ours may still use the handle or buffer
  cublasDestroy(handle_);
  cudaFree(partials_);
  for (Scratch& scratch : rounded_) cudaFree(scratch.data);
  cudaFree(column_partials_.data);
  // bias_gemm_'s destructor releases cuBLASLt's plans, workspace and handle.
}

void CudaGptKernels::Enter() const { FLEET_CUDA_CHECK(cudaSetDevice(device_.index)); }

void CudaGptKernels::Gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // op(A) op(B) is zero: C = beta C, i.e. untouched for beta 1
    if (beta == 0.0f) {
      FLEET_CUDA_CHECK(cudaMemset2DAsync(C, size_t(ldc) * sizeof(float), 0,
                                         size_t(N) * sizeof(float), size_t(M), stream_));
    }
    return;
  }
  const float alpha = 1.0f;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  if (RoundsOperands()) {
    // op(A) is [M, K]: A is stored [K, M] when transposed; likewise B.
    const size_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const size_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    const void* a16 = RoundOperand(0, A, a_rows, a_cols, lda);
    const void* b16 = RoundOperand(1, B, b_rows, b_cols, ldb);
    Gemm16(trans_a, trans_b, M, N, K, a16, static_cast<int>(a_cols), b16, static_cast<int>(b_cols),
           beta, C, ldc);
    return;
  }
  FLEET_CUBLAS_CHECK(cublasGemmEx(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                                  CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                                  ComputeType(precision_), CUBLAS_GEMM_DEFAULT));
}

void CudaGptKernels::Gemm16(bool trans_a, bool trans_b, int M, int N, int K, const void* A,
                            int lda, const void* B, int ldb, float beta, float* C, int ldc) {
  const float alpha = 1.0f;
  const cudaDataType_t type = Type16(precision_);
  FLEET_CUBLAS_CHECK(cublasGemmEx(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, type, ldb,
                                  A, type, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

void* CudaGptKernels::Grow(Scratch& scratch, size_t bytes) {
  if (bytes > scratch.bytes) {
    // cudaFree waits for the device, so the old buffer's readers are done.
    FLEET_CUDA_CHECK(cudaFree(scratch.data));
    scratch.data = nullptr;
    scratch.bytes = 0;
    FLEET_CUDA_CHECK(cudaMalloc(&scratch.data, bytes));
    scratch.bytes = bytes;
  }
  return scratch.data;
}

float* CudaGptKernels::ColumnSumPartials(int cols) {
  return static_cast<float*>(
      Grow(column_partials_, ops::ColumnSumsPartialFloats(cols) * sizeof(float)));
}

bool CudaGptKernels::RoundsOperands() const {
  return precision_ != Precision::kFp32 && gemm_operands_ == GemmOperands::kRounded;
}

const void* CudaGptKernels::RoundOperand(int slot, const float* src, size_t rows, size_t cols,
                                         size_t ld) {
  void* copy = Grow(rounded_[slot], rows * cols * 2);
  FLEET_CUDA_CHECK(ops::RoundRows(copy, src, rows, cols, ld, TileTypeOf(precision_), stream_));
  return copy;
}

bool CudaGptKernels::FusedBiasGemm(float* out, const float* inp, const float* weight,
                                   const float* bias, int N, int IC, int OC, float beta) {
  BiasGemm& lt = *bias_gemm_;
  const bool rounded = RoundsOperands();
  // Rounded operands live in scratch that cudaMalloc aligns to 256 bytes.
  const uint32_t align_inp = rounded ? 256 : AlignmentOf(inp);
  const uint32_t align_weight = rounded ? 256 : AlignmentOf(weight);
  const BiasGemm::Key key = {N,
                             IC,
                             OC,
                             beta != 0.0f,
                             rounded,
                             align_inp,
                             align_weight,
                             AlignmentOf(out),
                             AlignmentOf(bias)};
  auto [it, inserted] = lt.plans.try_emplace(key);
  BiasGemm::Plan& plan = it->second;
  if (inserted) {
    // Row-major out [N, OC] = inp weight^T is column-major out^T [OC, N] =
    // op(A) B with A the stored weight ([IC, OC] column-major, ld IC,
    // transposed) and B the stored inp ([IC, N], ld IC); the bias runs
    // along out^T's OC rows, as CUBLASLT_EPILOGUE_BIAS wants.
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    const void* bias_pointer = bias;  // its alignment steers the heuristic
    const cudaDataType_t operand_type = rounded ? Type16(precision_) : CUDA_R_32F;
    bool ok =
        cublasLtMatmulDescCreate(&plan.desc, rounded ? CUBLAS_COMPUTE_32F : ComputeType(precision_),
                                 CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                       sizeof(trans_a)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                       sizeof(trans_b)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                       sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                       sizeof(bias_type)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                       sizeof(bias_pointer)) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&plan.a, operand_type, IC, OC, IC) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&plan.b, operand_type, IC, N, IC) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, OC, N, OC) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t preference = nullptr;
    if (ok) {
      const uint64_t workspace = kLtWorkspaceBytes;
      const uint32_t align_a = align_weight, align_b = align_inp, align_c = AlignmentOf(out);
      ok = cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(
               preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
               sizeof(workspace)) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(
               preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(
               preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(
               preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(preference,
                                                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &align_c, sizeof(align_c)) == CUBLAS_STATUS_SUCCESS;
    }
    if (ok) {
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      ok =
          cublasLtMatmulAlgoGetHeuristic(lt.handle, plan.desc, plan.a, plan.b, plan.c, plan.c,
                                         preference, 1, &result, &found) == CUBLAS_STATUS_SUCCESS &&
          found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
      if (ok) plan.algo = result.algo;
    }
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    plan.usable = ok;
    if (!ok) {
      LOG(INFO) << "cuBLASLt has no fused-bias matmul for N " << N << ", IC " << IC << ", OC " << OC
                << " here; using cuBLAS and a bias kernel";
    }
  }
  if (!plan.usable) return false;
  const void* bias_pointer = bias;
  FLEET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias_pointer, sizeof(bias_pointer)));
  const float alpha = 1.0f;
  const void* a = weight;
  const void* b = inp;
  if (rounded) {
    a = RoundOperand(0, weight, OC, IC, IC);
    b = RoundOperand(1, inp, N, IC, IC);
  }
  FLEET_CUBLAS_CHECK(cublasLtMatmul(lt.handle, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, out,
                                    plan.c, out, plan.c, &plan.algo, lt.workspace,
                                    kLtWorkspaceBytes, stream_));
  return true;
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

void CudaGptKernels::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                       const float* inp, const float* weight, const float* mean,
                                       const float* rstd, int N, int C) {
  Enter();
  float* partials = ColumnSumPartials(C);
  FLEET_CUDA_CHECK(ops::LayerNormBackward(dinp, dweight, dbias, partials, dout, inp, weight, mean,
                                          rstd, N, C, stream_));
}

void CudaGptKernels::MatmulForward(float* out, const float* inp, const float* weight,
                                   const float* bias, int N, int IC, int OC, bool accumulate) {
  Enter();
  // out [N, OC] (+)= inp [N, IC] weight [OC, IC]^T, then the bias: one
  // cuBLASLt call where it has an algorithm, else a GEMM and a kernel.
  const float beta = accumulate ? 1.0f : 0.0f;
  if (bias != nullptr && N > 0 && IC > 0 && OC > 0 &&
      FusedBiasGemm(out, inp, weight, bias, N, IC, OC, beta)) {
    return;
  }
  Gemm(false, true, N, OC, IC, inp, IC, weight, IC, beta, out, OC);
  if (bias != nullptr) FLEET_CUDA_CHECK(ops::AddBias(out, bias, N, OC, stream_));
}

void CudaGptKernels::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, int N, int IC, int OC) {
  Enter();
  if (RoundsOperands() && N > 0 && IC > 0 && OC > 0) {
    // dout is an operand of both products: rounded once, kept in slot 0.
    const void* dout16 = RoundOperand(0, dout, N, OC, OC);
    if (dinp != nullptr) {
      Gemm16(false, false, N, IC, OC, dout16, OC, RoundOperand(1, weight, OC, IC, IC), IC, 1.0f,
             dinp, IC);
    }
    if (dweight == nullptr) return;  // a frozen weight (LoRA's base): no parameter gradients
    Gemm16(true, false, OC, IC, N, dout16, OC, RoundOperand(1, inp, N, IC, IC), IC, 1.0f,
           dweight, IC);
  } else {
    // dinp [N, IC] += dout [N, OC] weight [OC, IC].
    if (dinp != nullptr) Gemm(false, false, N, IC, OC, dout, OC, weight, IC, 1.0f, dinp, IC);
    // dweight [OC, IC] += dout^T [OC, N] inp [N, IC]; none for a frozen weight.
    if (dweight == nullptr) return;
    Gemm(true, false, OC, IC, N, dout, OC, inp, IC, 1.0f, dweight, IC);
  }
  if (dbias != nullptr) {
    FLEET_CUDA_CHECK(ops::BiasBackward(dbias, ColumnSumPartials(OC), dout, N, OC, stream_));
  }
}

size_t CudaGptKernels::AttentionSavedFloats(int B, int T, int NH) const {
  return size_t(B) * NH * T;
}

size_t CudaGptKernels::AttentionScratchFloats(int B, int T, int NH) const {
  return size_t(B) * NH * T;
}

void CudaGptKernels::AttentionForward(float* out, float* saved, float* /*scratch*/,
                                      const float* qkv, int B, int T, int C, int NH,
                                      const DropoutSpec& dropout) {
  CheckHeadSize(C, NH);
  Enter();
  FLEET_CUDA_CHECK(ops::AttentionForward(
      out, saved, qkv, B, T, C, NH, ops::DropoutArgsOf(dropout), TileTypeOf(precision_),
      PathOf(tensor_core_attention_, attention_kernel_), stream_));
}

void CudaGptKernels::AttentionBackward(float* dqkv, float* scratch, const float* dout,
                                       const float* qkv, const float* out, const float* saved,
                                       int B, int T, int C, int NH, const DropoutSpec& dropout) {
  CheckHeadSize(C, NH);
  Enter();
  FLEET_CUDA_CHECK(ops::AttentionBackward(
      dqkv, scratch, dout, qkv, out, saved, B, T, C, NH, ops::DropoutArgsOf(dropout),
      TileTypeOf(precision_), PathOf(tensor_core_attention_, attention_kernel_), stream_));
}

void CudaGptKernels::DropoutForward(float* out, const float* inp, const float* residual, int B,
                                    size_t n, const DropoutSpec& dropout) {
  CHECK(dropout.enabled()) << "DropoutForward needs p > 0";
  Enter();
  FLEET_CUDA_CHECK(
      ops::DropoutForward(out, inp, residual, B, n, ops::DropoutArgsOf(dropout), stream_));
}

void CudaGptKernels::DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                                     const DropoutSpec& dropout) {
  CHECK(dropout.enabled()) << "DropoutBackward needs p > 0";
  Enter();
  FLEET_CUDA_CHECK(ops::DropoutBackward(dinp, dout, B, n, ops::DropoutArgsOf(dropout), stream_));
}

void CudaGptKernels::AttentionDecodeForward(float* out, float* k_cache, float* v_cache,
                                            float* /*scratch*/, const float* qkv, int B, int T,
                                            int past, int maxT, int C, int NH) {
  CheckHeadSize(C, NH);
  CHECK(T >= 1 && past >= 0 && past + T <= maxT)
      << "AttentionDecodeForward: T " << T << ", past " << past << ", maxT " << maxT;
  Enter();
  FLEET_CUDA_CHECK(ops::AttentionDecodeForward(
      out, k_cache, v_cache, qkv, B, T, past, maxT, C, NH, TileTypeOf(precision_),
      PathOf(tensor_core_attention_, attention_kernel_), stream_));
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

void CudaGptKernels::EncoderShardForward(float* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, int B, int T, int C, int v_begin,
                                         int V) {
  Enter();
  FLEET_CUDA_CHECK(ops::EncoderShardForward(out, tokens, wte, wpe, B, T, C, v_begin, V, stream_));
}

void CudaGptKernels::EncoderShardBackward(float* dwte, float* dwpe, const float* dout,
                                          const int32_t* tokens, int B, int T, int C, int v_begin,
                                          int V) {
  Enter();
  FLEET_CUDA_CHECK(
      ops::EncoderShardBackward(dwte, dwpe, dout, tokens, B, T, C, v_begin, V, stream_));
}

void CudaGptKernels::CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) {
  Enter();
  FLEET_CUDA_CHECK(ops::CrossEntropyShardMax(row_max, logits, N, V, stream_));
}

void CudaGptKernels::CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                                           const int32_t* targets, int N, int V, int v_begin) {
  Enter();
  FLEET_CUDA_CHECK(
      ops::CrossEntropyShardSums(sums, logits, row_max, targets, N, V, v_begin, stream_));
}

void CudaGptKernels::CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                                             const float* sums, const int32_t* targets, int N,
                                             int V, int v_begin, float dloss, bool write_dlogits) {
  Enter();
  FLEET_CUDA_CHECK(ops::CrossEntropyShardFinish(losses, logits, row_max, sums, targets, N, V,
                                                v_begin, dloss, write_dlogits, stream_));
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
                                    s.bias_correction1, s.bias_correction2, s.grad_scale, stream_));
}

}  // namespace fleet::trainer
