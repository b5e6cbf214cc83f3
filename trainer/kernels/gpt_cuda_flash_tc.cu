// Tensor-core flash attention; see gpt_cuda_flash_tc.h.
//
// Layout of a block (kThreads = 128): warp w owns rows [16 w, 16 w + 16) of
// the block's 64-row tile and every per-row tile in shared memory is split
// the same way, so a warp's scores, probabilities and (forward) output rows
// are its own: between a warp's wmma stores and its element-wise pass only
// __syncwarp() is needed; __syncthreads() guards the tiles every warp reads
// (the block's own rows, loaded once, and the streamed tiles). In the
// element-wise passes lane 2 r + half takes row r of the warp's 16 and the
// columns half, half + 2, ...; the two lanes of a row combine with one
// xor-shuffle.
//
// wmma requirements kept: every fragment pointer is 32-byte aligned (each
// region starts on 128 bytes; row offsets are multiples of 16 rows of a
// 16-byte-multiple stride, column offsets multiples of 16 elements), and the
// strides are multiples of 8 elements (16-bit tiles) or 4 (float tiles).
// Strides are padded by 8 (16-bit) or 4 (float) elements against bank
// conflicts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "trainer/kernels/cuda_emulatable.h"
#include "trainer/kernels/gpt_cuda_flash_common.cuh"
#include "trainer/kernels/gpt_cuda_flash_tc.h"

// Built for an architecture before sm_80 the kernels' bodies are only a
// trap, so nvcc finds their helpers unreferenced (warning 177).
#pragma nv_diag_suppress 177

