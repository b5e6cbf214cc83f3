// What a kernel source needs to compile both for the GPU (nvcc) and for the
// CPU emulation of its tests (trainer/kernels/cuda_emulation.h, a host
// compiler with FLEET_CUDA_EMULATION defined): dynamic shared memory, kernel
// launches, the 16-bit mma and the architecture guard go through these.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#ifdef FLEET_CUDA_EMULATION

#include "trainer/kernels/cuda_emulation.h"

// The kernel's dynamic shared memory as T*.
#define FLEET_DYNAMIC_SHARED(T, name) \
  T* name = static_cast<T*>(fleet::cuda_emulation::DynamicShared())
// Launches kernel(args...) and evaluates to its cudaError_t.
#define FLEET_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::fleet::cuda_emulation_support::Launched(                         \
      ::fleet::cuda_emulation::Launch(grid, block, shared_bytes, [&] { kernel(__VA_ARGS__); }))
// True where the tensor-core code is compiled in.
#define FLEET_MMA_COMPILED 1
// True in the emulation: no CUDA runtime calls (no GPU, no driver).
#define FLEET_CUDA_EMULATED 1

namespace fleet::cuda_emulation_support {
// The emulator's error, if any, was already a test failure's message; it is
// printed and the launch reported failed.
cudaError_t Launched(const std::string& error);
}  // namespace fleet::cuda_emulation_support

#else  // nvcc

#define FLEET_DYNAMIC_SHARED(T, name)                             \
  extern __shared__ __align__(128) unsigned char name##_bytes_[]; \
  T* name = reinterpret_cast<T*>(name##_bytes_)
#define FLEET_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  (kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__), cudaGetLastError())
#define FLEET_CUDA_EMULATED 0
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FLEET_MMA_COMPILED 1
#else
#define FLEET_MMA_COMPILED 0
#endif

#endif  // FLEET_CUDA_EMULATION

namespace fleet::trainer::cuda {

// Lets `kernel` take `bytes` of dynamic shared memory: above the default 48
// KiB a kernel must opt in (the device's own limit is checked by the launch
// itself). The emulation has no such limit.
template <typename Kernel>
cudaError_t AllowDynamicShared(Kernel kernel, size_t bytes) {
#if FLEET_CUDA_EMULATED
  (void)kernel;
  (void)bytes;
  return cudaSuccess;
#else
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
#endif
}

// D = A B + C on tensor cores, m16n8k16, 16-bit inputs (bf16 when kBf16,
// else fp16), float32 accumulators, in the fragment layout of the PTX ISA
// (trainer/kernels/cuda_emulation.h spells it out). Only where
// FLEET_MMA_COMPILED.
template <bool kBf16>
__device__ __forceinline__ void Mma16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                         const float c[4]) {
#ifdef FLEET_CUDA_EMULATION
  ::fleet::cuda_emulation::Mma16816(d, a, b, c, kBf16);
#elif FLEET_MMA_COMPILED
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
  }
#endif
}

// r[i] = {M_i[2t][g], M_i[2t+1][g]} of four 8x8 16-bit matrices in shared
// memory, lane 8 i + j passing the address of row j of M_i (16-byte
// aligned): ldmatrix.sync.aligned.m8n8.x4.trans (cuda_emulation.h spells it
// out), the B fragments of two m16n8k16 products from a row-major [k][n]
// tile. Only where FLEET_MMA_COMPILED.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t r[4], const void* row) {
#ifdef FLEET_CUDA_EMULATION
  ::fleet::cuda_emulation::LdMatrixX4Trans(r, row);
#elif FLEET_MMA_COMPILED
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#endif
}

}  // namespace fleet::trainer::cuda
