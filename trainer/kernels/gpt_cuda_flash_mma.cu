// Register-resident flash attention on mma.sync; see gpt_cuda_flash_mma.h.
//
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: D (16x8) = A (16x16) B
// (16x8) + C. With g = lane / 4 and t = lane % 4 (PTX ISA, "Matrix Fragments
// for mma.m16n8k16 with floating point type"), each lane holds
//   A: a0 = {A[g][2t], A[g][2t+1]},     a1 = {A[g+8][2t], A[g+8][2t+1]},
//      a2 = {A[g][2t+8], A[g][2t+9]},   a3 = {A[g+8][2t+8], A[g+8][2t+9]}
//   B: b0 = {B[2t][g], B[2t+1][g]},     b1 = {B[2t+8][g], B[2t+9][g]}
//   C: c0 = C[g][2t], c1 = C[g][2t+1],  c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// where {x, y} is one 32-bit register with x in the low 16 bits. Hence:
//   * every product here has the form out[i][n] = sum_k a[i][k] bt[n][k] with
//     a and bt row-major 16-bit tiles in shared memory, so a0..a3 and b0, b1
//     are single 32-bit loads of adjacent elements (B[k][n] = bt[n][k]);
//   * the C fragments of the 16x8 tiles 2j and 2j + 1 (columns 16j .. 16j+15)
//     rounded to pairs are exactly the A fragment of k-slice j (PackA):
//     a0 = (c0, c1) of tile 2j, a1 = (c2, c3) of 2j, a2, a3 the same of 2j+1.
// A warp's accumulator array acc[N / 8][4] is the warp's 16 rows x N
// columns: acc[j][e] is row g + 8 (e / 2), column 8 j + 2 t + e % 2.
//
// Shared memory: 16-bit tiles with row strides padded by 8 elements. A row
// of HS + 8 (or S + 8) elements is 4 mod 8 words long, so the eight rows g
// that a fragment load touches start on eight different 4-bank groups and
// the 32 lanes hit 32 banks. Every region starts on 128 bytes and every
// fragment load is at an even element: 4-byte aligned.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "trainer/kernels/cuda_emulatable.h"
#include "trainer/kernels/gpt_cuda_flash_common.cuh"
#include "trainer/kernels/gpt_cuda_flash_mma.h"
#include "trainer/kernels/gpt_cuda_flash_tc.h"

// Built for an architecture before sm_80 the kernels' bodies are only a
// trap, so nvcc finds their helpers unreferenced (warning 177).
#pragma nv_diag_suppress 177