namespace fleet::trainer::cuda::gpt {
namespace {

namespace wmma = nvcuda::wmma;

// Tile geometry for head size HS (a multiple of 16, at most 128).
template <int HS>
struct Tiles {
  static_assert(HS % 16 == 0 && HS >= 16 && HS <= kMaxTensorCoreHeadSize, "head size");
  static constexpr int kStream = HS <= 64 ? 64 : 32;       // rows of a streamed tile
  static constexpr int kLdH = HS + 8;                      // 16-bit tiles of HS columns
  static constexpr int kLdF = kStream + 4;                 // float score tiles
  static constexpr int kLdP = kStream + 8;                 // 16-bit probability tiles
  static constexpr int kLdO = HS + 4;                      // float output (forward)
  static constexpr size_t kOwnTile = size_t(kOwn) * kLdH;  // elements
  static constexpr size_t kStreamTile = size_t(kStream) * kLdH;
  static constexpr size_t kScore = size_t(kOwn) * kLdF;
  static constexpr size_t kProb = size_t(kOwn) * kLdP;
  static constexpr size_t kOut = size_t(kOwn) * kLdO;
  static_assert(kLdH % 8 == 0 && kLdP % 8 == 0 && kLdF % 4 == 0 && kLdO % 4 == 0, "wmma ldm");
  static_assert(16 * kLdF >= 256, "a warp's score rows hold one 16x16 staging tile");
};

// Shared memory of each kernel, in the order the kernels carve it.
template <typename TT, int HS>
constexpr size_t ForwardSmemBytes() {
  using L = Tiles<HS>;
  return Align128(L::kOwnTile * sizeof(TT)) + 2 * Align128(L::kStreamTile * sizeof(TT)) +
         Align128(L::kScore * sizeof(float)) + Align128(L::kProb * sizeof(TT)) +
         Align128(L::kOut * sizeof(float));
}
template <typename TT, int HS>
constexpr size_t BackwardKvSmemBytes() {
  using L = Tiles<HS>;
  return 2 * Align128(L::kOwnTile * sizeof(TT)) + 2 * Align128(L::kStreamTile * sizeof(TT)) +
         2 * Align128(L::kScore * sizeof(float)) + 2 * Align128(L::kProb * sizeof(TT)) +
         2 * Align128(L::kStream * sizeof(float));
}
template <typename TT, int HS>
constexpr size_t BackwardQSmemBytes() {
  using L = Tiles<HS>;
  return 2 * Align128(L::kOwnTile * sizeof(TT)) + 2 * Align128(L::kStreamTile * sizeof(TT)) +
         2 * Align128(L::kScore * sizeof(float)) + Align128(L::kProb * sizeof(TT));
}
// The largest of them (HS 64: dK/dV's 90624 bytes) must fit sm_86's 99 KiB.
static_assert(BackwardKvSmemBytes<__half, 64>() <= 99 * 1024, "shared memory");
static_assert(BackwardKvSmemBytes<__half, 128>() <= 99 * 1024, "shared memory");
static_assert(BackwardQSmemBytes<__half, 64>() <= 99 * 1024, "shared memory");
static_assert(BackwardQSmemBytes<__half, 128>() <= 99 * 1024, "shared memory");
static_assert(ForwardSmemBytes<__half, 128>() <= 99 * 1024, "shared memory");

// dst[r * ld + d] = src[(row0 + r) * ld_src + d] for r < rows, d < HS, as
// TT; rows at or past `limit` are zero (so that masked probabilities, which
// are 0, never meet uninitialised memory in a product).
// Four elements a thread (16-byte loads) when every row starts 16-byte
// aligned, which the block decides as one.
template <typename TT, int HS>
__device__ void LoadRows(TT* dst, int ld, const float* src, size_t ld_src, int row0, int rows,
                         int limit) {
  if (ld_src % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kQuads = HS / 4;  // HS is a multiple of 16
    for (int idx = threadIdx.x; idx < rows * kQuads; idx += kThreads) {
      const int r = idx / kQuads, d = (idx % kQuads) * 4;
      const int t = row0 + r;
      const float4 x = t < limit ? *reinterpret_cast<const float4*>(src + size_t(t) * ld_src + d)
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      TT* o = dst + r * ld + d;
      o[0] = ToTile<TT>(x.x);
      o[1] = ToTile<TT>(x.y);
      o[2] = ToTile<TT>(x.z);
      o[3] = ToTile<TT>(x.w);
    }
    return;
  }
  for (int idx = threadIdx.x; idx < rows * HS; idx += kThreads) {
    const int r = idx / HS, d = idx % HS;
    const int t = row0 + r;
    dst[r * ld + d] = ToTile<TT>(t < limit ? src[size_t(t) * ld_src + d] : 0.0f);
  }
}

template <typename TT>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, TT, wmma::row_major>;
template <typename TT>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, TT, wmma::col_major>;
template <typename TT>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, TT, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// out (16 x NCOLS float, row-major, stride ld_out) = A B^T where A is 16 x HS
// (row-major, stride lda) and B is NCOLS x HS (row-major, stride ldb): the
// scores of a warp's 16 rows against NCOLS streamed rows.
template <typename TT, int HS, int NCOLS>
__device__ __forceinline__ void RowsTimesRowsT(float* out, int ld_out, const TT* a, int lda,
                                               const TT* b, int ldb) {
#pragma unroll
  for (int n = 0; n < NCOLS / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragA<TT> fa;
      FragBCol<TT> fb;  // element (k, j) = b[(16 n + j) ldb + 16 kk + k]
      wmma::load_matrix_sync(fa, a + kk * 16, lda);
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, ld_out, wmma::mem_row_major);
  }
}

// acc[n] += A B[:, 16 n : 16 n + 16] for n < HS / 16, where A is 16 x K
// (row-major, stride lda) and B is K x HS (row-major, stride ldb).
template <typename TT, int HS, int K>
__device__ __forceinline__ void AccumulateRowsTimes(FragAcc (&acc)[HS / 16], const TT* a, int lda,
                                                    const TT* b, int ldb) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    FragA<TT> fa;
    wmma::load_matrix_sync(fa, a + kk * 16, lda);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      FragBRow<TT> fb;  // element (k, d) = b[(16 kk + k) ldb + 16 n + d]
      wmma::load_matrix_sync(fb, b + kk * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// dst[(row0 + r) ld_dst + 16 n + c] += acc[n](r, c) for rows row0 + r < limit,
// through `stage` (a warp's 256 floats of shared memory, 32-byte aligned).
template <int HS>
__device__ __forceinline__ void AddRowsToGlobal(float* dst, size_t ld_dst, int row0, int limit,
                                                const FragAcc (&acc)[HS / 16], float* stage) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) {
    __syncwarp();  // the previous fragment's values are read
    wmma::store_matrix_sync(stage, acc[n], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, c = e % 16;
      if (row0 + r < limit) dst[size_t(row0 + r) * ld_dst + n * 16 + c] += stage[e];
    }
  }
}

