// CHECKs for CUDA runtime and cuBLAS calls in host code (cuda_backend.cc,
// gpt_cuda_kernels.cc). A failing CUDA call in the middle of a step leaves the
// device state unknown; it is not input we could reject, so it stops the
// process with the call and the reason (as any broken internal invariant
// does). Calls that can fail for outside reasons (no device, out of memory at
// set-up) return a Status instead, at their call sites.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <glog/logging.h>

#define FLEET_CUDA_CHECK(expr)                                           \
  do {                                                                   \
    const cudaError_t _e = (expr);                                       \
    CHECK(_e == cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)
#define FLEET_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                      \
    const cublasStatus_t _s = (expr);                                                       \
    CHECK(_s == CUBLAS_STATUS_SUCCESS) << #expr << ": " << cublasGetStatusString(_s) << " (" \
                                       << int(_s) << ")";                                   \
  } while (0)
