// Runs CUDA kernels on the CPU, so that their indexing, fragment layouts and
// synchronisation are checked where no GPU is (most machines that build this
// project have none). For tests only (the fleet_cuda_emulation target): a
// kernel source written for it (gpt_cuda_flash_mma.cu) is compiled a second
// time by the host compiler with FLEET_CUDA_EMULATION defined, and its
// warp-level instructions then call the functions below.
//
// Model: one OS thread runs a block at a time; each CUDA thread of the block
// is a fiber (ucontext) that runs until it reaches a barrier (__syncthreads,
// or the warp barrier inside a shuffle, __syncwarp or an mma) and then
// yields. A barrier opens when every thread it waits for has reached it, and
// a kernel whose threads reach different barriers (a __syncthreads under a
// condition, a shuffle with lanes that returned) is reported instead of
// hanging. Between barriers the fibers run one after another, in an order
// that changes from one barrier to the next and from block to block, so a
// missing barrier shows as a thread reading shared memory before another
// wrote it (it starts as a fill pattern, not zeros).
//
// What it does not model: timing, memory ordering between blocks (blocks
// run one after another), warp-synchronous code without explicit
// synchronisation (lanes run one at a time between barriers), and the exact
// rounding of the tensor cores (the mma sums in float32 in k order).
// Shared memory is the dynamic kind only: kernels reach it through
// FLEET_DYNAMIC_SHARED (cuda_emulatable.h).
#pragma once

#include <cuda_runtime.h>  // dim3, uint3: host declarations under a host compiler

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

// Launch bounds are a hint to nvcc; the host compiler does not know them.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

// The built-in variables a kernel reads, set for the fiber that runs.
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

namespace fleet::cuda_emulation {

// Runs `kernel` (a call of the kernel with its arguments) for every thread of
// every block of `grid`, with `shared_bytes` of dynamic shared memory per
// block (filled with a pattern, not zeros, as on a GPU it is not cleared).
// Returns "" or what went wrong (threads that reached different barriers).
std::string Launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel);

// The running block's dynamic shared memory.
void* DynamicShared();

// __syncthreads: waits until every thread of the block arrives.
void SyncThreads();
// __syncwarp: waits until every lane of the calling warp arrives.
void SyncWarp();
// The calling thread's lane (linear thread index % 32).
unsigned LaneId();

// The `bits` that `lane` passed: every lane of the warp must call it (a
// full mask).
uint64_t ShuffleBits(uint64_t bits, unsigned lane);

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 as the PTX
// ISA lays its fragments out (g = lane / 4, t = lane % 4; the low 16 bits of
// a register hold the element with the lower index):
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]
//   a[2] = A[g][2t+8..+9]   a[3] = A[g+8][2t+8..+9]
//   b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..+9][g]
//   c/d  = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// Every lane of the warp must call it.
void Mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], bool bf16);

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane 8 i + j passes the
// address of row j of 8x8 matrix M_i (8 16-bit elements, 16-byte aligned;
// a misaligned row is a kernel bug and stops the test), and each lane gets
// r[i] = {M_i[2t][g], M_i[2t+1][g]} (g = lane / 4, t = lane % 4, the first
// in the low 16 bits): M_i transposed into the layout of an mma fragment.
// Every lane of the warp must call it.
void LdMatrixX4Trans(uint32_t r[4], const void* row);

}  // namespace fleet::cuda_emulation

// The CUDA intrinsics the emulated kernels call.
inline void __syncthreads() { fleet::cuda_emulation::SyncThreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { fleet::cuda_emulation::SyncWarp(); }

namespace fleet::cuda_emulation {
// The `value` that lane `source` of the calling warp passed.
template <typename T>
T ShuffleValue(T value, unsigned source) {
  static_assert(sizeof(T) <= 8, "shuffle of up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = ShuffleBits(bits, source);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}
}  // namespace fleet::cuda_emulation

template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int width = 32) {
  const unsigned lane = fleet::cuda_emulation::LaneId();
  // Within segments of `width` lanes, as on the GPU.
  const unsigned partner = lane ^ static_cast<unsigned>(lane_mask);
  return fleet::cuda_emulation::ShuffleValue(value,
                                             partner / width == lane / width ? partner : lane);
}

template <typename T>
T __shfl_sync(unsigned, T value, int src_lane, int width = 32) {
  const unsigned lane = fleet::cuda_emulation::LaneId();
  return fleet::cuda_emulation::ShuffleValue(
      value, lane / width * width + static_cast<unsigned>(src_lane) % width);
}

// CUDA's integer min / max, which device code calls unqualified.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a < b ? b : a; }