// Grid (B NH, ceil(Tq / 64)). The block's 64 queries against key tiles of
// kStream up to the last query's position, online softmax per row; the
// output rows accumulate in shared memory (float), rescaled per row.
template <typename TT, int HS>
__global__ void __launch_bounds__(kThreads) FlashForwardTc(ForwardArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never launched: TensorCoreAttentionAvailable() is false there
#else
  using L = Tiles<HS>;
  constexpr int S = L::kStream;
  extern __shared__ __align__(128) unsigned char smem[];
  SmemCarver carve{smem};
  TT* sQ = carve.Take<TT>(L::kOwnTile);
  TT* sK = carve.Take<TT>(L::kStreamTile);
  TT* sV = carve.Take<TT>(L::kStreamTile);
  float* sS = carve.Take<float>(L::kScore);
  TT* sP = carve.Take<TT>(L::kProb);
  float* sO = carve.Take<float>(L::kOut);

  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
  const int q0 = blockIdx.y * kOwn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;  // this lane's row of the warp's 16, its columns
  const int qi = q0 + warp * 16 + r;        // its query
  const bool row_valid = qi < a.Tq;
  const int Tk = a.past + a.Tq;  // keys in the sequence
  const float* qb = a.q + size_t(b) * a.q_batch + size_t(h) * HS;
  const float* kb = a.k + size_t(b) * a.kv_batch + size_t(h) * HS;
  const float* vb = a.v + size_t(b) * a.kv_batch + size_t(h) * HS;

  LoadRows<TT, HS>(sQ, L::kLdH, qb, a.q_ld, q0, kOwn, a.Tq);
  for (int idx = threadIdx.x; idx < int(L::kOut); idx += kThreads) sO[idx] = 0.0f;

  const bool warp_idle = q0 + warp * 16 >= a.Tq;  // every row of the warp is padding
  const int warp_last_key = a.past + min(q0 + warp * 16 + 15, a.Tq - 1);
  const int block_last_key = a.past + min(q0 + kOwn, a.Tq) - 1;
  const TT* wQ = sQ + warp * 16 * L::kLdH;
  float* wS = sS + warp * 16 * L::kLdF;
  TT* wP = sP + warp * 16 * L::kLdP;
  float* wO = sO + warp * 16 * L::kLdO;
  float* srow = wS + r * L::kLdF;
  TT* prow = wP + r * L::kLdP;
  float* orow = wO + r * L::kLdO;
  float m = -INFINITY, l = 0.0f;  // the row's running max and sum (both lanes of the row)

  for (int k0 = 0; k0 <= block_last_key; k0 += S) {
    __syncthreads();  // the previous k, v tiles are consumed (and sQ, sO are ready)
    LoadRows<TT, HS>(sK, L::kLdH, kb, a.kv_ld, k0, S, Tk);
    LoadRows<TT, HS>(sV, L::kLdH, vb, a.kv_ld, k0, S, Tk);
    __syncthreads();
    if (warp_idle || k0 > warp_last_key) continue;  // warp-uniform: all masked for these rows

    RowsTimesRowsT<TT, HS, S>(wS, L::kLdF, wQ, L::kLdH, sK, L::kLdH);
    __syncwarp();
    float tile_max = -INFINITY;
    for (int c = half; c < S; c += 2) {
      const bool valid = row_valid && k0 + c <= a.past + qi;
      const float sc = valid ? srow[c] * a.scale : -INFINITY;
      srow[c] = sc;
      tile_max = fmaxf(tile_max, sc);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    // -inf only for padding rows (a valid row sees key 0 on the first tile).
    const float corr = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int c = half; c < S; c += 2) {
      const float p = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - m_new);
      sum += p;
      prow[c] = ToTile<TT>(p);
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * corr + sum;
    m = m_new;
    for (int d = half; d < HS; d += 2) orow[d] *= corr;
    __syncwarp();

    // O += P V, the accumulators through shared memory (rows rescaled above).
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      FragAcc acc;
      wmma::load_matrix_sync(acc, wO + n * 16, L::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < S / 16; ++kk) {
        FragA<TT> fa;
        FragBRow<TT> fb;  // element (k, d) = V[k0 + 16 kk + k][16 n + d]
        wmma::load_matrix_sync(fa, wP + kk * 16, L::kLdP);
        wmma::load_matrix_sync(fb, sV + kk * 16 * L::kLdH + n * 16, L::kLdH);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(wO + n * 16, acc, L::kLdO, wmma::mem_row_major);
    }
  }
  __syncwarp();  // the warp's last output stores are visible to all its lanes
  if (row_valid) {
    const float inv = 1.0f / l;
    float* dst = a.out + (size_t(b) * a.Tq + qi) * a.C + size_t(h) * HS;
    for (int d = half; d < HS; d += 2) dst[d] = orow[d] * inv;
    if (a.lse != nullptr && half == 0) a.lse[size_t(bh) * a.Tq + qi] = m + logf(l);
  }
#endif
}

