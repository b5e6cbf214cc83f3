// The Backend for a device (trainer/backend.h): the CPU one (cpu_backend.h)
// or, in a CUDA build, the CUDA one (cuda_backend.h).
#pragma once

#include <memory>

#include "comm/status.h"
#include "comm/thread_pool.h"
#include "trainer/backend.h"

namespace fleet::trainer {

// Number of CUDA devices visible; 0 when built without CUDA or none present.
int CudaDeviceCount();

// The backend for `device`: a CpuBackend over `pool` for "cpu"; a CUDA backend
// (cuBLAS + kernels, its own stream and handle) for "cuda:K". Unavailable
// when built without CUDA or device K does not exist.
Result<std::unique_ptr<Backend>> CreateBackend(const Device& device, ThreadPool* pool);

}  // namespace fleet::trainer
