// The CPU emulation of CUDA kernels (cuda_emulation.h) against plain loops:
// the mma's and ldmatrix's fragment layouts as the PTX ISA states them,
// shuffles, barriers, and threads that meet at different barriers reported
// instead of hanging.
// Built with FLEET_CUDA_EMULATION (the fleet_cuda_emulation target).
#include "trainer/kernels/cuda_emulation.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "trainer/kernels/cuda_emulatable.h"

namespace fleet::cuda_emulation {
namespace {

template <typename H>
uint32_t Pack(float lo, float hi) {
  H l, h;
  if constexpr (std::is_same_v<H, __nv_bfloat16>) {
    l = __float2bfloat16(lo);
    h = __float2bfloat16(hi);
  } else {
    l = __float2half(lo);
    h = __float2half(hi);
  }
  uint16_t lb, hb;
  std::memcpy(&lb, &l, 2);
  std::memcpy(&hb, &h, 2);
  return uint32_t{lb} | uint32_t{hb} << 16;
}

// One warp: D (16 x 8) = A (16 x 16) B (16 x 8) + C, each lane loading its
// fragments by the PTX ISA's formulas, then writing its part of D.
template <typename H>
__global__ void MmaKernel(float* D, const float* A, const float* B, const float* C) {
  const unsigned lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto a_at = [&](unsigned row, unsigned col) {
    return Pack<H>(A[row * 16 + col], A[row * 16 + col + 1]);
  };
  auto b_at = [&](unsigned k, unsigned col) {
    return Pack<H>(B[k * 8 + col], B[(k + 1) * 8 + col]);
  };
  const uint32_t a[4] = {a_at(g, 2 * t), a_at(g + 8, 2 * t), a_at(g, 2 * t + 8),
                         a_at(g + 8, 2 * t + 8)};
  const uint32_t b[2] = {b_at(2 * t, g), b_at(2 * t + 8, g)};
  float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  trainer::cuda::Mma16816<std::is_same_v<H, __nv_bfloat16>>(d, a, b, c);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

template <typename H>
void CheckMma() {
  // Small integers and halves: exact in bf16 and fp16, and every sum exact.
  std::vector<float> A(16 * 16), B(16 * 8), C(16 * 8), D(16 * 8, -1.0f);
  for (int i = 0; i < 16 * 16; ++i) A[i] = static_cast<float>((i * 7) % 11) - 5.0f;
  for (int i = 0; i < 16 * 8; ++i) B[i] = 0.5f * static_cast<float>((i * 5) % 9 - 4);
  for (int i = 0; i < 16 * 8; ++i) C[i] = static_cast<float>(i % 3);
  const cudaError_t e = FLEET_LAUNCH(MmaKernel<H>, dim3(1), dim3(32), 0, nullptr, D.data(),
                                     A.data(), B.data(), C.data());
  ASSERT_EQ(e, cudaSuccess);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      float want = C[r * 8 + c];
      for (int k = 0; k < 16; ++k) want += A[r * 16 + k] * B[k * 8 + c];
      EXPECT_EQ(D[r * 8 + c], want) << "D[" << r << "][" << c << "]";
    }
  }
}

TEST(CudaEmulationTest, MmaBf16FollowsThePtxFragmentLayout) { CheckMma<__nv_bfloat16>(); }
TEST(CudaEmulationTest, MmaFp16FollowsThePtxFragmentLayout) { CheckMma<__half>(); }

// ldmatrix.x4.trans: four 8x8 matrices of 16-bit values at rows of 12 words
// (48 bytes, 16-byte aligned, padded as the kernels pad); lane 8 i + j
// passes row j of matrix i, and each lane gets {M_i[2t][g], M_i[2t+1][g]}
// (the PTX ISA's ldmatrix with .trans: lane 4 r + w holds word w of row r
// of the transposed matrix).
__global__ void LdMatrixKernel(uint32_t* out, const uint16_t* rows, unsigned stride) {
  const unsigned lane = threadIdx.x;
  uint32_t r[4];
  trainer::cuda::LdMatrixX4Trans(r, rows + (lane / 8) * 8 * stride + (lane % 8) * stride);
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

TEST(CudaEmulationTest, LdMatrixTransFollowsThePtxLayout) {
  constexpr unsigned kStride = 24;  // elements a row: 8 used, 16 of padding
  alignas(16) uint16_t rows[32 * kStride];
  for (unsigned m = 0; m < 4; ++m) {
    for (unsigned row = 0; row < 8; ++row) {
      for (unsigned col = 0; col < kStride; ++col) {
        rows[(m * 8 + row) * kStride + col] = static_cast<uint16_t>(1000 * m + 10 * row + col);
      }
    }
  }
  std::vector<uint32_t> out(32 * 4, 0);
  ASSERT_EQ(FLEET_LAUNCH(LdMatrixKernel, dim3(1), dim3(32), 0, nullptr, out.data(), rows, kStride),
            cudaSuccess);
  for (unsigned lane = 0; lane < 32; ++lane) {
    const unsigned g = lane / 4, t = lane % 4;
    for (unsigned m = 0; m < 4; ++m) {
      const uint32_t lo = 1000 * m + 10 * (2 * t) + g, hi = 1000 * m + 10 * (2 * t + 1) + g;
      EXPECT_EQ(out[lane * 4 + m], lo | hi << 16) << "lane " << lane << " matrix " << m;
    }
  }
}

// Each warp sums its lanes with xor shuffles; thread 0 of the block then
// adds the warps' sums from shared memory after __syncthreads.
__global__ void SumKernel(float* out, const float* in) {
  FLEET_DYNAMIC_SHARED(float, warp_sums);
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = in[i];
  for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
    out[blockIdx.x] = total;
  }
}

TEST(CudaEmulationTest, ShufflesAndBarriersSumEachBlock) {
  std::vector<float> in(3 * 128), out(3, 0.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  ASSERT_EQ(FLEET_LAUNCH(SumKernel, dim3(3), dim3(128), 4 * sizeof(float), nullptr, out.data(),
                         in.data()),
            cudaSuccess);
  for (int b = 0; b < 3; ++b) {
    float want = 0;
    for (int i = 0; i < 128; ++i) want += in[b * 128 + i];
    EXPECT_EQ(out[b], want) << "block " << b;
  }
}

__global__ void BroadcastKernel(int* out) {
  const int mine = static_cast<int>(threadIdx.x) * 10;
  out[threadIdx.x] = __shfl_sync(0xffffffffu, mine, 3) + __shfl_sync(0xffffffffu, mine, 1, 16);
}

TEST(CudaEmulationTest, ShuffleFromALaneWithinWidth) {
  std::vector<int> out(32);
  ASSERT_EQ(FLEET_LAUNCH(BroadcastKernel, dim3(1), dim3(32), 0, nullptr, out.data()), cudaSuccess);
  for (int lane = 0; lane < 32; ++lane)
    EXPECT_EQ(out[lane], 30 + (lane / 16 * 16 + 1) * 10) << lane;
}

// Threads that return early do not hold up __syncthreads (as on Volta and
// later); a barrier that only some threads reach is an error.
__global__ void EarlyReturnKernel(int* out) {
  if (threadIdx.x >= 40) return;
  FLEET_DYNAMIC_SHARED(int, s);
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = s[39 - threadIdx.x];
}

__global__ void DivergentKernel() {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncwarp();
  }
}

TEST(CudaEmulationTest, EarlyReturnIsFineAndDivergentBarriersAreReported) {
  std::vector<int> out(64, -1);
  ASSERT_EQ(
      FLEET_LAUNCH(EarlyReturnKernel, dim3(1), dim3(64), 64 * sizeof(int), nullptr, out.data()),
      cudaSuccess);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(out[i], 39 - i);
  const std::string error = Launch(dim3(1), dim3(32), 0, [] { DivergentKernel(); });
  EXPECT_NE(error.find("threads wait at different barriers"), std::string::npos) << error;
}

// Each thread reads its neighbour's slot with no barrier after the writes:
// in one of the two blocks the neighbour has not run yet.
__global__ void MissingBarrierKernel(int* out) {
  FLEET_DYNAMIC_SHARED(int, s);
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

TEST(CudaEmulationTest, AMissingBarrierShowsInTheResult) {
  std::vector<int> out(2 * 64);
  ASSERT_EQ(
      FLEET_LAUNCH(MissingBarrierKernel, dim3(2), dim3(64), 64 * sizeof(int), nullptr, out.data()),
      cudaSuccess);
  int wrong = 0;
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 64; ++i) wrong += out[b * 64 + i] != (i + 1) % 64;
  }
  EXPECT_GT(wrong, 0) << "every read saw its neighbour's write without a barrier";
}

}  // namespace
}  // namespace fleet::cuda_emulation
