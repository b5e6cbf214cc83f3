// LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
// Models") for GptModel: Model.lora (GptLoraConfig, gpt.h) adapts the
// targeted matrices of every block. A targeted W [out, in] (PyTorch's
// layout, what GptKernels::MatmulForward takes) computes
//   y = x W^T + s (x A^T) B^T,     s = alpha / rank,
// with A [rank, in] and B [out, rank] (PEFT's lora_A / lora_B shapes; in the
// paper's x A B notation they are the transposes). W is frozen: GptModel
// then keeps its arena without gradients and computes none for it (the
// kernels skip the weight-gradient GEMMs); A and B are the only trained
// parameters, in their own arena, which the optimizer, data parallelism
// and checkpoints see instead of the model's.
//
// Initialisation (PEFT's): B = 0, so a fresh adapter changes nothing; A
// uniform in [-1/sqrt(in), 1/sqrt(in)] from the model's seed.
//
// The adapter's GEMMs are Backend::Gemm calls (cuBLAS on a CUDA backend,
// on the stream the GPT kernels use), so LoRA needs no kernel of its own.
// The rank-wide intermediate x A^T is recomputed in backward (rank floats a
// row; GptAct::kLoraScratch holds it and its gradient).
//
// Thread safety: one thread drives the adapters (the model's).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/models/gpt.h"
#include "trainer/param_arena.h"
#include "trainer/param_hooks.h"

namespace fleet::trainer {

// The adapters' tensors, per block l and target t in LoraTarget order
// (only the targeted ones): "h.l.<matrix>.lora_A" [rank, in] then
// "h.l.<matrix>.lora_B" [out, rank], <matrix> as in GptTensorName
// (attn.qkv, attn.proj, mlp.fc, mlp.proj). A block's tensors are contiguous.
// Empty without LoRA.
ParamTable GptLoraParamTable(const GptConfig& config);
// Number of adapter parameters (0 without LoRA). GPT-2 124M, rank 8, all
// four targets: 1,179,648. Allocates nothing.
int64_t GptLoraParamCount(const GptConfig& config);
// The (in, out) shape of target `t`'s matrix.
std::array<int64_t, 2> LoraTargetShape(const GptConfig& config, LoraTarget t);
// The base tensor a target adapts (its weight matrix).
GptTensor LoraBaseTensor(LoraTarget t);

class GptLoraAdapters {
 public:
  // The initialised adapters of `config` (REQUIRES: config.lora.enabled())
  // on `backend` (not owned, outlives this).
  static Result<std::unique_ptr<GptLoraAdapters>> Create(const GptConfig& config,
                                                         Backend* backend);

  ParamArena& arena() { return arena_; }
  const ParamArena& arena() const { return arena_; }
  // The model config they adapt, with its Model.lora.
  const GptConfig& config() const { return config_; }
  Backend* backend() const { return backend_; }
  // The adapters' tensors of block `layer`, as arena indices.
  TensorRange BlockRange(int layer) const;

  // out [N, out] += s (inp A^T) B^T; u [N, rank] scratch (overwritten).
  // Nothing for a target that is not adapted.
  void Forward(int layer, LoraTarget t, const float* inp, float* out, int N, float* u);
  // Given dout [N, out] and the forward's inp [N, in]: dB += s dout^T u,
  // dA += du^T inp and dinp [N, in] += du A with u = inp A^T, du = s dout B;
  // u and du [N, rank] scratch.
  void Backward(int layer, LoraTarget t, const float* dout, const float* inp, float* dinp, int N,
                float* u, float* du);

 private:
  GptLoraAdapters(const GptConfig& config, Backend* backend, ParamArena arena);
  // Arena index of target t's A in block `layer`, or -1 when not targeted.
  int Index(int layer, LoraTarget t) const;

  const GptConfig config_;
  Backend* const backend_;
  ParamArena arena_;
  int per_block_ = 0;  // tensors per block: 2 x targets
};

}  // namespace fleet::trainer