// dK, dV of the block's 64 keys: grid (B NH, ceil(T / 64)). Streams the
// query tiles from the key tile on (earlier queries do not see these keys);
// per tile the warp forms S^T = K Q^T and dP^T = V dO^T for its 16 keys,
// P^T and dS^T = P^T (dP^T - D) scale element-wise, then dV += P^T dO and
// dK += dS^T Q in register fragments.
template <typename TT, int HS>
__global__ void __launch_bounds__(kThreads) FlashBackwardKvTc(BackwardArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = Tiles<HS>;
  constexpr int S = L::kStream;
  extern __shared__ __align__(128) unsigned char smem[];
  SmemCarver carve{smem};
  TT* sK = carve.Take<TT>(L::kOwnTile);
  TT* sV = carve.Take<TT>(L::kOwnTile);
  TT* sQ = carve.Take<TT>(L::kStreamTile);
  TT* sdO = carve.Take<TT>(L::kStreamTile);
  float* sS = carve.Take<float>(L::kScore);
  float* sdP = carve.Take<float>(L::kScore);
  TT* sP = carve.Take<TT>(L::kProb);
  TT* sdS = carve.Take<TT>(L::kProb);
  float* sL = carve.Take<float>(S);
  float* sD = carve.Take<float>(S);

  const int T = a.T, C = a.C;
  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
  const int k0 = blockIdx.y * kOwn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  const int key = k0 + warp * 16 + r;  // this lane's key
  const size_t C3 = size_t(3) * C;
  const float* base = a.qkv + size_t(b) * T * C3 + size_t(h) * HS;
  const float* dbase = a.dout + size_t(b) * T * C + size_t(h) * HS;

  LoadRows<TT, HS>(sK, L::kLdH, base + C, C3, k0, kOwn, T);
  LoadRows<TT, HS>(sV, L::kLdH, base + 2 * C, C3, k0, kOwn, T);

  const bool warp_idle = k0 + warp * 16 >= T;  // every key of the warp is padding
  const TT* wK = sK + warp * 16 * L::kLdH;
  const TT* wV = sV + warp * 16 * L::kLdH;
  float* wS = sS + warp * 16 * L::kLdF;
  float* wdP = sdP + warp * 16 * L::kLdF;
  TT* wP = sP + warp * 16 * L::kLdP;
  TT* wdS = sdS + warp * 16 * L::kLdP;
  FragAcc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  for (int q0 = k0; q0 < T; q0 += S) {
    __syncthreads();  // the previous q, dout tiles are consumed (and sK, sV are ready)
    LoadRows<TT, HS>(sQ, L::kLdH, base, C3, q0, S, T);
    LoadRows<TT, HS>(sdO, L::kLdH, dbase, size_t(C), q0, S, T);
    for (int i = threadIdx.x; i < S; i += kThreads) {
      const int t = q0 + i;
      sL[i] = t < T ? a.lse[size_t(bh) * T + t] : 0.0f;
      sD[i] = t < T ? a.dots[size_t(bh) * T + t] : 0.0f;
    }
    __syncthreads();
    // Warp-uniform: every query of the tile precedes every key of the warp.
    if (warp_idle || q0 + S - 1 < k0 + warp * 16) continue;

    RowsTimesRowsT<TT, HS, S>(wS, L::kLdF, wK, L::kLdH, sQ, L::kLdH);
    RowsTimesRowsT<TT, HS, S>(wdP, L::kLdF, wV, L::kLdH, sdO, L::kLdH);
    __syncwarp();
    for (int c = half; c < S; c += 2) {
      const int qi = q0 + c;
      const bool valid = qi < T && qi >= key;
      float p = 0.0f, ds = 0.0f;
      if (valid) {
        p = expf(wS[r * L::kLdF + c] * a.scale - sL[c]);
        ds = p * (wdP[r * L::kLdF + c] - sD[c]) * a.scale;
      }
      wP[r * L::kLdP + c] = ToTile<TT>(p);
      wdS[r * L::kLdP + c] = ToTile<TT>(ds);
    }
    __syncwarp();
    AccumulateRowsTimes<TT, HS, S>(dv, wP, L::kLdP, sdO, L::kLdH);
    AccumulateRowsTimes<TT, HS, S>(dk, wdS, L::kLdP, sQ, L::kLdH);
  }
  if (warp_idle) return;  // no barrier follows
  float* dst = a.dqkv + size_t(b) * T * C3 + size_t(h) * HS;
  AddRowsToGlobal<HS>(dst + C, C3, k0 + warp * 16, T, dk, wS);
  AddRowsToGlobal<HS>(dst + 2 * C, C3, k0 + warp * 16, T, dv, wS);
#endif
}