namespace fleet::trainer::cuda::gpt {
namespace {

// Tile geometry for head size HS (a multiple of 16, at most 128).
template <int HS>
struct Tiles {
  static_assert(HS % 16 == 0 && HS >= 16 && HS <= kMaxTensorCoreHeadSize, "head size");
  static constexpr int kStream = HS <= 64 ? 64 : 32;  // rows of a streamed tile
  static constexpr int kLdRow = HS + 8;               // [rows][HS] tiles
  static constexpr int kLdT = kStream + 8;            // transposed [HS][kStream] tiles
  static_assert(kLdRow % 8 == 0 && kLdT % 8 == 0, "strides of 4 mod 8 words (see top)");
};

// kLdMatrix: no transposed copies (the B operands that need a transpose come
// from the row-major tiles through ldmatrix.trans; see MmaTransposes).
template <typename TT, int HS, bool kLdMatrix>
constexpr size_t ForwardSmemBytes() {
  using L = Tiles<HS>;
  return Align128(size_t(kOwn) * L::kLdRow * sizeof(TT)) +        // sQ
         Align128(size_t(L::kStream) * L::kLdRow * sizeof(TT)) +  // sK
         (kLdMatrix ? Align128(size_t(L::kStream) * L::kLdRow * sizeof(TT))  // sV
                    : Align128(size_t(HS) * L::kLdT * sizeof(TT)));          // sVt
}
template <typename TT, int HS, bool kLdMatrix>
constexpr size_t BackwardKvSmemBytes() {
  using L = Tiles<HS>;
  return 2 * Align128(size_t(kOwn) * L::kLdRow * sizeof(TT)) +                       // sK, sV
         2 * Align128(size_t(L::kStream) * L::kLdRow * sizeof(TT)) +                 // sQ, sdO
         (kLdMatrix ? 0 : 2 * Align128(size_t(HS) * L::kLdT * sizeof(TT))) +  // sQt, sdOt
         2 * Align128(size_t(L::kStream) * sizeof(float));                           // sL, sD
}
template <typename TT, int HS, bool kLdMatrix>
constexpr size_t BackwardQSmemBytes() {
  using L = Tiles<HS>;
  return 2 * Align128(size_t(kOwn) * L::kLdRow * sizeof(TT)) +        // sQ, sdO
         2 * Align128(size_t(L::kStream) * L::kLdRow * sizeof(TT)) +  // sK, sV
         (kLdMatrix ? 0 : Align128(size_t(HS) * L::kLdT * sizeof(TT)));  // sKt
}
// Within the 99 KiB a block may have on sm_86 / sm_89 (largest: dK/dV at
// HS 128, 72960 bytes).
static_assert(BackwardKvSmemBytes<__half, 64, false>() <= 99 * 1024, "shared memory");
static_assert(BackwardKvSmemBytes<__half, 128, false>() <= 99 * 1024, "shared memory");
static_assert(BackwardQSmemBytes<__half, 64, false>() <= 99 * 1024, "shared memory");
static_assert(BackwardQSmemBytes<__half, 128, false>() <= 99 * 1024, "shared memory");
static_assert(ForwardSmemBytes<__half, 64, false>() <= 99 * 1024, "shared memory");
static_assert(ForwardSmemBytes<__half, 128, false>() <= 99 * 1024, "shared memory");

// The 4 bytes at p (4-byte aligned) as one register: one 32-bit load (nvcc
// splits a memcpy of 16-bit elements into 16-bit loads). The host compiler
// of the emulation gets memcpy, as its strict aliasing requires.
__device__ __forceinline__ uint32_t Bits32(const void* p) {
#ifdef FLEET_CUDA_EMULATION
  uint32_t bits;
  memcpy(&bits, p, sizeof(bits));
  return bits;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

// {lo, hi} rounded to TT in one register, lo in the low 16 bits.
template <typename TT>
__device__ __forceinline__ uint32_t Pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo: the lower address
  return Bits32(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return Bits32(&v);
}

// The two 16-bit elements p[0], p[1] (p at an even element) as one register.
template <typename TT>
__device__ __forceinline__ uint32_t Word(const TT* p) {
  return Bits32(p);
}

// d += A B for one m16n8k16 (layouts at the top of the file).
template <typename TT>
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  const uint32_t b[2] = {b0, b1};
  Mma16816<std::is_same_v<TT, __nv_bfloat16>>(d, a, b, d);
}

__device__ __forceinline__ int LaneRow() { return (threadIdx.x % 32) / 4; }  // g
__device__ __forceinline__ int LaneCol() { return threadIdx.x % 4; }         // t

// The A fragment of columns [k0, k0 + 16) of the 16 rows at `rows` (stride ld).
template <typename TT>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const TT* rows, int ld, int k0) {
  const TT* p = rows + LaneRow() * ld + k0 + 2 * LaneCol();
  a[0] = Word(p);
  a[1] = Word(p + 8 * ld);
  a[2] = Word(p + 8);
  a[3] = Word(p + 8 * ld + 8);
}

// The A fragment of a 16x16 k-slice from the float32 C fragments of its two
// 16x8 halves (columns 0..7 in lo, 8..15 in hi), rounded to TT.
template <typename TT>
__device__ __forceinline__ void PackA(uint32_t (&a)[4], const float (&lo)[4],
                                      const float (&hi)[4]) {
  a[0] = Pack<TT>(lo[0], lo[1]);
  a[1] = Pack<TT>(lo[2], lo[3]);
  a[2] = Pack<TT>(hi[0], hi[1]);
  a[3] = Pack<TT>(hi[2], hi[3]);
}

// acc[j] += A bt^T over one k-slice: out[i][8 j + n] += sum_{k < 16}
// A[i][k] bt[(8 j + n) ld + k0 + k] for j < N / 8.
template <typename TT, int N>
__device__ __forceinline__ void MmaSlice(float (&acc)[N / 8][4], const uint32_t (&a)[4],
                                         const TT* bt, int ld, int k0) {
  const TT* p = bt + LaneRow() * ld + k0 + 2 * LaneCol();
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const TT* q = p + 8 * j * ld;  // row 8 j + g of bt: column 8 j + g of B
    Mma<TT>(acc[j], a, Word(q), Word(q + 8));
  }
}

// acc (16 x N) += a bt^T: a is 16 x K (row-major, stride lda), bt is N x K
// (row-major, stride ldb).
template <typename TT, int K, int N>
__device__ __forceinline__ void RowsTimesRowsT(float (&acc)[N / 8][4], const TT* a, int lda,
                                               const TT* bt, int ldb) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    LoadA(af, a, lda, 16 * kk);
    MmaSlice<TT, N>(acc, af, bt, ldb, 16 * kk);
  }
}

