// CudaGptKernels: the CUDA twin of GptKernels (gpt_kernels.h). Built only
// when FLEET_CUDA is ON; callers get it through CreateGptKernels
// (gpt_kernels_factory.h) rather than by name.
//
// What runs where:
//   * the matmuls: cuBLAS on float32 buffers, with the compute type of the
//     precision (below) and float32 accumulation. A forward matmul with a
//     bias is one cuBLASLt matmul with the bias fused (CUBLASLT_EPILOGUE_BIAS:
//     out = inp weight^T + beta out + bias, so `accumulate` is beta 1); its
//     descriptors and algorithm are chosen once per shape and pointer
//     alignment and cached, with a workspace allocated at construction
//     (no allocation or host synchronisation per call); where cuBLASLt
//     offers no algorithm it falls back to cublasGemmEx plus a bias kernel.
//     The other GEMMs are cublasGemmEx. In bf16 / fp16 the float32 operands
//     are first rounded into 16-bit scratch copies (GemmOperands::kRounded)
//     so that cuBLAS runs its 16-bit tensor-core kernels. Bias gradients are a float32
//     column-sum kernel (gpt_cuda_ops.cu): cuBLASLt's BGRADB epilogue
//     overwrites its output, while the interface adds into dbias, so fusing
//     it would need a scratch vector and an add kernel for nothing saved;
//   * attention: flash attention. In bf16 / fp16 on sm_80+ with head sizes
//     that are multiples of 16 up to 128 (GPT-2: 64), on tensor cores
//     (gpt_cuda_flash_mma.h, the default: mma.sync with scores and
//     probabilities in registers; or, when set_attention_kernel(kWmma)
//     picks it, gpt_cuda_flash_tc.h: wmma over 64-row tiles, float32
//     accumulators; on an H200 the mma kernels took 27.4 ms of a GPT-2 124M
//     step against wmma's 37.9, bench/README.md);
//     otherwise (fp32, other head sizes, older GPUs) float arithmetic over
//     tiles of 32 queries x 32 keys (gpt_cuda_ops.cu). Both keep an online
//     softmax in shared memory or registers. What forward keeps for
//     backward is the row log-sum-exps only, B * NH * T floats
//     (AttentionSavedFloats); backward's scratch is another B * NH * T (the
//     rows' dout . out). No T x T matrix exists in global memory. Decoding
//     over a KV cache runs the same forward kernel on the caches. Head size
//     at most cuda::gpt::kMaxHeadSize (256; GPT-2 and GPT-3 use 64 to 128).
//     Backward stages 4 tiles of 32 x (hs + 1) elements: 66 KiB in float32
//     at hs 128, within every GPU since Ampere; float32 at hs above ~190
//     needs more than the 99 KiB of sm_86/sm_89 (the launch fails, CHECK);
//   * LayerNorm, GELU, embedding, cross-entropy, AdamW, SumOfSquares: plain
//     kernels, one warp per row or one thread per element.
//
// Precision (fixed at construction; the interface stays float32 at its
// boundary, parameters are float32 master weights):
//   kFp32  GEMMs in float32 (CUBLAS_COMPUTE_32F, no TF32), float32 tiles.
//          Within |got - want| <= 1e-4 + 1e-3 |want| of the CPU twin.
//   kBf16  GEMMs with CUBLAS_COMPUTE_32F_FAST_16BF (inputs rounded to
//          bfloat16 inside cuBLAS, float32 accumulation and output);
//          attention tiles of q, k, v and dout in bfloat16 (float arithmetic).
//   kFp16  the same with float16 (CUBLAS_COMPUTE_32F_FAST_16F, half tiles);
//          pair it with DynamicLossScaler (collective/loss_scaler.h): gradients
//          beyond 65504 overflow to inf inside the GEMMs.
//   Element-wise kernels, LayerNorm, cross-entropy and the optimizer compute
//   in float32 in every precision. The tolerances of the reduced precisions
//   per kernel are stated in tests/trainer/gpt_cuda_kernels_test.cc.
//
// Streams and synchronisation: every kernel and GEMM is enqueued on the
// stream of the CUDA Backend the twin was made for (CudaBackendStream), so
// they are ordered with that backend's copies and fills, which GptModel and
// ParamArena use on the same buffers; a backend's CopyToHost therefore sees
// every result. Calls return once enqueued, except SumOfSquares, which waits
// for its result. A failing CUDA or cuBLAS call stops the process with the
// call and the error (the device state is unknown afterwards; nothing here
// comes from outside the program).
//
// Determinism: no atomics; every reduction is summed in an order fixed by
// the shapes (see gpt_cuda_ops.cu), and cuBLAS on one stream gives the same
// bits for the same inputs on the same GPU model. Recompute relies on it.
//
// Thread safety: one thread at a time (GptKernels' rule). Each call makes
// the backend's device current on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/kernels/gpt_kernels.h"
#include "trainer/kernel_types.h"

