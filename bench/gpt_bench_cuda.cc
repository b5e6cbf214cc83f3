// gpt_bench's GPU pieces; see gpt_bench_cuda.h.
#include "bench/gpt_bench_cuda.h"

#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "trainer/kernels/cuda_backend.h"
#include "trainer/kernels/cuda_check.h"
#include "trainer/kernels/gpt_cuda_kernels.h"

namespace fleet::bench {

std::string_view KernelKindName(KernelKind kind) {
  switch (kind) {
    case KernelKind::kMatmul:
      return "matmul";
    case KernelKind::kAttention:
      return "attention";
    case KernelKind::kLayerNorm:
      return "layernorm";
    case KernelKind::kGelu:
      return "gelu";
    case KernelKind::kDropout:
      return "dropout";
    case KernelKind::kCrossEntropy:
      return "xentropy";
    case KernelKind::kEncoder:
      return "embedding";
    case KernelKind::kOptimizer:
      return "optimizer";
    case KernelKind::kCount:
      break;
  }
  return "?";
}

struct KernelTimer::Events {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> start, stop;
  std::vector<KernelKind> kind;
  size_t next = 0;  // pairs recorded since the last Collect()
  ~Events() {
    for (cudaEvent_t e : start) cudaEventDestroy(e);
    for (cudaEvent_t e : stop) cudaEventDestroy(e);
  }
};

KernelTimer::KernelTimer(trainer::GptKernels* inner, const trainer::Backend& backend)
    : inner_(inner), events_(std::make_unique<Events>()) {
  events_->stream = trainer::CudaBackendStream(backend);
  CHECK(events_->stream != nullptr) << "KernelTimer needs a CUDA backend";
}

KernelTimer::~KernelTimer() = default;

template <typename Call>
auto KernelTimer::Timed(KernelKind kind, Call&& call) {
  if (!enabled_) return call();
  Events& ev = *events_;
  if (ev.next == ev.start.size()) {
    cudaEvent_t a = nullptr, b = nullptr;
    FLEET_CUDA_CHECK(cudaEventCreate(&a));
    FLEET_CUDA_CHECK(cudaEventCreate(&b));
    ev.start.push_back(a);
    ev.stop.push_back(b);
    ev.kind.push_back(kind);
  }
  const size_t i = ev.next++;
  ev.kind[i] = kind;
  FLEET_CUDA_CHECK(cudaEventRecord(ev.start[i], ev.stream));
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    FLEET_CUDA_CHECK(cudaEventRecord(ev.stop[i], ev.stream));
  } else {
    auto result = call();
    FLEET_CUDA_CHECK(cudaEventRecord(ev.stop[i], ev.stream));
    return result;
  }
}

std::array<double, kKernelKinds> KernelTimer::Collect() {
  std::array<double, kKernelKinds> ms{};
  Events& ev = *events_;
  if (ev.next > 0) FLEET_CUDA_CHECK(cudaEventSynchronize(ev.stop[ev.next - 1]));
  for (size_t i = 0; i < ev.next; ++i) {
    float elapsed = 0.0f;
    FLEET_CUDA_CHECK(cudaEventElapsedTime(&elapsed, ev.start[i], ev.stop[i]));
    ms[static_cast<size_t>(ev.kind[i])] += elapsed;
  }
  ev.next = 0;
  return ms;
}