// acc (16 x N) += P bt^T where P (16 x K) is the accumulator array p and bt
// is N x K (row-major, stride ldb): P rounded to TT, never through memory.
template <typename TT, int K, int N>
__device__ __forceinline__ void RegsTimesRowsT(float (&acc)[N / 8][4], const float (&p)[K / 8][4],
                                               const TT* bt, int ldb) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    PackA<TT>(af, p[2 * kk], p[2 * kk + 1]);
    MmaSlice<TT, N>(acc, af, bt, ldb, 16 * kk);
  }
}

// acc (16 x N) += P b where P (16 x K) is the accumulator array p and b is
// K x N (row-major, stride ldb, in shared memory): the B fragments of two
// 16x8 tiles at a time by ldmatrix.trans from b's rows, so b needs no
// transposed copy. Lane l addresses row l % 8 of matrix l / 8: matrices 0
// and 1 are rows 0-7 and 8-15 of the k-slice over columns 16 jj .. + 7 (b0,
// b1 of tile 2 jj), 2 and 3 the same over columns 16 jj + 8 .. + 15 (tile
// 2 jj + 1). Each accumulator adds its k-slices in RegsTimesRowsT's order,
// so both give the same bits. Rows and ldb must keep every row 16-byte
// aligned (every tile here: strides of HS + 8 elements).
template <typename TT, int K, int N>
__device__ __forceinline__ void RegsTimesRows(float (&acc)[N / 8][4], const float (&p)[K / 8][4],
                                              const TT* b, int ldb) {
  static_assert(N % 16 == 0, "two 16x8 tiles per ldmatrix");
  const int lane = threadIdx.x % 32;
  const TT* lane_row = b + (lane % 16) * ldb + (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    PackA<TT>(af, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
    for (int jj = 0; jj < N / 16; ++jj) {
      uint32_t bf[4];
      LdMatrixX4Trans(bf, lane_row + 16 * kk * ldb + 16 * jj);
      Mma<TT>(acc[2 * jj], af, bf[0], bf[1]);
      Mma<TT>(acc[2 * jj + 1], af, bf[2], bf[3]);
    }
  }
}

// acc += P times the B the kernel keeps: b (K x N row-major, stride ld_rows)
// through ldmatrix, or bt (its N x K transposed copy, stride ld_t).
template <bool kLdMatrix, typename TT, int K, int N>
__device__ __forceinline__ void RegsTimesB(float (&acc)[N / 8][4], const float (&p)[K / 8][4],
                                           const TT* b, int ld_rows, const TT* bt, int ld_t) {
  if constexpr (kLdMatrix) {
    RegsTimesRows<TT, K, N>(acc, p, b, ld_rows);
  } else {
    RegsTimesRowsT<TT, K, N>(acc, p, bt, ld_t);
  }
}

// Tile of `rows` rows from row0 of src (row stride ld_src, HS columns),
// rounded to TT: dst[r * ld + d] (kTransposed false) or dst[d * ld + r]
// (true). Rows at or past `limit` are zero, so masked probabilities (0) never
// meet uninitialised memory in a product. Consecutive threads take
// consecutive columns (row-major) or rows (transposed) so that the 16-bit
// stores to shared memory do not collide; 16-byte loads when every row
// starts 16-byte aligned, which the block decides as one.
template <typename TT, int HS, bool kTransposed>
__device__ void LoadTile(TT* dst, int ld, const float* src, size_t ld_src, int row0, int rows,
                         int limit) {
  constexpr int kQuads = HS / 4;  // HS is a multiple of 16
  const bool vector4 = ld_src % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  for (int idx = threadIdx.x; idx < rows * kQuads; idx += kThreads) {
    const int r = kTransposed ? idx % rows : idx / kQuads;
    const int d = (kTransposed ? idx / rows : idx % kQuads) * 4;
    const int row = row0 + r;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < limit) {
      const float* p = src + size_t(row) * ld_src + d;
      x = vector4 ? *reinterpret_cast<const float4*>(p) : make_float4(p[0], p[1], p[2], p[3]);
    }
    const int step = kTransposed ? ld : 1;  // between the four elements in dst
    TT* o = kTransposed ? dst + d * ld + r : dst + r * ld + d;
    o[0] = ToTile<TT>(x.x);
    o[step] = ToTile<TT>(x.y);
    o[2 * step] = ToTile<TT>(x.z);
    o[3 * step] = ToTile<TT>(x.w);
  }
}

