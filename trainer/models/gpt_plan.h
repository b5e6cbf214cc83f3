// The dry-run plan of a GPT job (--dry_run / Engine.dry_run): parameter
// count, memory per rank and FLOPs per token for any GptConfig, computed from
// the same tables the model allocates from (GptParamTable's shapes via
// ForEachGptTensor, GptActivationLayout), without allocating any of it.
//
// Memory per rank (bytes), N parameters, D = sharding degree, shards of
// ceil(N / D) elements (ShardRange):
//                       fp32            bf16 / fp16 (fp32 master weights)
//   parameters          4 N             2 N   (the compute copy)
//   gradients           4 N             2 N   (4 N / D ... 2 N / D at stage 2)
//   optimizer states    8 N  (m, v)     12 N  (master, m, v)
// Stage 1 divides the optimizer states by D, stage 2 also the gradients
// (ZeRO, Rajbhandari et al. 2020, section 5: the steady state; an
// implementation also holds a bucket of full gradients while reducing).
// Stage 3 divides the parameters too, and adds what a pass holds whole
// (DataParallel's "Sharded parameters"): the parameters of the embeddings
// (wte is also the head, so they stay from forward to backward), ln_f, the
// block computing and the block prefetched; the gradients of the
// embeddings (wte's fill during the whole backward), ln_f, the block
// computing and the one being reduced; and one float32 staging buffer of the
// largest unit for the collectives (comm_buffer_bytes):
//   parameters  c (N/D + E + Lf + 2 Bk)     c = 4 fp32, 2 bf16/fp16
//   gradients   c (N/D + E + Lf + 2 Bk)     E, Lf, Bk: floats of the
//   optimizer   s N/D                       embeddings, ln_f, one block
//
// Tensor parallelism (mp_degree M): N above is then what one rank of the M
// holds, as GptTensorParallel splits it (gpt_tensor_parallel.h: wte by
// vocabulary rows, ceil(V / M) of them; QKV and the first MLP matrix by
// output, the two projections by input; LayerNorms, wpe and the
// projections' biases whole), and the activations are GptModel's layout for
// one rank (GptActivationLayout with mp_degree: QKV, attention, its output,
// the MLP hidden layer, the logits and their gradients divided by M, plus
// the cross-entropy's [N] and [2 N] for the reductions).
//
// Offload (options.offload): the optimizer states leave the device; the
// host holds 16 bytes per parameter of each rank's share (fp32 master, m,
// v, the gradients' copy), times ranks_per_node per node; each step copies
// the share's gradients down and its parameters up (host_copy_bytes).
//
// Communication per step and rank (ring algorithms: all-reduce moves
// 2 (n-1)/n of its buffer, all-gather and reduce-scatter (n-1)/n), with k
// micro-batches per step:
//   sharding  (1 + g) (D-1)/D c N    g = 1 (stages 1, 2: one gather after the
//                                    update), 2k (stage 3: before every
//                                    forward and backward); one
//                                    reduce-scatter a step
//   dp        2 (P-1)/P c share      the share's gradients, P = dp_degree
//   mp        k 2 (M-1)/M B T ((L (4 + r) + 2) c C + 12)   Megatron's
//                                    all-reduces (r = 1 with recompute) and
//                                    the cross-entropy's three of [B T]
//
// Activations, per micro-batch of B x T tokens: the buffers of
// GptActivationLayout, 4 bytes each in fp32 and 2 in bf16/fp16; with
// recompute one block's worth instead of L (plus the residual stream).
// Attention's share comes from the kernel twin when one is given (the CPU
// twin keeps T x T probabilities per head); without one, from a flash
// attention twin (B x NH x T row statistics, no scratch), what a GPU run
// keeps.
//
// Pipeline parallelism (pp_degree P, collective/gpt_pipeline.h): each
// stage is planned alone, N above being what one rank of the stage holds
// (its blocks; the first stage also wte and wpe, the last ln_f and its copy
// of wte), with the activations of the micro-batches in flight under 1F1B,
// min(P - s, k) for stage s of k micro-batches: the kept buffers once per
// micro-batch in flight, the backward ones once. The plan is the stage
// holding the most; `stages` lists every stage. Per step a stage sends
// k B T C c bytes of activations up and as many of gradients down (none
// past the ends), and the first and last stage all-reduce wte's gradient
// between them. Each stage idles for (P - 1) / (k + P - 1) of the step (the
// bubble: the pipeline's fill and drain).
//
// LoRA (config.lora): the base weights are frozen and held once, in the
// compute precision (c N), beside the adapters (c n); only the adapters'
// n parameters have gradients and optimizer states, so the two rows above
// use n instead of N (GPT-2 124M, rank 8, all four targets: n = 1.18M,
// optimizer states 13.5 MiB in bf16 against 1.39 GiB for full fine-tuning).
// The matmuls cost 4 N' + 6 n per token (no weight gradients for the base).
// LoRA is planned with data parallelism and sharding stages 1-2 only.
//
// FLOPs per token (a multiply-add counts 2), PaLM's model FLOPs (Chowdhery
// et al. 2022, appendix B):
//   6 N'          matmuls forward and backward; N' = N - maxT * C (the
//                 position table does no multiply-adds; the tied wte counts
//                 once, for the output projection)
//   + 12 L T C    attention scores and their weighted sum, forward and
//                 backward, counted for the full T x T (a causal kernel does
//                 about half of it: PaLM's convention, kept so that MFU
//                 figures compare with published ones)
// Recompute adds a forward of every block but its last matmul:
//   L (8 C^2 + 2 C F + 4 T C) hardware FLOPs per token, not model FLOPs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "trainer/kernel_types.h"
#include "trainer/kernels/gpt_kernels.h"
#include "trainer/models/gpt.h"

