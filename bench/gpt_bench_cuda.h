// What gpt_bench needs on a GPU, without CUDA types in its interface (built
// only when FLEET_CUDA is ON; gpt_bench.cc uses it under FLEET_BENCH_CUDA):
// the time of each kind of kernel through CUDA events, the cuBLAS bf16 GEMM
// rate of the card, device memory in use, a device-wide wait.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string_view>

#include "trainer/backend.h"
#include "trainer/kernels/gpt_kernels.h"

namespace fleet::bench {

// The kinds of GptKernels call KernelTimer tells apart.
enum class KernelKind {
  kMatmul,
  kAttention,
  kLayerNorm,
  kGelu,
  kDropout,
  kCrossEntropy,
  kEncoder,
  kOptimizer,
  kCount
};
inline constexpr size_t kKernelKinds = static_cast<size_t>(KernelKind::kCount);
std::string_view KernelKindName(KernelKind kind);

// A GptKernels that forwards every call to `inner` (a CUDA twin on
// `backend`'s stream) and, while enabled, brackets it with CUDA events on
// that stream; Collect() waits for the last event and returns the GPU
// milliseconds per kind since the previous Collect(). Events come from a
// pool that grows during the first timed step and is reused after.
class KernelTimer final : public trainer::GptKernels {
 public:
  KernelTimer(trainer::GptKernels* inner, const trainer::Backend& backend);
  ~KernelTimer() override;

  void set_enabled(bool enabled) { enabled_ = enabled; }
  std::array<double, kKernelKinds> Collect();

  trainer::Device device() const override { return inner_->device(); }
  std::string_view name() const override { return inner_->name(); }
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
  size_t AttentionSavedFloats(int B, int T, int NH) const override;
  void AttentionForward(float* out, float* saved, float* scratch, const float* qkv, int B, int T,
                        int C, int NH, const trainer::DropoutSpec& dropout) override;
  size_t AttentionScratchFloats(int B, int T, int NH) const override;
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* out, const float* saved, int B, int T, int C, int NH,
                         const trainer::DropoutSpec& dropout) override;
  void DropoutForward(float* out, const float* inp, const float* residual, int B, size_t n,
                      const trainer::DropoutSpec& dropout) override;
  void DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                       const trainer::DropoutSpec& dropout) override;
  void AttentionDecodeForward(float* out, float* k_cache, float* v_cache, float* scratch,
                              const float* qkv, int B, int T, int past, int maxT, int C,
                              int NH) override;
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
  void GeluForward(float* out, const float* inp, size_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N, int V,
                           float dloss, bool write_dlogits) override;
  double SumOfSquares(const float* x, size_t n) override;
  void AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                   const trainer::AdamWStep& step) override;

 private:
  struct Events;  // the CUDA event pool
  // Records a start event, runs `call`, records a stop event, for `kind`.
  template <typename Call>
  auto Timed(KernelKind kind, Call&& call);

  trainer::GptKernels* const inner_;
  std::unique_ptr<Events> events_;
  bool enabled_ = false;
};

// The best rate of an n x n x n GEMM with bfloat16 inputs and float32
// accumulation and output through cublasGemmEx on the current device
// (CUBLAS_COMPUTE_32F, tensor cores), over `rounds` runs after a warm-up:
// the peak MFU is measured against. TFLOP/s.
double CublasBf16GemmTflops(int n, int rounds);

// Sets how `kernels` (a CudaGptKernels) feeds its 16-bit GEMMs: "rounded"
// (16-bit scratch copies of the operands) or "in_kernel" (float32 operands,
// FAST_16BF / _16F compute type). False for any other name.
bool SetGemmOperands(trainer::GptKernels* kernels, std::string_view operands);

// Sets which tensor-core attention kernels `kernels` (a CudaGptKernels) runs:
// "mma" (the default), "wmma" or "mma_ldmatrix" (CudaGptKernels::AttentionKernel). False for
// any other name.
bool SetAttentionKernel(trainer::GptKernels* kernels, std::string_view name);

// Device memory in use on the current device (total - free), MiB: with
// everything allocated up front, the training step's high-water mark.
double DeviceMemoryUsedMib();

// Waits for all work on the current device.
void SynchronizeDevice();

// Runs `step` between cudaProfilerStart and cudaProfilerStop, so that
// `ncu --profile-from-start off gpt_bench ...` profiles the kernels of
// exactly one training step (scripts/gpu_check.sh with GPU_CHECK_NCU=1).
// Without a profiler attached it is one more step.
void RunProfiledStep(const std::function<void()>& step);

}  // namespace fleet::bench