// Which head (b NH + h) and which 64-row tile a block of the 1-D grid
// (B NH times RowTiles(rows) blocks) takes. The blocks of one head are
// consecutive, so the tiles every block of that head streams (k and v, or
// q and dout) are read from DRAM about once and then from L2 while the
// head's blocks run: with the head as the fastest grid index, the 192 heads
// of GPT-2 124M at B 16 kept ~100 MB of float32 k and v in flight, over the
// H200's L2, and the forward kernel read 0.77 GB from DRAM per call where
// q, k, v and out are 0.2 GB (L2 hit rate 33%, ncu; head-major: 77%).
// Within a head, the tile that streams the most runs first (the last
// queries; for dK/dV the first keys), so the short causal tiles fill in at
// the end.
struct BlockTile {
  int bh;    // b NH + h
  int row0;  // first row (query or key) of the block's tile
};
__device__ __forceinline__ BlockTile HeadMajorTile(int rows, bool longest_last) {
  const int tiles = static_cast<int>(RowTiles(rows));
  const int id = static_cast<int>(blockIdx.x), tile = id % tiles;
  return {id / tiles, (longest_last ? tiles - 1 - tile : tile) * kOwn};
}

// Sum over the four lanes of a fragment row (lanes 4 g .. 4 g + 3).
__device__ __forceinline__ float RowSum(float x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}
__device__ __forceinline__ float RowMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}

// Grid B NH x ceil(Tq / 64) (HeadMajorTile). Warp w: queries q0 + 16 w .. + 15 against key
// tiles of S up to its last query's position; online softmax per row (m, l
// in registers, l summed per lane and over the row's four lanes at the end:
// every lane of a row applies the same corrections).
template <typename TT, int HS, bool kLdMatrix>
__global__ void __launch_bounds__(kThreads) FlashForwardMma(ForwardArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never launched: TensorCoreAttentionAvailable() is false there
#else
  using L = Tiles<HS>;
  constexpr int S = L::kStream;
  FLEET_DYNAMIC_SHARED(unsigned char, smem);
  SmemCarver carve{smem};
  TT* sQ = carve.Take<TT>(size_t(kOwn) * L::kLdRow);
  TT* sK = carve.Take<TT>(size_t(S) * L::kLdRow);
  // sV[key][d], or its transposed copy sVt[d][key]
  TT* sV = kLdMatrix ? carve.Take<TT>(size_t(S) * L::kLdRow) : nullptr;
  TT* sVt = kLdMatrix ? nullptr : carve.Take<TT>(size_t(HS) * L::kLdT);

  const BlockTile tile = HeadMajorTile(a.Tq, true);
  const int bh = tile.bh, b = bh / a.NH, h = bh % a.NH;
  const int q0 = tile.row0;
  const int warp = threadIdx.x / 32, g = LaneRow(), t = LaneCol();
  const int qw = q0 + warp * 16;  // the warp's first query; the lane's are qw + g, qw + g + 8
  const int Tk = a.past + a.Tq;   // keys in the sequence
  const float* qb = a.q + size_t(b) * a.q_batch + size_t(h) * HS;
  const float* kb = a.k + size_t(b) * a.kv_batch + size_t(h) * HS;
  const float* vb = a.v + size_t(b) * a.kv_batch + size_t(h) * HS;

  LoadTile<TT, HS, false>(sQ, L::kLdRow, qb, a.q_ld, q0, kOwn, a.Tq);

  const bool warp_idle = qw >= a.Tq;  // every row of the warp is padding
  const int warp_last_key = a.past + min(qw + 15, a.Tq - 1);
  const int block_last_key = a.past + min(q0 + kOwn, a.Tq) - 1;
  const TT* wQ = sQ + warp * 16 * L::kLdRow;
  float o[HS / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8 (scaled scores)
  float l[2] = {0.0f, 0.0f};            // this lane's part of their running sums

  for (int k0 = 0; k0 <= block_last_key; k0 += S) {
    __syncthreads();  // the previous k, v tiles are consumed (and sQ is ready)
    LoadTile<TT, HS, false>(sK, L::kLdRow, kb, a.kv_ld, k0, S, Tk);
    if constexpr (kLdMatrix) {
      LoadTile<TT, HS, false>(sV, L::kLdRow, vb, a.kv_ld, k0, S, Tk);
    } else {
      LoadTile<TT, HS, true>(sVt, L::kLdT, vb, a.kv_ld, k0, S, Tk);
    }
    __syncthreads();
    if (warp_idle || k0 > warp_last_key) continue;  // warp-uniform: all masked for these rows

    float s[S / 8][4] = {};
    RowsTimesRowsT<TT, HS, S>(s, wQ, L::kLdRow, sK, L::kLdRow);
    // Warp-uniform: every row real and every key of the tile at or before
    // the warp's first query (then at or before all of them).
    const bool needs_mask = !(qw + 15 < a.Tq && k0 + S - 1 <= a.past + qw);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < S / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = qw + g + 8 * (e / 2), key = k0 + 8 * j + 2 * t + e % 2;
        float x = s[j][e] * a.scale;
        if (needs_mask && !(qi < a.Tq && key <= a.past + qi)) x = -INFINITY;
        s[j][e] = x;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
      }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], RowMax(tile_max[r]));
      // -inf only for padding rows (a real row sees key 0 on the first tile).
      corr[r] = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int j = 0; j < S / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = s[j][e] == -INFINITY ? 0.0f : expf(s[j][e] - m[e / 2]);
        s[j][e] = p;
        l[e / 2] += p;
      }
    }
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= corr[e / 2];
    }
    RegsTimesB<kLdMatrix, TT, S, HS>(o, s, sV, L::kLdRow, sVt, L::kLdT);  // O += P V
  }
  if (warp_idle) return;                                  // no barrier follows
  const float row_sum[2] = {RowSum(l[0]), RowSum(l[1])};  // before any lane branches off
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = qw + g + 8 * r;
    if (qi >= a.Tq) continue;
    const float inv = 1.0f / row_sum[r];
    float* dst = a.out + (size_t(b) * a.Tq + qi) * a.C + size_t(h) * HS + 2 * t;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      dst[8 * n] = o[n][2 * r] * inv;
      dst[8 * n + 1] = o[n][2 * r + 1] * inv;
    }
    if (a.lse != nullptr && t == 0) a.lse[size_t(bh) * a.Tq + qi] = m[r] + logf(row_sum[r]);
  }
