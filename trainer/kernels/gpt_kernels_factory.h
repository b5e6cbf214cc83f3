// Picking the GptKernels twin for a device: CpuGptKernels on "cpu",
// CudaGptKernels on "cuda:K" (when FleetPS is built with CUDA). Callers
// (gpt_pretrain, gpt_generate, benchmarks, tests) go through here and never
// name a twin, so a program runs on either device unchanged.
//
// Thread safety: the functions are; what they return follows GptKernels' and
// Backend's rule (one thread drives them at a time).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "comm/status.h"
#include "comm/thread_pool.h"
#include "trainer/backend.h"
#include "trainer/kernels/gpt_kernels.h"
#include "trainer/kernel_types.h"

namespace fleet::trainer {

// The twin for `backend`'s device, computing in `precision`:
//   cpu     CpuGptKernels over `pool` (not owned, may be null, must outlive
//           the twin). CPUs compute in float32 whatever the precision
//           (MixPrecisionConfig says so to users), so it is accepted and
//           ignored.
//   cuda:K  CudaGptKernels on the backend's device and stream (the backend
//           must come from CreateBackend; not owned, must outlive the twin);
//           `pool` is unused.
// Unavailable for a CUDA backend when FleetPS was built without CUDA or cuBLAS
// cannot start; InvalidArgument for a null backend.
Result<std::unique_ptr<GptKernels>> CreateGptKernels(Backend* backend, Precision precision,
                                                     ThreadPool* pool);

// Everything a GPT model computes with on one device, owned together and
// destroyed in the right order (kernels, then the backend, then the pool).
struct GptCompute {
  std::unique_ptr<ThreadPool> pool;  // CPU with more than 1 thread; else null
  std::unique_ptr<Backend> backend;
  std::unique_ptr<GptKernels> kernels;
  // One line for the user when the precision asked for is not the one that
  // runs (bf16 or fp16 on a CPU runs fp32); empty otherwise.
  std::string precision_note;
};

// The backend and twin for a device string ("cpu" or "cuda:K", ParseDevice's
// syntax). On "cpu" it calls SetUpGptCpuThreads(cpu_threads), which sets
// OpenBLAS to one thread process-wide: call it from main() (or a test)
// before any GEMM. cpu_threads is unused on CUDA.
// InvalidArgument for a malformed device or cpu_threads < 1 on CPU;
// Unavailable when asked for CUDA without CUDA support in this build, or
// without that GPU (the message names the device and how many are visible).
Result<GptCompute> CreateGptCompute(std::string_view device, Precision precision,
                                    int cpu_threads);

}  // namespace fleet::trainer