// dQ of the block's 64 queries: grid (B NH, ceil(T / 64)). Streams the key
// tiles up to the last query; per tile the warp forms S = Q K^T and
// dP = dO V^T for its 16 queries, dS = P (dP - D) scale element-wise, then
// dQ += dS K in register fragments.
template <typename TT, int HS>
__global__ void __launch_bounds__(kThreads) FlashBackwardQTc(BackwardArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = Tiles<HS>;
  constexpr int S = L::kStream;
  extern __shared__ __align__(128) unsigned char smem[];
  SmemCarver carve{smem};
  TT* sQ = carve.Take<TT>(L::kOwnTile);
  TT* sdO = carve.Take<TT>(L::kOwnTile);
  TT* sK = carve.Take<TT>(L::kStreamTile);
  TT* sV = carve.Take<TT>(L::kStreamTile);
  float* sS = carve.Take<float>(L::kScore);
  float* sdP = carve.Take<float>(L::kScore);
  TT* sdS = carve.Take<TT>(L::kProb);

  const int T = a.T, C = a.C;
  const int bh = blockIdx.x, b = bh / a.NH, h = bh % a.NH;
  const int q0 = blockIdx.y * kOwn;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  const int qi = q0 + warp * 16 + r;  // this lane's query
  const bool row_valid = qi < T;
  const size_t C3 = size_t(3) * C;
  const float* base = a.qkv + size_t(b) * T * C3 + size_t(h) * HS;

  LoadRows<TT, HS>(sQ, L::kLdH, base, C3, q0, kOwn, T);
  LoadRows<TT, HS>(sdO, L::kLdH, a.dout + size_t(b) * T * C + size_t(h) * HS, size_t(C), q0, kOwn,
                   T);
  const float row_lse = row_valid ? a.lse[size_t(bh) * T + qi] : 0.0f;
  const float row_dot = row_valid ? a.dots[size_t(bh) * T + qi] : 0.0f;

  const bool warp_idle = q0 + warp * 16 >= T;
  const int warp_last = min(q0 + warp * 16 + 15, T - 1);
  const int block_last = min(q0 + kOwn, T) - 1;
  const TT* wQ = sQ + warp * 16 * L::kLdH;
  const TT* wdO = sdO + warp * 16 * L::kLdH;
  float* wS = sS + warp * 16 * L::kLdF;
  float* wdP = sdP + warp * 16 * L::kLdF;
  TT* wdS = sdS + warp * 16 * L::kLdP;
  FragAcc dq[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);

  for (int k0 = 0; k0 <= block_last; k0 += S) {
    __syncthreads();  // the previous k, v tiles are consumed (and sQ, sdO are ready)
    LoadRows<TT, HS>(sK, L::kLdH, base + C, C3, k0, S, T);
    LoadRows<TT, HS>(sV, L::kLdH, base + 2 * C, C3, k0, S, T);
    __syncthreads();
    if (warp_idle || k0 > warp_last) continue;  // warp-uniform: all masked for these rows

    RowsTimesRowsT<TT, HS, S>(wS, L::kLdF, wQ, L::kLdH, sK, L::kLdH);
    RowsTimesRowsT<TT, HS, S>(wdP, L::kLdF, wdO, L::kLdH, sV, L::kLdH);
    __syncwarp();
    for (int c = half; c < S; c += 2) {
      const bool valid = row_valid && k0 + c <= qi;
      float ds = 0.0f;
      if (valid) {
        const float p = expf(wS[r * L::kLdF + c] * a.scale - row_lse);
        ds = p * (wdP[r * L::kLdF + c] - row_dot) * a.scale;
      }
      wdS[r * L::kLdP + c] = ToTile<TT>(ds);
    }
    __syncwarp();
    AccumulateRowsTimes<TT, HS, S>(dq, wdS, L::kLdP, sK, L::kLdH);
  }
  if (warp_idle) return;  // no barrier follows
  AddRowsToGlobal<HS>(a.dqkv + size_t(b) * T * C3 + size_t(h) * HS, C3, q0 + warp * 16, T, dq, wS);
#endif
}

