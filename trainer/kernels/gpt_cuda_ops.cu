// The CUDA kernels of CudaGptKernels; see gpt_cuda_ops.h for shapes and
// meaning. Element-wise kernels use grid-stride loops; row kernels (LayerNorm,
// the attention row dot products) one warp per row; cross-entropy one block
// per row; parameter gradients that sum over rows (biases, LayerNorm, the
// position and token embeddings) give each output element to exactly one
// thread or block, which sums its rows in order: deterministic without
// atomics. Warp sums use xor shuffles, which give every lane the same bits.
//
// Attention is flash attention: the tile kernels of
// gpt_cuda_attention_tiles.cu, or the tensor-core kernels of
// gpt_cuda_flash_tc.cu and gpt_cuda_flash_mma.cu where they apply; this file
// picks (DispatchTile). Dropout's kernels are gpt_cuda_dropout.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "trainer/kernels/cuda_emulatable.h"
#include "trainer/kernels/gpt_cuda_attention_tiles.h"
#include "trainer/kernels/gpt_cuda_device.cuh"
#include "trainer/kernels/gpt_cuda_flash_mma.h"
#include "trainer/kernels/gpt_cuda_flash_tc.h"
#include "trainer/kernels/gpt_cuda_ops.h"

namespace fleet::trainer::cuda::gpt {
namespace {

using namespace dev;  // NOLINT: the kernels' shared device helpers

// ---- embedding --------------------------------------------------------------------

// out: [N, C] over n = N C elements.
__global__ void EncoderForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                     const float* wpe, int T, int C, size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const size_t row = i / C, c = i % C;
    out[i] = wte[size_t(tokens[row]) * C + c] + wpe[(row % T) * C + c];
  }
}

// As EncoderForwardKernel for the wte rows [v_begin, v_begin + V) (others
// contribute 0) and an optional wpe.
__global__ void EncoderShardForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                          const float* wpe, int T, int C, int v_begin, int V,
                                          size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const size_t row = i / C, c = i % C;
    const int tok = tokens[row] - v_begin;
    const float we = tok >= 0 && tok < V ? wte[size_t(tok) * C + c] : 0.0f;
    out[i] = we + (wpe != nullptr ? wpe[(row % T) * C + c] : 0.0f);
  }
}

// dwpe[t, c] += sum_b dout[b, t, c]; n = T C.
__global__ void EncoderBackwardWpeKernel(float* dwpe, const float* dout, int B, int T, int C,
                                         size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dout[size_t(b) * T * C + i];
    dwpe[i] += acc;
  }
}

// Token rows: block k owns the dwte rows v with v % gridDim.x == k and adds
// their positions' gradients in position order; thread x owns columns
// x, x + blockDim.x, ... of them. Every block reads all token ids, a
// blockDim.x-long window at a time: each thread tests one id, and the
// window's owned positions are compacted in order (warp ballots, then the
// warps' counts) into a shared list that the whole block then adds
// (kThreads threads a block: the window is the block). When every thread
// tested every id in turn (16k ids x 512 blocks x 8 warps of serial tests)
// the embedding took 4.2 ms of a GPT-2 124M step on an H100; this way
// 0.21 ms on an H200.
constexpr unsigned kTokenOwners = 512;
// Only ids in [v_begin, v_begin + V) count (a vocabulary shard, row id - v_begin).
__global__ void __launch_bounds__(kThreads) EncoderBackwardWteKernel(float* dwte, const float* dout,
                                                                     const int32_t* tokens, int N,
                                                                     int C, int v_begin, int V) {
  __shared__ int32_t owned[kThreads];        // positions, in order, of this window's owned ids
  __shared__ int32_t owned_rows[kThreads];   // their rows of dwte
  __shared__ int warp_counts[kWarpsPerBlock];
  const int owner = blockIdx.x, owners = gridDim.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i0 = 0; i0 < N; i0 += kThreads) {
    const int i = i0 + threadIdx.x;
    const int tok = i < N ? tokens[i] - v_begin : -1;
    const bool mine = tok >= 0 && tok < V && tok % owners == owner;
    const unsigned ballot = __ballot_sync(kFullMask, mine);
    __syncthreads();  // everyone is done with the previous window's list
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int slot = __popc(ballot & ((1u << lane) - 1u));
    int count = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      if (w < warp) slot += warp_counts[w];
      count += warp_counts[w];
    }
    if (mine) {
      owned[slot] = i;
      owned_rows[slot] = tok;
    }
    __syncthreads();
    for (int k = 0; k < count; ++k) {
      float* dst = dwte + size_t(owned_rows[k]) * C;
      const float* src = dout + size_t(owned[k]) * C;
      for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] += src[c];
    }
  }
}