void KernelTimer::EncoderForward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int B, int T, int C) {
  Timed(KernelKind::kEncoder, [&] { inner_->EncoderForward(out, tokens, wte, wpe, B, T, C); });
}
void KernelTimer::EncoderBackward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int B, int T, int C) {
  Timed(KernelKind::kEncoder, [&] { inner_->EncoderBackward(dwte, dwpe, dout, tokens, B, T, C); });
}
void KernelTimer::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int N, int C) {
  Timed(KernelKind::kLayerNorm,
        [&] { inner_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C); });
}
void KernelTimer::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, const float* mean,
                                    const float* rstd, int N, int C) {
  Timed(KernelKind::kLayerNorm, [&] {
    inner_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  });
}
void KernelTimer::MatmulForward(float* out, const float* inp, const float* weight,
                                const float* bias, int N, int IC, int OC, bool accumulate) {
  Timed(KernelKind::kMatmul,
        [&] { inner_->MatmulForward(out, inp, weight, bias, N, IC, OC, accumulate); });
}
void KernelTimer::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, int N, int IC, int OC) {
  Timed(KernelKind::kMatmul,
        [&] { inner_->MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); });
}
size_t KernelTimer::AttentionSavedFloats(int B, int T, int NH) const {
  return inner_->AttentionSavedFloats(B, T, NH);
}
void KernelTimer::AttentionForward(float* out, float* saved, float* scratch, const float* qkv,
                                   int B, int T, int C, int NH,
                                   const trainer::DropoutSpec& dropout) {
  Timed(KernelKind::kAttention,
        [&] { inner_->AttentionForward(out, saved, scratch, qkv, B, T, C, NH, dropout); });
}
size_t KernelTimer::AttentionScratchFloats(int B, int T, int NH) const {
  return inner_->AttentionScratchFloats(B, T, NH);
}
void KernelTimer::AttentionBackward(float* dqkv, float* scratch, const float* dout,
                                    const float* qkv, const float* out, const float* saved, int B,
                                    int T, int C, int NH, const trainer::DropoutSpec& dropout) {
  Timed(KernelKind::kAttention, [&] {
    inner_->AttentionBackward(dqkv, scratch, dout, qkv, out, saved, B, T, C, NH, dropout);
  });
}
void KernelTimer::DropoutForward(float* out, const float* inp, const float* residual, int B,
                                 size_t n, const trainer::DropoutSpec& dropout) {
  Timed(KernelKind::kDropout, [&] { inner_->DropoutForward(out, inp, residual, B, n, dropout); });
}
void KernelTimer::DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                                  const trainer::DropoutSpec& dropout) {
  Timed(KernelKind::kDropout, [&] { inner_->DropoutBackward(dinp, dout, B, n, dropout); });
}
void KernelTimer::AttentionDecodeForward(float* out, float* k_cache, float* v_cache, float* scratch,
                                         const float* qkv, int B, int T, int past, int maxT, int C,
                                         int NH) {
  Timed(KernelKind::kAttention, [&] {
    inner_->AttentionDecodeForward(out, k_cache, v_cache, scratch, qkv, B, T, past, maxT, C, NH);
  });
}
void KernelTimer::GeluForward(float* out, const float* inp, size_t n) {
  Timed(KernelKind::kGelu, [&] { inner_->GeluForward(out, inp, n); });
}
void KernelTimer::GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  Timed(KernelKind::kGelu, [&] { inner_->GeluBackward(dinp, inp, dout, n); });
}
void KernelTimer::CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N,
                                      int V, float dloss, bool write_dlogits) {
  Timed(KernelKind::kCrossEntropy,
        [&] { inner_->CrossEntropyForward(losses, logits, targets, N, V, dloss, write_dlogits); });
}
void KernelTimer::EncoderShardForward(float* out, const int32_t* tokens, const float* wte,
                                      const float* wpe, int B, int T, int C, int v_begin, int V) {
  Timed(KernelKind::kEncoder,
        [&] { inner_->EncoderShardForward(out, tokens, wte, wpe, B, T, C, v_begin, V); });
}
void KernelTimer::EncoderShardBackward(float* dwte, float* dwpe, const float* dout,
                                       const int32_t* tokens, int B, int T, int C, int v_begin,
                                       int V) {
  Timed(KernelKind::kEncoder,
        [&] { inner_->EncoderShardBackward(dwte, dwpe, dout, tokens, B, T, C, v_begin, V); });
}
void KernelTimer::CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) {
  Timed(KernelKind::kCrossEntropy, [&] { inner_->CrossEntropyShardMax(row_max, logits, N, V); });
}
void KernelTimer::CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                                        const int32_t* targets, int N, int V, int v_begin) {
  Timed(KernelKind::kCrossEntropy,
        [&] { inner_->CrossEntropyShardSums(sums, logits, row_max, targets, N, V, v_begin); });
}
void KernelTimer::CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                                          const float* sums, const int32_t* targets, int N, int V,
                                          int v_begin, float dloss, bool write_dlogits) {
  Timed(KernelKind::kCrossEntropy, [&] {
    inner_->CrossEntropyShardFinish(losses, logits, row_max, sums, targets, N, V, v_begin, dloss,
                                    write_dlogits);
  });
}
double KernelTimer::SumOfSquares(const float* x, size_t n) {
  return Timed(KernelKind::kOptimizer, [&] { return inner_->SumOfSquares(x, n); });
}
void KernelTimer::AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                              const trainer::AdamWStep& step) {
  Timed(KernelKind::kOptimizer, [&] { inner_->AdamWUpdate(p, g, m, v, n, step); });
}

