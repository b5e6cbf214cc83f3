// The CUDA implementation of Backend (cuBLAS sgemm + the small kernels of
// cuda_kernels.cu). Built only when FLEET_CUDA is ON; use it through
// CreateBackend() in trainer/kernels/backend_factory.h rather than directly.
#pragma once

#include <memory>

#include <cuda_runtime.h>

#include "comm/status.h"
#include "trainer/backend.h"

namespace fleet::trainer {

// Number of CUDA devices; 0 when the driver reports none or no driver.
int CudaDeviceCountImpl();

// A backend on CUDA device `index` with its own stream and cuBLAS handle.
// Unavailable when the device does not exist or CUDA cannot start on it.
Result<std::unique_ptr<Backend>> CreateCudaBackend(int index);

// The stream every operation of `backend` runs on, so that other CUDA code
// driving the same buffers (CudaGptKernels) orders itself with the backend's
// copies and fills by using it too; null when `backend` was not made by
// CreateCudaBackend. The stream lives as long as the backend.
cudaStream_t CudaBackendStream(const Backend& backend);

}  // namespace fleet::trainer
