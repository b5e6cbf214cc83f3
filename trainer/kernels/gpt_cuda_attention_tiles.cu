// The tile attention kernels (gpt_cuda_attention_tiles.h), attention
// dropout included. See gpt_cuda_ops.h for what each launcher computes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "trainer/kernels/cuda_emulatable.h"
#include "trainer/kernels/gpt_cuda_attention_tiles.h"
#include "trainer/kernels/gpt_cuda_device.cuh"
#include "trainer/kernels/philox.h"

namespace fleet::trainer::cuda::gpt {
namespace {

using namespace dev;  // NOLINT: the kernels' shared device helpers

// The dropout mask of one (sequence, head) of attention: the factor of
// element t T + s (query t, key s) is 0 or 1 / (1 - p), or 1 without
// dropout (philox.h; the same bits as every other twin).
class Mask {
 public:
  __device__ Mask(const DropoutArgs& d, int b, int h)
      : on_(d.p > 0.0f),
        seed_(d.seed),
        site_(d.site),
        stream_(on_ ? d.streams[b] : 0u),
        lane_(static_cast<uint32_t>(d.head_offset + h)),
        threshold_(on_ ? philox::DropoutThreshold(d.p) : 0u),
        scale_(on_ ? 1.0f / (1.0f - d.p) : 1.0f) {}
  __device__ float Factor(uint64_t index) const {
    if (!on_) return 1.0f;
    return philox::DropoutKeep(seed_, site_, stream_, lane_, index, threshold_) ? scale_ : 0.0f;
  }

 private:
  bool on_;
  uint64_t seed_;
  uint32_t site_, stream_, lane_, threshold_;
  float scale_;
};

constexpr int kTile = kAttentionTile;
constexpr int kAttnWarps = 8;
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int kRowsPerWarp = kTile / kAttnWarps;  // warp w takes tile rows w, w + 8, ...
static_assert(kTile == 32, "one lane per key or query of a tile");

// dst [kTile, hs + 1] (padded: lane r reading row r's element d hits bank
// (r (hs + 1) + d) % 32, all different) gets rows [row0, row0 + kTile) of
// src (row stride ld_src; rows at or past T are zero, so that a masked
// probability 0 never meets uninitialised shared memory).
template <typename TT>
__device__ void LoadRows(TT* dst, const float* src, int row0, int T, int hs, size_t ld_src) {
  const int ld = hs + 1;
  for (int idx = threadIdx.x; idx < kTile * hs; idx += blockDim.x) {
    const int r = idx / hs, d = idx % hs;
    const int t = row0 + r;
    StoreTile(dst[r * ld + d], t < T ? src[size_t(t) * ld_src + d] : 0.0f);
  }
}

template <typename TT>
__device__ __forceinline__ float RowDot(const TT* a, const TT* b, int hs) {
  float acc = 0.0f;
  for (int d = 0; d < hs; ++d) acc += LoadTile(a[d]) * LoadTile(b[d]);
  return acc;
}

// Grid (B NH, ceil(Tq / kTile)); block kAttnThreads; dynamic shared memory
// 3 tiles (q, k, v). Lane j of the warp on query row i scores key k0 + j.
// With dropout the values are weighed by the dropped probabilities while the
// softmax's denominator sums them whole.
template <typename TT, int DPL>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionForwardKernel(ForwardParams a, DropoutArgs dropout) {
  FLEET_DYNAMIC_SHARED(unsigned char, smem);
  const int hs = a.C / a.NH, ld = hs + 1;
  TT* sQ = reinterpret_cast<TT*>(smem);
  TT* sK = sQ + kTile * ld;
  TT* sV = sK + kTile * ld;
  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
  const int q0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int Tk = a.past + a.Tq;  // keys in the sequence
  const float* qb = a.q + size_t(b) * a.q_batch + size_t(h) * hs;
  const float* kb = a.k + size_t(b) * a.kv_batch + size_t(h) * hs;
  const float* vb = a.v + size_t(b) * a.kv_batch + size_t(h) * hs;
  const Mask mask(dropout, b, h);

  LoadRows(sQ, qb, q0, a.Tq, hs, a.q_ld);
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) o[rr][e] = 0.0f;
  }
  // The key of the tile's last query; keys past it are masked for all rows.
  const int last = a.past + min(q0 + kTile, a.Tq) - 1;
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    __syncthreads();  // the previous k, v tiles are consumed
    LoadRows(sK, kb, k0, Tk, hs, a.kv_ld);
    LoadRows(sV, vb, k0, Tk, hs, a.kv_ld);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + rr * kAttnWarps, i = q0 + r;
      const int jmax = min(kTile, a.past + i - k0 + 1);  // keys k0 .. past + i of this tile
      if (i >= a.Tq || jmax <= 0) continue;              // uniform over the warp
      float sc = -INFINITY;
      if (lane < jmax) sc = RowDot(sQ + r * ld, sK + lane * ld, hs) * a.scale;
      const float m_new = fmaxf(m[rr], WarpMax(sc));  // finite: lane 0 is a key
      const float p = lane < jmax ? expf(sc - m_new) : 0.0f;
      const float corr = expf(m[rr] - m_new);  // 0 on the first tile
      l[rr] = l[rr] * corr + WarpSum(p);
      const float pv = lane < jmax ? p * mask.Factor(uint64_t(i) * a.Tq + k0 + lane) : 0.0f;
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[rr][e] *= corr;
      for (int j = 0; j < jmax; ++j) {
        const float pj = __shfl_sync(kFullMask, pv, j);
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
          const int d = lane + 32 * e;
          if (d < hs) o[rr][e] += pj * LoadTile(sV[j * ld + d]);
        }
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp + rr * kAttnWarps;
    if (i >= a.Tq) continue;
    const float inv = 1.0f / l[rr];
    float* dst = a.out + (size_t(b) * a.Tq + i) * a.C + size_t(h) * hs;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + 32 * e;
      if (d < hs) dst[d] = o[rr][e] * inv;
    }
    if (a.lse != nullptr && lane == 0) a.lse[size_t(bh) * a.Tq + i] = m[rr] + logf(l[rr]);
  }
}