template <typename TT, int HS>
cudaError_t Forward(const ForwardArgs& a, int B, cudaStream_t s) {
  constexpr size_t bytes = ForwardSmemBytes<TT, HS>();
  cudaError_t e = AllowDynamicShared(FlashForwardTc<TT, HS>, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(B * a.NH), RowTiles(a.Tq));
  FlashForwardTc<TT, HS><<<grid, kThreads, bytes, s>>>(a);
  return cudaGetLastError();
}

template <typename TT, int HS>
cudaError_t Backward(const BackwardArgs& a, int B, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(B * a.NH), RowTiles(a.T));
  constexpr size_t kv_bytes = BackwardKvSmemBytes<TT, HS>();
  cudaError_t e = AllowDynamicShared(FlashBackwardKvTc<TT, HS>, kv_bytes);
  if (e != cudaSuccess) return e;
  FlashBackwardKvTc<TT, HS><<<grid, kThreads, kv_bytes, s>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  constexpr size_t q_bytes = BackwardQSmemBytes<TT, HS>();
  if ((e = AllowDynamicShared(FlashBackwardQTc<TT, HS>, q_bytes)) != cudaSuccess) return e;
  FlashBackwardQTc<TT, HS><<<grid, kThreads, q_bytes, s>>>(a);
  return cudaGetLastError();
}

struct LaunchForward {
  const ForwardArgs& a;
  int B;
  cudaStream_t s;
  template <typename TT, int HS>
  cudaError_t operator()() const {
    return Forward<TT, HS>(a, B, s);
  }
};

struct LaunchBackward {
  const BackwardArgs& a;
  int B;
  cudaStream_t s;
  template <typename TT, int HS>
  cudaError_t operator()() const {
    return Backward<TT, HS>(a, B, s);
  }
};

}  // namespace

bool TensorCoreAttentionSupports(TileType tile, int head_size) {
  return tile != TileType::kFloat && head_size > 0 && head_size % 16 == 0 &&
         head_size <= kMaxTensorCoreHeadSize;
}

bool TensorCoreAttentionAvailable() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      major < 8) {
    cudaGetLastError();
    return false;
  }
  // ptxVersion: the virtual architecture the code that would run here was
  // compiled for (80 for sm_80 code, 75 when sm_75 PTX is JIT-compiled).
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, FlashForwardTc<__nv_bfloat16, 64>) != cudaSuccess) {
    cudaGetLastError();  // no image for this device: not sticky
    return false;
  }
  return attr.ptxVersion >= 80;
}

cudaError_t TensorCoreAttentionForward(float* out, float* lse, const float* q, const float* k,
                                       const float* v, size_t q_batch, size_t kv_batch, size_t q_ld,
                                       size_t kv_ld, int B, int Tq, int past, int C, int NH,
                                       TileType tile, cudaStream_t s) {
  if (B <= 0 || Tq <= 0) return cudaGetLastError();
  const int hs = C / NH;
  const ForwardArgs a{out,  lse,   q,  k,    v, q_batch, kv_batch,
                      q_ld, kv_ld, Tq, past, C, NH,      1.0f / sqrtf(static_cast<float>(hs))};
  return WithTensorCoreTile(tile, hs, LaunchForward{a, B, s});
}

cudaError_t TensorCoreAttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                        const float* lse, const float* dots, int B, int T, int C,
                                        int NH, TileType tile, cudaStream_t s) {
  if (B <= 0 || T <= 0) return cudaGetLastError();
  const int hs = C / NH;
  const BackwardArgs a{dqkv, dout, qkv, lse, dots, T, C, NH, 1.0f / sqrtf(static_cast<float>(hs))};
  return WithTensorCoreTile(tile, hs, LaunchBackward{a, B, s});
}

}  // namespace fleet::trainer::cuda::gpt