// ---- LayerNorm, biases ---------------------------------------------------------------

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C,
                                       float eps) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // a whole warp
  const float* x = inp + size_t(row) * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
  const float m = WarpSum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += d * d;
  }
  const float rs = 1.0f / sqrtf(WarpSum(v) / C + eps);
  float* o = out + size_t(row) * C;
  for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

__global__ void LayerNormBackwardRowsKernel(float* dinp, const float* dout, const float* inp,
                                            const float* weight, const float* mean,
                                            const float* rstd, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + size_t(row) * C;
  const float* d = dout + size_t(row) * C;
  float* dx = dinp + size_t(row) * C;
  const float m = mean[row], rs = rstd[row];
  float dmean = 0.0f, dnorm_mean = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dn = weight[c] * d[c];
    dmean += dn;
    dnorm_mean += dn * (x[c] - m) * rs;
  }
  dmean = WarpSum(dmean) / C;
  dnorm_mean = WarpSum(dnorm_mean) / C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (x[c] - m) * rs;
    dx[c] += (weight[c] * d[c] - dmean - norm * dnorm_mean) * rs;
  }
}

// Pass 1: partials[k, c] = sum over chunk k's rows of dout[r, c]; with
// dweight (LayerNorm) also partials[chunks + k, c] = sum dout[r, c] (inp[r, c]
// - mean[r]) rstd[r]. Grid (column tiles of 32, kColumnSumChunks); block
// (32 columns) x (kRowLanes): lane y sums the chunk's rows y, y + kRowLanes,
// ...; then row 0 of the block adds the kRowLanes partials in order.
constexpr int kColTile = 32;
constexpr int kRowLanes = 8;
__global__ void ColumnPartialsKernel(float* partials, bool with_weight, const float* dout,
                                     const float* inp, const float* mean, const float* rstd,
                                     int rows, int cols) {
  __shared__ float sb[kRowLanes][kColTile + 1];
  __shared__ float sw[kRowLanes][kColTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kColTile + tx;
  const int chunk = blockIdx.y;
  const int per_chunk = (rows + kColumnSumChunks - 1) / kColumnSumChunks;
  const int r0 = chunk * per_chunk, r1 = min(rows, r0 + per_chunk);
  float accb = 0.0f, accw = 0.0f;
  if (c < cols) {
    for (int r = r0 + ty; r < r1; r += kRowLanes) {
      const float d = dout[size_t(r) * cols + c];
      accb += d;
      if (with_weight) accw += d * (inp[size_t(r) * cols + c] - mean[r]) * rstd[r];
    }
  }
  sb[ty][tx] = accb;
  sw[ty][tx] = accw;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float tb = 0.0f, tw = 0.0f;
    for (int k = 0; k < kRowLanes; ++k) {
      tb += sb[k][tx];
      tw += sw[k][tx];
    }
    partials[size_t(chunk) * cols + c] = tb;
    if (with_weight) partials[size_t(kColumnSumChunks + chunk) * cols + c] = tw;
  }
}