double CublasBf16GemmTflops(int n, int rounds) {
  const size_t elements = size_t(n) * n;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  FLEET_CUDA_CHECK(cudaMalloc(&a, elements * 2));
  FLEET_CUDA_CHECK(cudaMalloc(&b, elements * 2));
  FLEET_CUDA_CHECK(cudaMalloc(&c, elements * sizeof(float)));
  // Random operands in [-1, 1): constant or zero ones let the GPU run the
  // same product measurably faster than real data does.
  std::vector<uint16_t> host(elements);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (uint16_t& x : host) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float value = static_cast<float>(state >> 40) / float(1 << 23) - 1.0f;
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(bits));
    x = static_cast<uint16_t>(bits >> 16);  // bfloat16: the top half of a float
  }
  FLEET_CUDA_CHECK(cudaMemcpy(a, host.data(), elements * 2, cudaMemcpyHostToDevice));
  std::reverse(host.begin(), host.end());
  FLEET_CUDA_CHECK(cudaMemcpy(b, host.data(), elements * 2, cudaMemcpyHostToDevice));
  cublasHandle_t handle = nullptr;
  FLEET_CUBLAS_CHECK(cublasCreate(&handle));
  cudaEvent_t start = nullptr, stop = nullptr;
  FLEET_CUDA_CHECK(cudaEventCreate(&start));
  FLEET_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&] {
    FLEET_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a,
                                    CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c, CUDA_R_32F, n,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  gemm();  // warm-up: heuristics, clocks
  double best_ms = 0.0;
  for (int r = 0; r < rounds; ++r) {
    FLEET_CUDA_CHECK(cudaEventRecord(start, nullptr));
    gemm();
    FLEET_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    FLEET_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    FLEET_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r == 0 || ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * double(n) * n / (best_ms * 1e-3) * 1e-12;
}

bool SetGemmOperands(trainer::GptKernels* kernels, std::string_view operands) {
  auto* cuda = dynamic_cast<trainer::CudaGptKernels*>(kernels);
  if (cuda == nullptr) return false;
  using Operands = trainer::CudaGptKernels::GemmOperands;
  if (operands == "rounded") {
    cuda->set_gemm_operands(Operands::kRounded);
  } else if (operands == "in_kernel") {
    cuda->set_gemm_operands(Operands::kInKernel);
  } else {
    return false;
  }
  return true;
}

bool SetAttentionKernel(trainer::GptKernels* kernels, std::string_view name) {
  auto* cuda = dynamic_cast<trainer::CudaGptKernels*>(kernels);
  if (cuda == nullptr) return false;
  using Kernel = trainer::CudaGptKernels::AttentionKernel;
  if (name == "wmma") {
    cuda->set_attention_kernel(Kernel::kWmma);
  } else if (name == "mma") {
    cuda->set_attention_kernel(Kernel::kMma);
  } else if (name == "mma_ldmatrix") {
    cuda->set_attention_kernel(Kernel::kMmaLdMatrix);
  } else {
    return false;
  }
  return true;
}

double DeviceMemoryUsedMib() {
  size_t free = 0, total = 0;
  FLEET_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return double(total - free) / (1024.0 * 1024.0);
}

void SynchronizeDevice() { FLEET_CUDA_CHECK(cudaDeviceSynchronize()); }

void RunProfiledStep(const std::function<void()>& step) {
  FLEET_CUDA_CHECK(cudaProfilerStart());
  step();
  FLEET_CUDA_CHECK(cudaProfilerStop());
}

}  // namespace fleet::bench
