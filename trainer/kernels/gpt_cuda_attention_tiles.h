// The attention kernels of CudaGptKernels that run on tiles of 32 queries by
// 32 keys in float arithmetic (gpt_cuda_attention_tiles.cu): every
// precision's and head size's path where the tensor-core kernels
// (gpt_cuda_flash_tc.h, gpt_cuda_flash_mma.h) do not apply, and the one
// path of attention dropout. Flash attention (Dao et al. 2022,
// FlashAttention-2's loop order): a block takes a tile of queries (forward,
// dQ) or keys (dK, dV), stages the other side's tiles of q, k, v and dout in
// shared memory (converted to the tile type) and keeps an online softmax in
// registers; only the row log-sum-exps go to global memory. dQ and dK/dV
// are separate kernels that each recompute the probabilities, so every
// gradient element has one writer (no atomics, deterministic).
//
// Written for both nvcc and the CPU emulation (cuda_emulatable.h), where
// trainer_gpt_dropout_emulated_test runs them. Kept free of C++20 (nvcc
// compiles it as C++17).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "trainer/kernels/gpt_cuda_ops.h"  // TileType, DropoutArgs

namespace fleet::trainer::cuda::gpt {

// Where a forward attention reads and writes. Queries: Tq rows per
// sequence at positions past .. past + Tq - 1, row stride q_ld, sequences
// q_batch apart; keys and values: rows 0 .. past + Tq - 1, stride kv_ld,
// sequences kv_batch apart (in qkv itself for training, in the KV caches for
// decoding). out: [B, Tq, C]; lse: [B, NH, Tq] or null.
struct ForwardParams {
  float* out;
  float* lse;
  const float* q;
  const float* k;
  const float* v;
  size_t q_batch, kv_batch;
  size_t q_ld, kv_ld;
  int Tq, past, C, NH;
  float scale;
};

// What one attention call works on. Forward: out, aux = lse, qkv, and for
// decoding k_cache / v_cache (else null: keys and values are in qkv), past,
// maxT. Backward: out = dqkv, aux = scratch (the row dots), dout, fout = the
// forward's out, lse. dropout: training's (forward and backward; p 0 when
// decoding), the element index t T + s of query t and key s.
struct AttentionArgs {
  float* out;
  float* aux;
  const float* dout;
  const float* qkv;
  const float* fout;
  const float* lse;
  const float* k_cache;
  const float* v_cache;
  int B, T, C, NH;
  int past, maxT;
  DropoutArgs dropout;
};

// Where a forward call of `a` reads: q, k, v in qkv, or k, v in the caches
// when decoding.
ForwardParams ForwardLayout(const AttentionArgs& a);

// aux = the rows' dout . out, [B, NH, T]: what both backward paths need
// (one warp per row).
cudaError_t AttentionRowDots(const AttentionArgs& a, cudaStream_t s);

// The tile kernels, forward or backward (row dots included), with tiles of
// `tile`. REQUIRES: a.C % a.NH == 0, a.C / a.NH <= kMaxHeadSize (else
// cudaErrorInvalidValue).
cudaError_t TileAttention(bool backward, const AttentionArgs& a, TileType tile, cudaStream_t s);

}  // namespace fleet::trainer::cuda::gpt