// Pass 2: dsum[c] += sum_k partials[k, c] (and dweight from the second
// half), chunks in order.
__global__ void ColumnPartialsSumKernel(float* dsum, float* dweight, const float* partials,
                                        int cols) {
  for (size_t c = GlobalThread(); c < size_t(cols); c += GridThreads()) {
    float tb = 0.0f, tw = 0.0f;
    for (int k = 0; k < kColumnSumChunks; ++k) {
      tb += partials[size_t(k) * cols + c];
      if (dweight != nullptr) tw += partials[size_t(kColumnSumChunks + k) * cols + c];
    }
    dsum[c] += tb;
    if (dweight != nullptr) dweight[c] += tw;
  }
}

cudaError_t LaunchColumnSums(float* dsum, float* dweight, float* partials, const float* dout,
                             const float* inp, const float* mean, const float* rstd, int rows,
                             int cols, cudaStream_t s) {
  if (cols <= 0) return cudaGetLastError();
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), kColumnSumChunks);
  ColumnPartialsKernel<<<grid, block, 0, s>>>(partials, dweight != nullptr, dout, inp, mean, rstd,
                                              rows, cols);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  ColumnPartialsSumKernel<<<GridFor(size_t(cols)), kThreads, 0, s>>>(dsum, dweight, partials,
                                                                    cols);
  return cudaGetLastError();
}

__global__ void AddBiasKernel(float* out, const float* bias, int cols, size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) out[i] += bias[i % cols];
}

// Four floats rounded to TT and stored as one 8-byte word (dst 8-byte aligned).
template <typename TT>
__device__ __forceinline__ void StoreQuad(TT* dst, float4 v) {
  union {
    TT elements[4];
    uint2 word;
  } quad;
  StoreTile(quad.elements[0], v.x);
  StoreTile(quad.elements[1], v.y);
  StoreTile(quad.elements[2], v.z);
  StoreTile(quad.elements[3], v.w);
  *reinterpret_cast<uint2*>(dst) = quad.word;
}

// dst [rows, cols] (packed) = src [rows, cols] (row stride ld) rounded to TT;
// four elements a thread, one 16-byte load and one 8-byte store, when rows
// are 16-byte aligned (vector4), and no division when src is packed too.
// These passes move bytes at about the H200's DRAM rate (4.3 TB/s, ncu):
// 6.7 ms of a GPT-2 124M step, which only fewer bytes (16-bit activations,
// GEMM epilogues writing 16-bit copies) can shorten.
template <typename TT>
__global__ void RoundRowsKernel(TT* dst, const float* src, size_t rows, size_t cols, size_t ld,
                                bool vector4) {
  if (vector4) {
    const size_t quads = cols / 4, n = rows * quads;
    const bool packed = ld == cols;
    for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
      size_t from = 4 * i;  // dst is packed: quad i starts at element 4 i
      if (!packed) {
        const size_t r = i / quads;
        from = r * ld + (i - r * quads) * 4;
      }
      StoreQuad(dst + 4 * i, *reinterpret_cast<const float4*>(src + from));
    }
    return;
  }
  const size_t n = rows * cols;
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    StoreTile(dst[i], src[(i / cols) * ld + i % cols]);
  }
}

// ---- attention (the tile kernels are gpt_cuda_attention_tiles.cu) ---------------------

// k_cache[b, past + t, :] = qkv[b, t, C:2C], v_cache likewise from 2C:3C;
// n = B T C elements.
__global__ void AppendKvKernel(float* k_cache, float* v_cache, const float* qkv, int T, int past,
                               int maxT, int C, size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const size_t bt = i / C, c = i % C;
    const size_t b = bt / T, t = bt % T;
    const size_t dst = (b * maxT + past + t) * C + c;
    k_cache[dst] = qkv[bt * 3 * C + C + c];
    v_cache[dst] = qkv[bt * 3 * C + 2 * C + c];
  }
}

