#include "trainer/kernels/backend_factory.h"

#include "trainer/kernels/cpu_backend.h"
#if FLEET_TRAINER_CUDA
#include "trainer/kernels/cuda_backend.h"
#endif

namespace fleet::trainer {

int CudaDeviceCount() {
#if FLEET_TRAINER_CUDA
  return CudaDeviceCountImpl();
#else
  return 0;
#endif
}

Result<std::unique_ptr<Backend>> CreateBackend(const Device& device, ThreadPool* pool) {
  if (device.is_cpu()) return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(pool));
#if FLEET_TRAINER_CUDA
  return CreateCudaBackend(device.index);
#else
  return Status::Unavailable("FleetPS was built without CUDA; cannot use device",
                             device.ToString());
#endif
}

}  // namespace fleet::trainer
