// Launchers of the CUDA kernels behind CudaGptKernels (gpt_cuda_kernels.h),
// everything of a GPT-2 step but the GEMMs (cuBLAS does those). Each launcher
// has the shapes and add/overwrite semantics of the GptKernels method it
// serves (gpt_kernels.h), takes device pointers, enqueues on `s` and returns
// the launch error (cudaSuccess when there was nothing to do). Kept free of
// C++20 so nvcc compiles it as C++17 (the interface headers are C++20).
//
// Determinism: no kernel uses atomics; every sum is taken in a fixed order
// that depends only on the shapes, so the same inputs give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace fleet::trainer::cuda::gpt {

// What attention converts its tiles of q, k, v and dout to in shared memory
// (arithmetic stays float32): float32, bfloat16 or float16.
enum class TileType { kFloat, kBf16, kFp16 };

// Dropout (GptKernels' DropoutSpec, as the .cu files take it): p 0 is off;
// streams is device memory [B].
struct DropoutArgs {
  float p = 0.0f;
  uint64_t seed = 0;
  uint32_t site = 0;
  const uint32_t* streams = nullptr;
  int head_offset = 0;
};

// Attention tiles are kAttentionTile queries by kAttentionTile keys; one
// lane of a warp per key (or query), so the tile is a warp wide.
inline constexpr int kAttentionTile = 32;
// Head sizes up to this are supported (each lane keeps hs / 32 output
// dimensions in registers).
inline constexpr int kMaxHeadSize = 256;

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
//   out: [B, T, C], tokens: [B, T], wte: [V, C], wpe: [maxT, C]
cudaError_t EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                           int B, int T, int C, cudaStream_t s);
// dwte[tokens[i], :] += dout[i, :] (each dwte row summed by one block, its
// positions in order); dwpe[t, :] += sum_b dout[b, t, :].
//   dwte: [V, C], dwpe: [maxT, C], dout: [B, T, C], tokens: [B, T]
cudaError_t EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            int B, int T, int C, cudaStream_t s);

// One warp per row.   out, inp: [N, C], mean, rstd: [N], weight, bias: [C]
cudaError_t LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                             const float* weight, const float* bias, int N, int C, float eps,
                             cudaStream_t s);
// Column sums (bias and LayerNorm parameter gradients) run in two passes
// for parallelism: kColumnSumChunks blocks of rows each sum their part into
// `partials` (ColumnSumsPartialFloats(cols) floats of device scratch), then
// one thread a column adds the parts in order: the same bits on every call.
inline constexpr int kColumnSumChunks = 64;
inline size_t ColumnSumsPartialFloats(int cols) {
  return 2 * size_t(kColumnSumChunks) * size_t(cols > 0 ? cols : 0);
}
// dinp += ... (one warp per row), then dweight/dbias += column sums.
//   dinp, dout, inp: [N, C], dweight, dbias, weight: [C], mean, rstd: [N]
cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, float* partials,
                              const float* dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd, int N, int C, cudaStream_t s);

// out[r, c] += bias[c].   out: [rows, cols], bias: [cols]
cudaError_t AddBias(float* out, const float* bias, int rows, int cols, cudaStream_t s);
// dbias[c] += sum_r dout[r, c], rows summed in a fixed order.
//   dbias: [cols], dout: [rows, cols]
cudaError_t BiasBackward(float* dbias, float* partials, const float* dout, int rows, int cols,
                         cudaStream_t s);
// dst (packed [rows, cols] of 16-bit `tile` elements, kBf16 or kFp16) =
// src [rows, cols] with row stride ld, rounded to nearest: the operands of a
// 16-bit GEMM.
cudaError_t RoundRows(void* dst, const float* src, size_t rows, size_t cols, size_t ld,
                      TileType tile, cudaStream_t s);