// The tensor-core kernels (gpt_cuda_flash_tc.cu, gpt_cuda_flash_mma.cu)
// where they apply; path is kWmma, kMma or kMmaLdMatrix.
cudaError_t LaunchTensorCore(bool backward, const AttentionArgs& a, TileType tile,
                             AttentionPath path, cudaStream_t s) {
  const MmaTransposes transposes =
      path == AttentionPath::kMmaLdMatrix ? MmaTransposes::kLdMatrix : MmaTransposes::kCopies;
  if (!backward) {
    const ForwardParams p = ForwardLayout(a);
    if (path == AttentionPath::kWmma) {
      return TensorCoreAttentionForward(p.out, p.lse, p.q, p.k, p.v, p.q_batch, p.kv_batch, p.q_ld,
                                        p.kv_ld, a.B, p.Tq, p.past, p.C, p.NH, tile, s);
    }
    return MmaAttentionForward(p.out, p.lse, p.q, p.k, p.v, p.q_batch, p.kv_batch, p.q_ld, p.kv_ld,
                               a.B, p.Tq, p.past, p.C, p.NH, tile, transposes, s);
  }
  const cudaError_t e = AttentionRowDots(a, s);
  if (e != cudaSuccess) return e;
  if (path == AttentionPath::kWmma) {
    return TensorCoreAttentionBackward(a.out, a.dout, a.qkv, a.lse, a.aux, a.B, a.T, a.C, a.NH,
                                       tile, s);
  }
  return MmaAttentionBackward(a.out, a.dout, a.qkv, a.lse, a.aux, a.B, a.T, a.C, a.NH, tile,
                              transposes, s);
}

cudaError_t DispatchTile(bool backward, const AttentionArgs& a, TileType tile, AttentionPath path,
                         cudaStream_t s) {
  if (a.B <= 0 || a.T <= 0 || a.C <= 0 || a.NH <= 0) return cudaGetLastError();
  if (a.C % a.NH != 0) return cudaErrorInvalidValue;
  // The tensor-core kernels have no dropout: attention dropout runs on the tiles.
  if (path != AttentionPath::kTiles && a.dropout.p == 0.0f &&
      TensorCoreAttentionSupports(tile, a.C / a.NH)) {
    return LaunchTensorCore(backward, a, tile, path, s);
  }
  return TileAttention(backward, a, tile, s);
}

// ---- GELU, cross-entropy, optimizer ---------------------------------------------------

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__global__ void GeluForwardKernel(float* out, const float* inp, size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float x = inp[i];
    const float th = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluScale *
                                                (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = grad * dout[i];  // dinp may be dout: each element read, then written
  }
}

// One block of kThreads per row; the block's sums are taken warp by warp in
// a fixed order (the exponentials in double across warps).
__global__ void CrossEntropyKernel(float* losses, float* logits, const int32_t* targets, int V,
                                   float dloss, bool write_dlogits) {
  __shared__ float smax[kWarpsPerBlock];
  __shared__ double ssum[kWarpsPerBlock];
  const size_t row = blockIdx.x;
  float* z = logits + row * V;
  const int target = targets[row];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (target < 0) {  // uniform over the block
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (write_dlogits) {
      for (int c = threadIdx.x; c < V; c += blockDim.x) z[c] = 0.0f;
    }
    return;
  }
  const float picked = z[target];  // read before the barriers below; writes come after them
  // One read of the row for its max and sum: each thread keeps its own
  // running max and its sum relative to it, rescaled to the row's max
  // after one reduction. (A pass for the max and another for the sum made
  // this kernel read the 3.3 GB of GPT-2 124M's logits three times a step.)
  float thread_max = -INFINITY, part = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    const float x = z[c];
    if (x > thread_max) {
      part = part * expf(thread_max - x) + 1.0f;  // expf(-inf) = 0 on the first column
      thread_max = x;
    } else if (thread_max != -INFINITY) {  // -inf columns before any finite one add 0
      part += expf(x - thread_max);
    }
  }
  float mx = WarpMax(thread_max);
  if (lane == 0) smax[warp] = mx;
  __syncthreads();
  mx = smax[0];
  for (int w = 1; w < kWarpsPerBlock; ++w) mx = fmaxf(mx, smax[w]);
  if (thread_max != -INFINITY) part *= expf(thread_max - mx);  // a thread with no columns adds 0
  const double wsum = WarpSum(static_cast<double>(part));
  if (lane == 0) ssum[warp] = wsum;
  __syncthreads();
  double sum = 0.0;
  for (int w = 0; w < kWarpsPerBlock; ++w) sum += ssum[w];
  if (threadIdx.x == 0) losses[row] = static_cast<float>(log(sum) + mx - picked);
  if (write_dlogits) {
    const float k = static_cast<float>(dloss / sum);
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
      z[c] = expf(z[c] - mx) * k - (c == target ? dloss : 0.0f);
    }
  }
}