#endif
}

// dK, dV of the block's 64 keys: grid B NH x ceil(T / 64). Streams the
// query tiles from the block's first key on (earlier queries do not see
// these keys). Per tile warp w forms, for its 16 keys kw .. kw + 15,
// S^T = K Q^T and dP^T = V dO^T (keys are the rows, so P^T and dS^T come out
// as C fragments), P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - D) scale,
// then dV += P^T dO and dK += dS^T Q with P^T, dS^T as A fragments. The
// body of the two kernels below.
template <typename TT, int HS, bool kLdMatrix>
__device__ __forceinline__ void BackwardKv(const BackwardArgs& a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = Tiles<HS>;
  constexpr int S = L::kStream;
  FLEET_DYNAMIC_SHARED(unsigned char, smem);
  SmemCarver carve{smem};
  TT* sK = carve.Take<TT>(size_t(kOwn) * L::kLdRow);
  TT* sV = carve.Take<TT>(size_t(kOwn) * L::kLdRow);
  TT* sQ = carve.Take<TT>(size_t(S) * L::kLdRow);
  TT* sdO = carve.Take<TT>(size_t(S) * L::kLdRow);
  // Transposed copies sQt[d][query], sdOt[d][query] unless kLdMatrix.
  TT* sQt = kLdMatrix ? nullptr : carve.Take<TT>(size_t(HS) * L::kLdT);
  TT* sdOt = kLdMatrix ? nullptr : carve.Take<TT>(size_t(HS) * L::kLdT);
  float* sL = carve.Take<float>(S);
  float* sD = carve.Take<float>(S);

  const int T = a.T, C = a.C;
  const BlockTile tile = HeadMajorTile(T, false);
  const int bh = tile.bh, b = bh / a.NH, h = bh % a.NH;
  const int k0 = tile.row0;
  const int warp = threadIdx.x / 32, g = LaneRow(), t = LaneCol();
  const int kw = k0 + warp * 16;  // the warp's first key; the lane's are kw + g, kw + g + 8
  const size_t C3 = size_t(3) * C;
  const float* base = a.qkv + size_t(b) * T * C3 + size_t(h) * HS;
  const float* dbase = a.dout + size_t(b) * T * C + size_t(h) * HS;

  LoadTile<TT, HS, false>(sK, L::kLdRow, base + C, C3, k0, kOwn, T);
  LoadTile<TT, HS, false>(sV, L::kLdRow, base + 2 * C, C3, k0, kOwn, T);

  const bool warp_idle = kw >= T;  // every key of the warp is padding
  const TT* wK = sK + warp * 16 * L::kLdRow;
  const TT* wV = sV + warp * 16 * L::kLdRow;
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

  for (int q0 = k0; q0 < T; q0 += S) {
    __syncthreads();  // the previous q, dout tiles are consumed (and sK, sV are ready)
    LoadTile<TT, HS, false>(sQ, L::kLdRow, base, C3, q0, S, T);
    if constexpr (!kLdMatrix) LoadTile<TT, HS, true>(sQt, L::kLdT, base, C3, q0, S, T);
    LoadTile<TT, HS, false>(sdO, L::kLdRow, dbase, size_t(C), q0, S, T);
    if constexpr (!kLdMatrix) LoadTile<TT, HS, true>(sdOt, L::kLdT, dbase, size_t(C), q0, S, T);
    for (int i = threadIdx.x; i < S; i += kThreads) {
      const int qi = q0 + i;
      sL[i] = qi < T ? a.lse[size_t(bh) * T + qi] : 0.0f;
      sD[i] = qi < T ? a.dots[size_t(bh) * T + qi] : 0.0f;
    }
    __syncthreads();
    // Warp-uniform: every query of the tile precedes every key of the warp.
    if (warp_idle || q0 + S - 1 < kw) continue;

    // 64-query tiles in two halves of H: P^T and dS^T of one half live at a
    // time (at head size 64, 234 registers a thread with the whole tile, 2
    // blocks an SM; 168 in halves, 3), and the products still add their
    // 16-query k-slices in order, so the sums are the same.
    constexpr int kHalves = S >= 64 ? 2 : 1, H = S / kHalves;
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      const int c0 = half * H;  // the half's first query: q0 + c0
      float st[H / 8][4] = {}, dpt[H / 8][4] = {};
      RowsTimesRowsT<TT, HS, H>(st, wK, L::kLdRow, sQ + c0 * L::kLdRow, L::kLdRow);
      RowsTimesRowsT<TT, HS, H>(dpt, wV, L::kLdRow, sdO + c0 * L::kLdRow, L::kLdRow);
      // Warp-uniform: every query real and at or after the warp's last key.
      const bool needs_mask = !(q0 + c0 + H <= T && q0 + c0 >= kw + 15);
#pragma unroll
      for (int j = 0; j < H / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = c0 + 8 * j + 2 * t + e % 2;  // query q0 + c
          const int key = kw + g + 8 * (e / 2);
          float p = 0.0f, ds = 0.0f;
          if (!needs_mask || (q0 + c < T && q0 + c >= key)) {
            p = expf(st[j][e] * a.scale - sL[c]);
            ds = p * (dpt[j][e] - sD[c]) * a.scale;
          }
          st[j][e] = p;
          dpt[j][e] = ds;
        }
      }
      // dV += P^T dO, dK += dS^T Q: B[query][d] is dO's or Q's row.
      RegsTimesB<kLdMatrix, TT, H, HS>(dv, st, sdO + c0 * L::kLdRow, L::kLdRow,
                                       kLdMatrix ? nullptr : sdOt + c0, L::kLdT);
      RegsTimesB<kLdMatrix, TT, H, HS>(dk, dpt, sQ + c0 * L::kLdRow, L::kLdRow,
                                       kLdMatrix ? nullptr : sQt + c0, L::kLdT);
    }
  }
  if (warp_idle) return;  // no barrier follows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = kw + g + 8 * r;
    if (key >= T) continue;
    float* row = a.dqkv + (size_t(b) * T + key) * C3 + size_t(h) * HS + 2 * t;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      row[C + 8 * n] += dk[n][2 * r];
      row[C + 8 * n + 1] += dk[n][2 * r + 1];
      row[2 * C + 8 * n] += dv[n][2 * r];
      row[2 * C + 8 * n + 1] += dv[n][2 * r + 1];
    }
  }