namespace fleet::trainer {


struct GptPlanOptions {
  // Global.micro_batch_size: sequences per forward.
  int micro_batch_size = 1;
  // Tokens per sequence; 0 = Model.max_position_embeddings.
  int seq_len = 0;
  // Distributed.sharding.sharding_degree (ranks sharing the states) and
  // sharding_stage (0 none, 1 optimizer states, 2 also gradients, 3 also
  // parameters).
  int sharding_degree = 1;
  int sharding_stage = 0;
  Precision precision = Precision::kFp32;
  // Distributed.mp_degree (must divide the heads), dp_degree,
  // sharding_offload; Engine.accumulate_steps; ranks on one node (host
  // memory per node).
  int mp_degree = 1;
  int dp_degree = 1;
  bool offload = false;
  int accumulate_steps = 1;
  int ranks_per_node = 1;
  // Distributed.pp_degree: pipeline stages (must divide Model.num_layers).
  int pp_degree = 1;
  // Ranks on CPUs (Global.device: cpu): what stage 2 can release differs.
  bool cpu = false;
};

struct GptPlan {
  int64_t num_params = 0;
  int64_t rank_params = 0;  // of one tensor-parallel rank (num_params when mp 1)
  // Those the optimizer trains: rank_params, or LoRA's adapters.
  int64_t trainable_params = 0;
  int64_t micro_batch_size = 0, seq_len = 0;
  // Bytes per rank.
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optimizer_bytes = 0;
  // Stage 3: the collectives' staging buffer (0 otherwise).
  int64_t comm_buffer_bytes = 0;
  // Offload: host memory of a node's ranks, and the bytes each rank copies
  // between device and host per step.
  int64_t host_bytes_per_node = 0;
  int64_t host_copy_bytes = 0;
  // Bytes each rank sends per step, by group.
  int64_t sharding_comm_bytes = 0;
  int64_t dp_comm_bytes = 0;
  int64_t mp_comm_bytes = 0;
  int64_t pp_comm_bytes = 0;  // to the neighbouring stages, and wte's gradient sum
  // The options planned for (for ToString).
  GptPlanOptions options;
  // Activations of one micro-batch with the config's use_recompute, split
  // into those kept from forward to backward and backward-only buffers; and
  // the totals with recompute off and on, for comparison.
  // With pipeline stages, of every micro-batch in flight on the stage.
  int64_t activation_bytes = 0;
  int activations_in_flight = 1;
  int64_t activation_forward_bytes = 0;
  int64_t activation_backward_bytes = 0;
  int64_t activation_bytes_no_recompute = 0;
  int64_t activation_bytes_recompute = 0;
  int64_t total_bytes = 0;  // params + grads + optimizer + comm buffers + activations
  // params + grads + optimizer + comm buffers: what DataParallel's
  // measurement (measure_resident_bytes) and the moments compare with.
  int64_t model_state_bytes() const {
    return param_bytes + grad_bytes + optimizer_bytes + comm_buffer_bytes;
  }
  // Pipeline parallelism (pp_degree > 1; empty otherwise): every stage's
  // blocks, micro-batches in flight, parameters per rank, activation and
  // total bytes per rank, bytes sent per step; the stage planned above; the
  // bubble fraction.
  struct Stage {
    int first_layer = 0, end_layer = 0;
    int in_flight = 1;
    int64_t rank_params = 0, activation_bytes = 0, total_bytes = 0, comm_bytes = 0;
  };
  std::vector<Stage> stages;
  int planned_stage = 0;
  double bubble_fraction = 0;
  // Model FLOPs per trained token and its two terms; recompute's extra.
  double flops_per_token = 0;
  double matmul_flops_per_token = 0;
  double attention_flops_per_token = 0;
  double recompute_flops_per_token = 0;

  // A few lines for the log of a dry run.
  std::string ToString() const;
};

// InvalidArgument naming the key for a bad config (GptConfig::Validate), a
// micro batch < 1, seq_len outside [0, max_position_embeddings], degree < 1
// stage outside {0, 1, 2, 3}, an mp_degree that does not divide the heads, a
// pp_degree that does not divide the layers, or LoRA with mp_degree or
// pp_degree > 1, stage 3 or offload. `kernels` (may be
// null, not kept) supplies the attention memory of the twin that will run.
Result<GptPlan> PlanGpt(const GptConfig& config, const GptPlanOptions& options,
                        const GptKernels* kernels = nullptr);

}  // namespace fleet::trainer