// The vocabulary-parallel cross-entropy's passes (GptKernels::CrossEntropyShard*),
// one block of kThreads per row, sums in a fixed order as CrossEntropyKernel.
__global__ void CrossEntropyShardMaxKernel(float* row_max, const float* logits, int V) {
  __shared__ float smax[kWarpsPerBlock];
  const size_t row = blockIdx.x;
  const float* z = logits + row * V;
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < V; c += blockDim.x) mx = fmaxf(mx, z[c]);
  mx = WarpMax(mx);
  if (threadIdx.x % 32 == 0) smax[threadIdx.x / 32] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kWarpsPerBlock; ++w) mx = fmaxf(mx, smax[w]);
    row_max[row] = mx;
  }
}

__global__ void CrossEntropyShardSumsKernel(float* sums, const float* logits, const float* row_max,
                                            const int32_t* targets, int N, int V, int v_begin) {
  __shared__ double ssum[kWarpsPerBlock];
  const size_t row = blockIdx.x;
  const float* z = logits + row * V;
  const float mx = row_max[row];
  float part = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x) part += expf(z[c] - mx);
  const double wsum = WarpSum(static_cast<double>(part));
  if (threadIdx.x % 32 == 0) ssum[threadIdx.x / 32] = wsum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int w = 0; w < kWarpsPerBlock; ++w) sum += ssum[w];
    sums[row] = static_cast<float>(sum);
    const int target = targets[row] - v_begin;
    sums[N + row] = targets[row] >= 0 && target >= 0 && target < V ? z[target] : 0.0f;
  }
}

__global__ void CrossEntropyShardFinishKernel(float* losses, float* logits, const float* row_max,
                                              const float* sums, const int32_t* targets, int N,
                                              int V, int v_begin, float dloss,
                                              bool write_dlogits) {
  const size_t row = blockIdx.x;
  float* z = logits + row * V;
  if (targets[row] < 0) {  // uniform over the block
    if (threadIdx.x == 0) losses[row] = 0.0f;
    if (write_dlogits) {
      for (int c = threadIdx.x; c < V; c += blockDim.x) z[c] = 0.0f;
    }
    return;
  }
  const float mx = row_max[row];
  const double sum = sums[row];
  if (threadIdx.x == 0) losses[row] = static_cast<float>(log(sum) + mx - sums[N + row]);
  if (!write_dlogits) return;
  const int target = targets[row] - v_begin;
  const float k = static_cast<float>(dloss / sum);
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    z[c] = expf(z[c] - mx) * k - (c == target ? dloss : 0.0f);
  }
}

// partials[block] = the block's sum over its grid-stride elements.
__global__ void SumOfSquaresPartialKernel(double* partials, const float* x, size_t n) {
  __shared__ double sh[kWarpsPerBlock];
  double acc = 0.0;
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const double v = x[i];
    acc += v * v;
  }
  acc = WarpSum(acc);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kWarpsPerBlock; ++w) t += sh[w];
    partials[blockIdx.x] = t;
  }
}

__global__ void SumOfSquaresFinalKernel(double* partials, int count) {
  double t = 0.0;
  for (int i = 0; i < count; ++i) t += partials[i];
  partials[0] = t;
}

__global__ void AdamWKernel(float* p, const float* g, float* m, float* v, size_t n, float lr,
                            float beta1, float beta2, float eps, float wd, float inv_bc1,
                            float inv_bc2, float grad_scale) {
  for (size_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float gi = g[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * ((mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps) + wd * p[i]);
  }
}

}  // namespace