#endif
}

// At head size 64 the compiler holds the copies kernel at 168 registers
// (3 blocks an SM) by itself, while the ldmatrix one takes 176 (2 blocks)
// unless bounded; an explicit bound on the copies kernel (even a minimum of
// one block) makes it take 233. Hence two kernels.
template <typename TT, int HS>
__global__ void __launch_bounds__(kThreads) FlashBackwardKvMma(BackwardArgs a) {
  BackwardKv<TT, HS, false>(a);
}
template <typename TT, int HS>
__global__ void __launch_bounds__(kThreads, HS <= 64 ? 3 : 2)
    FlashBackwardKvMmaLdMatrix(BackwardArgs a) {
  BackwardKv<TT, HS, true>(a);
}

// dQ of the block's 64 queries: grid B NH x ceil(T / 64). Streams the key
// tiles up to the block's last query; per tile warp w forms S = Q K^T and
// dP = dO V^T for its 16 queries, dS = P (dP - D) scale, then dQ += dS K.
// At most 128 registers a thread at head sizes up to 64 (4 blocks an SM
// instead of 3; the compiler took 166 unbounded, and spills nothing at 128),
// 168 above (3 blocks; head size 112 then spills 8 bytes).
template <typename TT, int HS, bool kLdMatrix>
__global__ void __launch_bounds__(kThreads, HS <= 64 ? 4 : 3) FlashBackwardQMma(BackwardArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = Tiles<HS>;
  constexpr int S = L::kStream;
  FLEET_DYNAMIC_SHARED(unsigned char, smem);
  SmemCarver carve{smem};
  TT* sQ = carve.Take<TT>(size_t(kOwn) * L::kLdRow);
  TT* sdO = carve.Take<TT>(size_t(kOwn) * L::kLdRow);
  TT* sK = carve.Take<TT>(size_t(S) * L::kLdRow);
  TT* sV = carve.Take<TT>(size_t(S) * L::kLdRow);
  TT* sKt = kLdMatrix ? nullptr : carve.Take<TT>(size_t(HS) * L::kLdT);  // sKt[d][key]

  const int T = a.T, C = a.C;
  const BlockTile tile = HeadMajorTile(T, true);
  const int bh = tile.bh, b = bh / a.NH, h = bh % a.NH;
  const int q0 = tile.row0;
  const int warp = threadIdx.x / 32, g = LaneRow(), t = LaneCol();
  const int qw = q0 + warp * 16;  // the warp's first query; the lane's are qw + g, qw + g + 8
  const size_t C3 = size_t(3) * C;
  const float* base = a.qkv + size_t(b) * T * C3 + size_t(h) * HS;

  LoadTile<TT, HS, false>(sQ, L::kLdRow, base, C3, q0, kOwn, T);
  LoadTile<TT, HS, false>(sdO, L::kLdRow, a.dout + size_t(b) * T * C + size_t(h) * HS, size_t(C),
                          q0, kOwn, T);
  float row_lse[2], row_dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = qw + g + 8 * r;
    row_lse[r] = qi < T ? a.lse[size_t(bh) * T + qi] : 0.0f;
    row_dot[r] = qi < T ? a.dots[size_t(bh) * T + qi] : 0.0f;
  }

  const bool warp_idle = qw >= T;
  const int warp_last = min(qw + 15, T - 1);
  const int block_last = min(q0 + kOwn, T) - 1;
  const TT* wQ = sQ + warp * 16 * L::kLdRow;
  const TT* wdO = sdO + warp * 16 * L::kLdRow;
  float dq[HS / 8][4] = {};

  for (int k0 = 0; k0 <= block_last; k0 += S) {
    __syncthreads();  // the previous k, v tiles are consumed (and sQ, sdO are ready)
    LoadTile<TT, HS, false>(sK, L::kLdRow, base + C, C3, k0, S, T);
    if constexpr (!kLdMatrix) LoadTile<TT, HS, true>(sKt, L::kLdT, base + C, C3, k0, S, T);
    LoadTile<TT, HS, false>(sV, L::kLdRow, base + 2 * C, C3, k0, S, T);
    __syncthreads();
    if (warp_idle || k0 > warp_last) continue;  // warp-uniform: all masked for these rows

    float s[S / 8][4] = {}, dp[S / 8][4] = {};
    RowsTimesRowsT<TT, HS, S>(s, wQ, L::kLdRow, sK, L::kLdRow);
    RowsTimesRowsT<TT, HS, S>(dp, wdO, L::kLdRow, sV, L::kLdRow);
    // Warp-uniform: every row real and every key at or before its first query.
    const bool needs_mask = !(qw + 15 < T && k0 + S - 1 <= qw);
#pragma unroll
    for (int j = 0; j < S / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, qi = qw + g + 8 * r, key = k0 + 8 * j + 2 * t + e % 2;
        float ds = 0.0f;
        if (!needs_mask || (qi < T && key <= qi)) {
          const float p = expf(s[j][e] * a.scale - row_lse[r]);
          ds = p * (dp[j][e] - row_dot[r]) * a.scale;
        }
        s[j][e] = ds;
      }
    }
    RegsTimesB<kLdMatrix, TT, S, HS>(dq, s, sK, L::kLdRow, sKt, L::kLdT);  // dQ += dS K
  }
  if (warp_idle) return;  // no barrier follows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = qw + g + 8 * r;
    if (qi >= T) continue;
    float* row = a.dqkv + (size_t(b) * T + qi) * C3 + size_t(h) * HS + 2 * t;
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      row[8 * n] += dq[n][2 * r];
      row[8 * n + 1] += dq[n][2 * r + 1];
    }
  }