namespace fleet::trainer {

class CudaGptKernels final : public GptKernels {
 public:
  // A twin on `backend`'s device and stream. `backend` is not owned, must
  // outlive the twin and must come from CreateCudaBackend (InvalidArgument
  // otherwise). Unavailable when the device or cuBLAS cannot be set up.
  static Result<std::unique_ptr<CudaGptKernels>> Create(Backend* backend, Precision precision);
  ~CudaGptKernels() override;

  CudaGptKernels(const CudaGptKernels&) = delete;
  CudaGptKernels& operator=(const CudaGptKernels&) = delete;

  Precision precision() const { return precision_; }
  // Whether attention runs on tensor cores (gpt_cuda_flash_tc.h): bf16 or
  // fp16 on a GPU of compute capability 8.0+ with code built for it; then
  // head sizes that are multiples of 16 up to 128 take that path.
  bool tensor_core_attention() const { return tensor_core_attention_; }

  // Which tensor-core kernels attention runs when tensor_core_attention():
  // kMma (the default; gpt_cuda_flash_mma.h: scores and probabilities in
  // registers on mma.sync), kWmma (gpt_cuda_flash_tc.h, the earlier
  // default, slower; both pass the same CUDA tests on an H200) or
  // kMmaLdMatrix (kMma's kernels reading the operands that need a
  // transpose with ldmatrix, MmaTransposes::kLdMatrix: the same bits as
  // kMma on the CPU emulation, not yet run on a GPU). gpt_bench picks one
  // with --attention. Same contract and tolerances every way; no effect
  // without tensor-core attention.
  enum class AttentionKernel { kWmma, kMma, kMmaLdMatrix };
  void set_attention_kernel(AttentionKernel kernel) { attention_kernel_ = kernel; }
  AttentionKernel attention_kernel() const { return attention_kernel_; }

  // How the bf16 / fp16 GEMMs take their float32 operands. kRounded (the
  // default) rounds each operand into a 16-bit scratch copy (one vectorised
  // pass) and multiplies 16-bit by 16-bit; kInKernel hands cuBLAS the
  // float32 buffers with the FAST_16BF / FAST_16F compute type, which rounds
  // inside its kernels. Same arithmetic either way (operands rounded to
  // nearest, float32 accumulation and output); gpt_bench times both. No
  // effect in fp32.
  enum class GemmOperands { kRounded, kInKernel };
  void set_gemm_operands(GemmOperands operands) { gemm_operands_ = operands; }
  GemmOperands gemm_operands() const { return gemm_operands_; }

  Device device() const override { return device_; }
  std::string_view name() const override { return "cuda"; }