cudaError_t EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                           int B, int T, int C, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (n) EncoderForwardKernel<<<GridFor(n), kThreads, 0, s>>>(out, tokens, wte, wpe, T, C, n);
  return cudaGetLastError();
}

cudaError_t EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            int B, int T, int C, cudaStream_t s) {
  const size_t n = size_t(T) * C;
  if (n == 0 || B <= 0) return cudaGetLastError();
  EncoderBackwardWpeKernel<<<GridFor(n), kThreads, 0, s>>>(dwpe, dout, B, T, C, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  EncoderBackwardWteKernel<<<kTokenOwners, kThreads, 0, s>>>(dwte, dout, tokens, B * T, C, 0,
                                                              INT_MAX);
  return cudaGetLastError();
}

cudaError_t EncoderShardForward(float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int B, int T, int C, int v_begin, int V,
                                cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (n) {
    EncoderShardForwardKernel<<<GridFor(n), kThreads, 0, s>>>(out, tokens, wte, wpe, T, C, v_begin,
                                                              V, n);
  }
  return cudaGetLastError();
}

cudaError_t EncoderShardBackward(float* dwte, float* dwpe, const float* dout,
                                 const int32_t* tokens, int B, int T, int C, int v_begin, int V,
                                 cudaStream_t s) {
  const size_t n = size_t(T) * C;
  if (n == 0 || B <= 0) return cudaGetLastError();
  EncoderBackwardWpeKernel<<<GridFor(n), kThreads, 0, s>>>(dwpe, dout, B, T, C, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  EncoderBackwardWteKernel<<<kTokenOwners, kThreads, 0, s>>>(dwte, dout, tokens, B * T, C, v_begin,
                                                              V);
  return cudaGetLastError();
}

cudaError_t LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                             const float* weight, const float* bias, int N, int C, float eps,
                             cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  const unsigned grid = static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  LayerNormForwardKernel<<<grid, kThreads, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  return cudaGetLastError();
}

cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, float* partials,
                              const float* dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaGetLastError();
  const unsigned grid = static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock);
  LayerNormBackwardRowsKernel<<<grid, kThreads, 0, s>>>(dinp, dout, inp, weight, mean, rstd, N,
                                                        C);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (dweight == nullptr) return cudaSuccess;  // frozen LayerNorm (LoRA): no parameter gradients
  return LaunchColumnSums(dbias, dweight, partials, dout, inp, mean, rstd, N, C, s);
}

cudaError_t AddBias(float* out, const float* bias, int rows, int cols, cudaStream_t s) {
  const size_t n = size_t(rows) * cols;
  if (n) AddBiasKernel<<<GridFor(n), kThreads, 0, s>>>(out, bias, cols, n);
  return cudaGetLastError();
}

cudaError_t RoundRows(void* dst, const float* src, size_t rows, size_t cols, size_t ld,
                      TileType tile, cudaStream_t s) {
  const size_t n = rows * cols;
  if (n == 0) return cudaGetLastError();
  const bool vector4 = cols % 4 == 0 && ld % 4 == 0 &&
                       reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(dst) % 8 == 0;
  const unsigned grid = GridFor(vector4 ? n / 4 : n);
  switch (tile) {
    case TileType::kBf16:
      RoundRowsKernel<<<grid, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), src, rows, cols,
                                                ld, vector4);
      break;
    case TileType::kFp16:
      RoundRowsKernel<<<grid, kThreads, 0, s>>>(static_cast<__half*>(dst), src, rows, cols, ld,
                                                vector4);
      break;
    case TileType::kFloat:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t BiasBackward(float* dbias, float* partials, const float* dout, int rows, int cols,
                         cudaStream_t s) {
  return LaunchColumnSums(dbias, nullptr, partials, dout, nullptr, nullptr, nullptr, rows, cols,
                          s);
}