#endif
}

// The 1-D grid of HeadMajorTile: every head's row tiles.
unsigned HeadMajorGrid(int heads, int rows) {
  return static_cast<unsigned>(heads) * RowTiles(rows);
}

struct LaunchForward {
  const ForwardArgs& a;
  int B;
  MmaTransposes transposes;
  cudaStream_t s;
  template <typename TT, int HS, bool kLdMatrix>
  cudaError_t Launch() const {
    const auto kernel = FlashForwardMma<TT, HS, kLdMatrix>;
    constexpr size_t bytes = ForwardSmemBytes<TT, HS, kLdMatrix>();
    cudaError_t e = AllowDynamicShared(kernel, bytes);
    if (e != cudaSuccess) return e;
    const dim3 grid(HeadMajorGrid(B * a.NH, a.Tq));
    return FLEET_LAUNCH(kernel, grid, dim3(kThreads), bytes, s, a);
  }
  template <typename TT, int HS>
  cudaError_t operator()() const {
    return transposes == MmaTransposes::kLdMatrix ? Launch<TT, HS, true>()
                                                  : Launch<TT, HS, false>();
  }
};

struct LaunchBackward {
  const BackwardArgs& a;
  int B;
  MmaTransposes transposes;
  cudaStream_t s;
  template <typename TT, int HS, bool kLdMatrix>
  cudaError_t Launch() const {
    const dim3 grid(HeadMajorGrid(B * a.NH, a.T));
    const auto kv_kernel =
        kLdMatrix ? FlashBackwardKvMmaLdMatrix<TT, HS> : FlashBackwardKvMma<TT, HS>;
    constexpr size_t kv_bytes = BackwardKvSmemBytes<TT, HS, kLdMatrix>();
    cudaError_t e = AllowDynamicShared(kv_kernel, kv_bytes);
    if (e != cudaSuccess) return e;
    e = FLEET_LAUNCH(kv_kernel, grid, dim3(kThreads), kv_bytes, s, a);
    if (e != cudaSuccess) return e;
    const auto q_kernel = FlashBackwardQMma<TT, HS, kLdMatrix>;
    constexpr size_t q_bytes = BackwardQSmemBytes<TT, HS, kLdMatrix>();
    if ((e = AllowDynamicShared(q_kernel, q_bytes)) != cudaSuccess) return e;
    return FLEET_LAUNCH(q_kernel, grid, dim3(kThreads), q_bytes, s, a);
  }
  template <typename TT, int HS>
  cudaError_t operator()() const {
    return transposes == MmaTransposes::kLdMatrix ? Launch<TT, HS, true>()
                                                  : Launch<TT, HS, false>();
  }
};

}  // namespace