// Which kernels the attention launchers below run where the tile is bf16 or
// fp16 with a head size that is a multiple of 16 up to 128: kWmma the
// tensor-core kernels of gpt_cuda_flash_tc.cu, kMma those of
// gpt_cuda_flash_mma.cu (CudaGptKernels' default), kMmaLdMatrix the same
// with ldmatrix in place of transposed copies (MmaTransposes), all only
// when the caller checked TensorCoreAttentionAvailable()
// (gpt_cuda_flash_tc.h). kTiles, every other case and attention dropout
// (the tensor-core kernels have none) run the tile kernels
// (gpt_cuda_attention_tiles.h: float arithmetic over tiles of the tile type).
enum class AttentionPath { kTiles, kWmma, kMma, kMmaLdMatrix };
//
// Flash attention forward: out and the row log-sum-exps lse [B, NH, T] of
// the scaled scores (before dropout). qkv: [B, T, 3C], out: [B, T, C].
// REQUIRES: C % NH == 0, C / NH <= kMaxHeadSize.
cudaError_t AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                             const DropoutArgs& dropout, TileType tile, AttentionPath path,
                             cudaStream_t s);
// Flash attention backward: dqkv += gradient (`dropout` the forward's).
// scratch: [B, NH, T] (the row dot products dout . out), overwritten. dout,
// out: [B, T, C].
cudaError_t AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int C, int NH,
                              const DropoutArgs& dropout, TileType tile, AttentionPath path,
                              cudaStream_t s);

// Appends the new keys and values to the caches, then flash attention of
// the T new queries (positions past .. past + T - 1) over cached rows
// [0, past + T) (GptKernels::AttentionDecodeForward; no scratch).
//   out: [B, T, C], k_cache, v_cache: [B, maxT, C], qkv: [B, T, 3C]
cudaError_t AttentionDecodeForward(float* out, float* k_cache, float* v_cache, const float* qkv,
                                   int B, int T, int past, int maxT, int C, int NH, TileType tile,
                                   AttentionPath path, cudaStream_t s);

// Dropout (GptKernels::DropoutForward / DropoutBackward, gpt_cuda_dropout.cu):
// out[b, i] = (residual ? residual[b, i] : 0) + kept(b, i) inp[b, i] / (1 - p),
// and dinp[b, i] = kept(b, i) dout[b, i] / (1 - p) (overwrites; may be dout).
// One thread per group of 4 elements (one Philox draw). REQUIRES: p > 0.
//   out, inp, residual, dinp, dout: [B, n], streams: [B]
cudaError_t DropoutForward(float* out, const float* inp, const float* residual, int B, size_t n,
                           const DropoutArgs& dropout, cudaStream_t s);
cudaError_t DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                            const DropoutArgs& dropout, cudaStream_t s);

// GELU (tanh): out = gelu(inp); dinp = dout * gelu'(inp) (overwrites; may be dout).
cudaError_t GeluForward(float* out, const float* inp, size_t n, cudaStream_t s);
cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, size_t n,
                         cudaStream_t s);

// The fused softmax + cross-entropy of GptKernels::CrossEntropyForward, one
// block per row.   losses: [N], logits: [N, V], targets: [N] in [-1, V)
cudaError_t CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N,
                                int V, float dloss, bool write_dlogits, cudaStream_t s);

// The vocabulary-shard kernels of GptKernels (EncoderShard*, one element per
// thread; CrossEntropyShard*, one block per row).
cudaError_t EncoderShardForward(float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int B, int T, int C, int v_begin, int V,
                                cudaStream_t s);
cudaError_t EncoderShardBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                 int B, int T, int C, int v_begin, int V, cudaStream_t s);
cudaError_t CrossEntropyShardMax(float* row_max, const float* logits, int N, int V, cudaStream_t s);
cudaError_t CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                                  const int32_t* targets, int N, int V, int v_begin,
                                  cudaStream_t s);
cudaError_t CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                                    const float* sums, const int32_t* targets, int N, int V,
                                    int v_begin, float dloss, bool write_dlogits, cudaStream_t s);

// Sum of squares in two passes: `partials` (kSumOfSquaresBlocks doubles) gets
// one sum per block, then partials[0] the total, summed in block order.
inline constexpr int kSumOfSquaresBlocks = 1024;
cudaError_t SumOfSquares(double* partials, const float* x, size_t n, cudaStream_t s);

// AdamW (gpt_kernels.h's AdamWStep, fields passed one by one).   p, g, m, v: [n]
cudaError_t AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n, float lr,
                        float beta1, float beta2, float eps, float weight_decay, float bc1,
                        float bc2, float grad_scale, cudaStream_t s);

}  // namespace fleet::trainer::cuda::gpt