cudaError_t AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                             const DropoutArgs& dropout, TileType tile, AttentionPath path,
                             cudaStream_t s) {
  const AttentionArgs a{out, lse, nullptr, qkv, nullptr, nullptr, nullptr, nullptr,
                        B,   T,   C,       NH,  0,       T,       dropout};
  return DispatchTile(false, a, tile, path, s);
}

cudaError_t AttentionDecodeForward(float* out, float* k_cache, float* v_cache, const float* qkv,
                                   int B, int T, int past, int maxT, int C, int NH, TileType tile,
                                   AttentionPath path, cudaStream_t s) {
  const size_t n = size_t(B) * T * C;
  if (n == 0 || NH <= 0) return cudaGetLastError();
  AppendKvKernel<<<GridFor(n), kThreads, 0, s>>>(k_cache, v_cache, qkv, T, past, maxT, C, n);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const AttentionArgs a{out, nullptr, nullptr, qkv, nullptr, nullptr, k_cache,      v_cache,
                        B,   T,       C,       NH,  past,    maxT,    DropoutArgs{}};
  return DispatchTile(false, a, tile, path, s);
}

cudaError_t AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int C, int NH,
                              const DropoutArgs& dropout, TileType tile, AttentionPath path,
                              cudaStream_t s) {
  const AttentionArgs a{dqkv, scratch, dout, qkv, out, lse, nullptr, nullptr,
                        B,    T,       C,    NH,  0,   T,   dropout};
  return DispatchTile(true, a, tile, path, s);
}

cudaError_t GeluForward(float* out, const float* inp, size_t n, cudaStream_t s) {
  if (n) GeluForwardKernel<<<GridFor(n), kThreads, 0, s>>>(out, inp, n);
  return cudaGetLastError();
}

cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, size_t n,
                         cudaStream_t s) {
  if (n) GeluBackwardKernel<<<GridFor(n), kThreads, 0, s>>>(dinp, inp, dout, n);
  return cudaGetLastError();
}

cudaError_t CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N,
                                int V, float dloss, bool write_dlogits, cudaStream_t s) {
  if (N <= 0 || V <= 0) return cudaGetLastError();
  CrossEntropyKernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(losses, logits, targets, V,
                                                                   dloss, write_dlogits);
  return cudaGetLastError();
}

cudaError_t CrossEntropyShardMax(float* row_max, const float* logits, int N, int V,
                                 cudaStream_t s) {
  if (N <= 0 || V <= 0) return cudaGetLastError();
  CrossEntropyShardMaxKernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(row_max, logits, V);
  return cudaGetLastError();
}

cudaError_t CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                                  const int32_t* targets, int N, int V, int v_begin,
                                  cudaStream_t s) {
  if (N <= 0 || V <= 0) return cudaGetLastError();
  CrossEntropyShardSumsKernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
      sums, logits, row_max, targets, N, V, v_begin);
  return cudaGetLastError();
}

cudaError_t CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                                    const float* sums, const int32_t* targets, int N, int V,
                                    int v_begin, float dloss, bool write_dlogits, cudaStream_t s) {
  if (N <= 0 || V <= 0) return cudaGetLastError();
  CrossEntropyShardFinishKernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(
      losses, logits, row_max, sums, targets, N, V, v_begin, dloss, write_dlogits);
  return cudaGetLastError();
}

cudaError_t SumOfSquares(double* partials, const float* x, size_t n, cudaStream_t s) {
  SumOfSquaresPartialKernel<<<kSumOfSquaresBlocks, kThreads, 0, s>>>(partials, x, n);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  SumOfSquaresFinalKernel<<<1, 1, 0, s>>>(partials, kSumOfSquaresBlocks);
  return cudaGetLastError();
}

cudaError_t AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, float bc1,
                        float bc2, float grad_scale, cudaStream_t s) {
  if (n) {
    AdamWKernel<<<GridFor(n), kThreads, 0, s>>>(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                                1.0f / bc1, 1.0f / bc2, grad_scale);
  }
  return cudaGetLastError();
}

}  // namespace fleet::trainer::cuda::gpt