cudaError_t MmaAttentionForward(float* out, float* lse, const float* q, const float* k,
                                const float* v, size_t q_batch, size_t kv_batch, size_t q_ld,
                                size_t kv_ld, int B, int Tq, int past, int C, int NH, TileType tile,
                                MmaTransposes transposes, cudaStream_t s) {
  if (B <= 0 || Tq <= 0) return cudaGetLastError();
  const int hs = C / NH;
  const ForwardArgs a{out,  lse,   q,  k,    v, q_batch, kv_batch,
                      q_ld, kv_ld, Tq, past, C, NH,      1.0f / sqrtf(static_cast<float>(hs))};
  return WithTensorCoreTile(tile, hs, LaunchForward{a, B, transposes, s});
}

cudaError_t MmaAttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                 const float* dots, int B, int T, int C, int NH, TileType tile,
                                 MmaTransposes transposes, cudaStream_t s) {
  if (B <= 0 || T <= 0) return cudaGetLastError();
  const int hs = C / NH;
  const BackwardArgs a{dqkv, dout, qkv, lse, dots, T, C, NH, 1.0f / sqrtf(static_cast<float>(hs))};
  return WithTensorCoreTile(tile, hs, LaunchBackward{a, B, transposes, s});
}

}  // namespace fleet::trainer::cuda::gpt