// dots[b, h, t] = dout[b, t, h] . out[b, t, h] (over the head's hs columns);
// one warp per (b, t, h).
__global__ void AttentionRowDotKernel(float* dots, const float* dout, const float* out, int B,
                                      int T, int C, int NH) {
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= size_t(B) * T * NH) return;
  const int hs = C / NH;
  const int h = static_cast<int>(row % NH);
  const size_t bt = row / NH;  // b T + t
  const float* a = dout + bt * C + size_t(h) * hs;
  const float* o = out + bt * C + size_t(h) * hs;
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32) acc += a[d] * o[d];
  acc = WarpSum(acc);
  if (lane == 0) {
    const size_t b = bt / T, t = bt % T;
    dots[(b * NH + h) * T + t] = acc;
  }
}

// dK, dV of a tile of kTile keys: grid (B NH, ceil(T / kTile)). Walks the
// query tiles from the key tile on; lane i of the warp on key j takes query
// q0 + i. Dynamic shared memory: lse and dots of the query tile (2 kTile
// floats), then 4 tiles (k, v, q, dout).
template <typename TT, int DPL>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionBackwardKvKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                              const float* dots, int T, int C, int NH, float scale,
                              DropoutArgs dropout) {
  FLEET_DYNAMIC_SHARED(unsigned char, smem);
  const int hs = C / NH, ld = hs + 1;
  float* sL = reinterpret_cast<float*>(smem);
  float* sD = sL + kTile;
  TT* sK = reinterpret_cast<TT*>(sD + kTile);
  TT* sV = sK + kTile * ld;
  TT* sQ = sV + kTile * ld;
  TT* sO = sQ + kTile * ld;  // dout
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * hs;
  const float* dbase = dout + size_t(b) * T * C + size_t(h) * hs;
  const Mask mask(dropout, b, h);

  LoadRows(sK, base + C, k0, T, hs, C3);
  LoadRows(sV, base + 2 * C, k0, T, hs, C3);
  float dk[kRowsPerWarp][DPL], dv[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int e = 0; e < DPL; ++e) dk[rr][e] = dv[rr][e] = 0.0f;
  }
  for (int q0 = k0; q0 < T; q0 += kTile) {  // earlier queries do not see these keys
    __syncthreads();                        // the previous q, dout tiles are consumed
    LoadRows(sQ, base, q0, T, hs, C3);
    LoadRows(sO, dbase, q0, T, hs, size_t(C));
    if (threadIdx.x < kTile) {
      const int i = q0 + threadIdx.x;
      sL[threadIdx.x] = i < T ? lse[size_t(bh) * T + i] : 0.0f;
      sD[threadIdx.x] = i < T ? dots[size_t(bh) * T + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int kr = warp + rr * kAttnWarps, j = k0 + kr;
      if (j >= T) continue;  // uniform over the warp
      const int i = q0 + lane;
      const bool valid = i < T && i >= j;
      const float sc = RowDot(sQ + lane * ld, sK + kr * ld, hs) * scale;
      const float dp = RowDot(sO + lane * ld, sV + kr * ld, hs);
      // The mask's factor of (query i, key j): dV takes the dropped
      // probability, dS the gradient of the whole one.
      const float keep = valid ? mask.Factor(uint64_t(i) * T + j) : 0.0f;
      const float p = valid ? expf(sc - sL[lane]) : 0.0f;
      const float ds = valid ? p * (dp * keep - sD[lane]) * scale : 0.0f;
      const float pv = p * keep;
      for (int ii = 0; ii < kTile; ++ii) {
        const float pi = __shfl_sync(kFullMask, pv, ii);
        const float dsi = __shfl_sync(kFullMask, ds, ii);
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
          const int d = lane + 32 * e;
          if (d < hs) {
            dv[rr][e] += pi * LoadTile(sO[ii * ld + d]);
            dk[rr][e] += dsi * LoadTile(sQ[ii * ld + d]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int j = k0 + warp + rr * kAttnWarps;
    if (j >= T) continue;
    float* dst = dqkv + (size_t(b) * T + j) * C3 + size_t(h) * hs;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + 32 * e;
      if (d < hs) {
        dst[C + d] += dk[rr][e];
        dst[2 * C + d] += dv[rr][e];
      }
    }
  }
}

// dQ of a tile of kTile queries: grid (B NH, ceil(T / kTile)). Walks the key
// tiles up to the diagonal; lane j of the warp on query i takes key k0 + j.
// Dynamic shared memory: 4 tiles (q, dout, k, v).
template <typename TT, int DPL>
__global__ void __launch_bounds__(kAttnThreads)
    AttentionBackwardQKernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* dots, int T, int C, int NH, float scale,
                             DropoutArgs dropout) {
  FLEET_DYNAMIC_SHARED(unsigned char, smem);
  const int hs = C / NH, ld = hs + 1;
  TT* sQ = reinterpret_cast<TT*>(smem);
  TT* sO = sQ + kTile * ld;  // dout
  TT* sK = sO + kTile * ld;
  TT* sV = sK + kTile * ld;
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t C3 = size_t(3) * C;
  const float* base = qkv + size_t(b) * T * C3 + size_t(h) * hs;
  const Mask mask(dropout, b, h);

  LoadRows(sQ, base, q0, T, hs, C3);
  LoadRows(sO, dout + size_t(b) * T * C + size_t(h) * hs, q0, T, hs, size_t(C));
  float L[kRowsPerWarp], D[kRowsPerWarp], dq[kRowsPerWarp][DPL];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp + rr * kAttnWarps;
    L[rr] = i < T ? lse[size_t(bh) * T + i] : 0.0f;
    D[rr] = i < T ? dots[size_t(bh) * T + i] : 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) dq[rr][e] = 0.0f;
  }
  const int last = min(q0 + kTile, T) - 1;
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    __syncthreads();  // the previous k, v tiles are consumed (and q, dout loaded)
    LoadRows(sK, base + C, k0, T, hs, C3);
    LoadRows(sV, base + 2 * C, k0, T, hs, C3);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + rr * kAttnWarps, i = q0 + r;
      const int jmax = min(kTile, i - k0 + 1);
      if (i >= T || jmax <= 0) continue;  // uniform over the warp
      float ds = 0.0f;
      if (lane < jmax) {
        const float sc = RowDot(sQ + r * ld, sK + lane * ld, hs) * scale;
        const float dp = RowDot(sO + r * ld, sV + lane * ld, hs);
        const float keep = mask.Factor(uint64_t(i) * T + k0 + lane);
        ds = expf(sc - L[rr]) * (dp * keep - D[rr]) * scale;
      }
      for (int j = 0; j < jmax; ++j) {
        const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
        for (int e = 0; e < DPL; ++e) {
          const int d = lane + 32 * e;
          if (d < hs) dq[rr][e] += dsj * LoadTile(sK[j * ld + d]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int i = q0 + warp + rr * kAttnWarps;
    if (i >= T) continue;
    float* dst = dqkv + (size_t(b) * T + i) * C3 + size_t(h) * hs;
#pragma unroll
    for (int e = 0; e < DPL; ++e) {
      const int d = lane + 32 * e;
      if (d < hs) dst[d] += dq[rr][e];
    }
  }
}

}  // namespace

ForwardParams ForwardLayout(const AttentionArgs& a) {
  const size_t C3 = size_t(3) * a.C;
  const float scale = 1.0f / sqrtf(static_cast<float>(a.C / a.NH));
  ForwardParams p{a.out,    a.aux,    a.qkv, a.qkv + a.C, a.qkv + 2 * a.C,
                  a.T * C3, a.T * C3, C3,    C3,          a.T,
                  a.past,   a.C,      a.NH,  scale};
  if (a.k_cache != nullptr) {
    p.k = a.k_cache;
    p.v = a.v_cache;
    p.kv_batch = size_t(a.maxT) * a.C;
    p.kv_ld = size_t(a.C);
  }
  return p;
}

cudaError_t AttentionRowDots(const AttentionArgs& a, cudaStream_t s) {
  const size_t rows = size_t(a.B) * a.T * a.NH;
  const unsigned dot_blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return FLEET_LAUNCH(AttentionRowDotKernel, dim3(dot_blocks), dim3(kThreads), 0, s, a.aux, a.dout,
                      a.fout, a.B, a.T, a.C, a.NH);
}

namespace {

template <typename TT, int DPL>
cudaError_t LaunchAttention(bool backward, const AttentionArgs& a, cudaStream_t s) {
  const int hs = a.C / a.NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const dim3 grid(static_cast<unsigned>(a.B * a.NH),
                  static_cast<unsigned>((a.T + kTile - 1) / kTile));
  const size_t tile_bytes = size_t(kTile) * (hs + 1) * sizeof(TT);
  cudaError_t e;
  if (!backward) {
    const ForwardParams p = ForwardLayout(a);
    const size_t bytes = 3 * tile_bytes;
    const auto forward = AttentionForwardKernel<TT, DPL>;
    if ((e = AllowDynamicShared(forward, bytes)) != cudaSuccess) return e;
    return FLEET_LAUNCH(forward, grid, dim3(kAttnThreads), bytes, s, p, a.dropout);
  }
  if ((e = AttentionRowDots(a, s)) != cudaSuccess) return e;
  const size_t kv_bytes = 2 * kTile * sizeof(float) + 4 * tile_bytes;
  const auto kv = AttentionBackwardKvKernel<TT, DPL>;
  if ((e = AllowDynamicShared(kv, kv_bytes)) != cudaSuccess) return e;
  e = FLEET_LAUNCH(kv, grid, dim3(kAttnThreads), kv_bytes, s, a.out, a.dout, a.qkv, a.lse, a.aux,
                   a.T, a.C, a.NH, scale, a.dropout);
  if (e != cudaSuccess) return e;
  const size_t q_bytes = 4 * tile_bytes;
  const auto dq = AttentionBackwardQKernel<TT, DPL>;
  if ((e = AllowDynamicShared(dq, q_bytes)) != cudaSuccess) return e;
  return FLEET_LAUNCH(dq, grid, dim3(kAttnThreads), q_bytes, s, a.out, a.dout, a.qkv, a.lse, a.aux,
                      a.T, a.C, a.NH, scale, a.dropout);
}

// Output dimensions per lane: the smallest power of two with 32 DPL >= hs.
template <typename TT>
cudaError_t DispatchHeadSize(bool backward, const AttentionArgs& a, cudaStream_t s) {
  const int hs = a.C / a.NH;
  if (hs <= 32) return LaunchAttention<TT, 1>(backward, a, s);
  if (hs <= 64) return LaunchAttention<TT, 2>(backward, a, s);
  if (hs <= 128) return LaunchAttention<TT, 4>(backward, a, s);
  if (hs <= kMaxHeadSize) return LaunchAttention<TT, 8>(backward, a, s);
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t TileAttention(bool backward, const AttentionArgs& a, TileType tile, cudaStream_t s) {
  if (a.B <= 0 || a.T <= 0 || a.C <= 0 || a.NH <= 0) return cudaSuccess;
  if (a.C % a.NH != 0) return cudaErrorInvalidValue;
  switch (tile) {
    case TileType::kBf16:
      return DispatchHeadSize<__nv_bfloat16>(backward, a, s);
    case TileType::kFp16:
      return DispatchHeadSize<__half>(backward, a, s);
    case TileType::kFloat:
      break;
  }
  return DispatchHeadSize<float>(backward, a, s);
}

}  // namespace fleet::trainer::cuda::gpt