  void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                      int T, int C) override;
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                       int T, int C) override;
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C) override;
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int N, int C) override;
  void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                     int IC, int OC, bool accumulate) override;
  void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                      const float* inp, const float* weight, int N, int IC, int OC) override;
  // Saved: the row log-sum-exps [B, NH, T]. Scratch: [B, NH, T].
  // REQUIRES (CHECK): C / NH <= cuda::gpt::kMaxHeadSize (256).
  size_t AttentionSavedFloats(int B, int T, int NH) const override;
  // Attention dropout runs on the tile kernels whatever set_attention_kernel
  // says (the tensor-core kernels have none).
  void AttentionForward(float* out, float* saved, float* scratch, const float* qkv, int B, int T,
                        int C, int NH, const DropoutSpec& dropout) override;
  size_t AttentionScratchFloats(int B, int T, int NH) const override;
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* out, const float* saved, int B, int T, int C, int NH,
                         const DropoutSpec& dropout) override;
  void DropoutForward(float* out, const float* inp, const float* residual, int B, size_t n,
                      const DropoutSpec& dropout) override;
  void DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                       const DropoutSpec& dropout) override;
  // Flash attention of the new queries over the caches (the forward kernel
  // reading keys and values from the caches); `scratch` is not used.
  void AttentionDecodeForward(float* out, float* k_cache, float* v_cache, float* scratch,
                              const float* qkv, int B, int T, int past, int maxT, int C,
                              int NH) override;
  void GeluForward(float* out, const float* inp, size_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N, int V,
                           float dloss, bool write_dlogits) override;
  void EncoderShardForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                           int B, int T, int C, int v_begin, int V) override;
  void EncoderShardBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            int B, int T, int C, int v_begin, int V) override;
  void CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) override;
  void CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                             const int32_t* targets, int N, int V, int v_begin) override;
  void CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                               const float* sums, const int32_t* targets, int N, int V, int v_begin,
                               float dloss, bool write_dlogits) override;
  // Blocks until the sum is on the host.
  double SumOfSquares(const float* x, size_t n) override;
  void AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                   const AdamWStep& step) override;

 private:
  struct BiasGemm;  // cuBLASLt state of the fused-bias forward matmul
  CudaGptKernels(Device device, Precision precision, bool tensor_core_attention,
                 cudaStream_t stream, cublasHandle_t handle, double* partials,
                 std::unique_ptr<BiasGemm> bias_gemm);
  // Makes the device current on the calling thread.
  void Enter() const;
  // Row-major C [M, N] = op(A) op(B) + beta C with float32 A, B, C and the
  // precision's compute type (cuBLAS is column-major: the operands swap).
  void Gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc);
  // out [N, OC] = inp [N, IC] weight [OC, IC]^T + beta out + bias in one
  // cuBLASLt call; false (nothing enqueued) when cuBLASLt has no algorithm
  // for this shape and these pointers' alignment.
  bool FusedBiasGemm(float* out, const float* inp, const float* weight, const float* bias, int N,
                     int IC, int OC, float beta);
  // Gemm over operands already rounded to the precision's 16-bit type
  // (packed, leading dimensions lda / ldb), float32 C.
  void Gemm16(bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda,
              const void* B, int ldb, float beta, float* C, int ldc);
  // True when GEMMs round their operands into scratch first (16-bit
  // precisions under GemmOperands::kRounded).
  bool RoundsOperands() const;
  // The 16-bit copy of src [rows, cols] (row stride ld) in scratch slot
  // `slot` (0 or 1: a GEMM's two operands), enqueued on the stream. The
  // slot grows to the largest operand on first use, not per step.
  const void* RoundOperand(int slot, const float* src, size_t rows, size_t cols, size_t ld);

  // Fixed after construction.
  const Device device_;
  const Precision precision_;
  const bool tensor_core_attention_;
  const cudaStream_t stream_;                  // the backend's; not owned
  const cublasHandle_t handle_;                // owned, bound to stream_
  double* const partials_;                     // owned device buffer of SumOfSquares' block sums
  const std::unique_ptr<BiasGemm> bias_gemm_;  // plans filled on first use of a shape

  GemmOperands gemm_operands_ = GemmOperands::kRounded;
  AttentionKernel attention_kernel_ = AttentionKernel::kMma;
  struct Scratch {
    void* data = nullptr;  // owned device buffer
    size_t bytes = 0;
  };
  // scratch.data with at least `bytes`, reallocated (never shrunk) when
  // smaller: allocation happens on a shape's first use, not per step.
  static void* Grow(Scratch& scratch, size_t bytes);
  // Device scratch for the column sums of `cols` columns (bias and LayerNorm
  // parameter gradients; ops::ColumnSumsPartialFloats).
  float* ColumnSumPartials(int cols);
  Scratch rounded_[2];       // the 16-bit operands of the GEMM in flight
  Scratch column_partials_;  // per-chunk column sums
};

}  // namespace fleet::trainer
