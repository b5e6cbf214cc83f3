#include "trainer/kernels/gpt_kernels_factory.h"

#include <string>
#include <utility>

#include "trainer/kernels/backend_factory.h"
#include "trainer/kernels/gpt_cpu_kernels.h"

#if FLEET_TRAINER_CUDA
#include "trainer/kernels/gpt_cuda_kernels.h"
#endif

namespace fleet::trainer {

Result<std::unique_ptr<GptKernels>> CreateGptKernels(Backend* backend, Precision precision,
                                                     ThreadPool* pool) {
  if (backend == nullptr) return Status::InvalidArgument("CreateGptKernels needs a backend", "null");
  const Device device = backend->device();
  if (device.is_cpu()) return std::unique_ptr<GptKernels>(std::make_unique<CpuGptKernels>(pool));
#if FLEET_TRAINER_CUDA
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<CudaGptKernels> cuda,
                         CudaGptKernels::Create(backend, precision));
  return std::unique_ptr<GptKernels>(std::move(cuda));
#else
  (void)precision;
  return Status::Unavailable("FleetPS was built without CUDA; no GPT kernels for device",
                             device.ToString());
#endif
}

Result<GptCompute> CreateGptCompute(std::string_view device, Precision precision,
                                    int cpu_threads) {
  FLEET_ASSIGN_OR_RETURN(const Device dev, ParseDevice(device));
  GptCompute compute;
  if (dev.is_cpu()) {
    if (cpu_threads < 1) {
      return Status::InvalidArgument("cpu_threads must be >= 1, got", std::to_string(cpu_threads));
    }
    compute.pool = SetUpGptCpuThreads(cpu_threads);
    if (precision != Precision::kFp32) {
      compute.precision_note = "note: Engine.mix_precision asks for " +
                               std::string(PrecisionName(precision)) +
                               ", but the CPU kernels compute in fp32: this run is fp32 (" +
                               std::string(PrecisionName(precision)) + " runs on GPUs)";
    }
  }
  FLEET_ASSIGN_OR_RETURN(compute.backend, CreateBackend(dev, compute.pool.get()));
  FLEET_ASSIGN_OR_RETURN(compute.kernels,
                         CreateGptKernels(compute.backend.get(), precision, compute.pool.get()));
  return compute;
}

}  // namespace fleet::trainer
