#include "trainer/models/gpt_plan.h"

#include <algorithm>
#include <cstdio>

#include "trainer/models/adamw.h"
#include "trainer/models/gpt_lora.h"

namespace fleet::trainer {

namespace {

// The activation layout of one rank of a tensor-parallel group of M for
// B x T (what GptModel allocates), with the twin's attention memory or a
// flash twin's, for this rank's NH / M heads.
GptActivationLayout Layout(const GptConfig& c, int B, int T, bool recompute, int M,
                           const GptKernels* kernels) {
  const int NH = c.num_attention_heads / M;
  const size_t saved = kernels ? kernels->AttentionSavedFloats(B, T, NH) : size_t(B) * NH * T;
  const size_t scratch = kernels ? kernels->AttentionScratchFloats(B, T, NH) : 0;
  return GptActivationLayout(c, B, T, recompute, saved, scratch, M);
}

// Floats of `layout`; only those kept from forward to backward when `saved_only`.
int64_t ActivationFloats(const GptActivationLayout& layout, bool saved_only) {
  return static_cast<int64_t>(saved_only ? layout.saved_floats() : layout.total_floats());
}

std::string Bytes(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1024.0 * 1024));
  }
  return buf;
}

}  // namespace

Result<GptPlan> PlanGpt(const GptConfig& config, const GptPlanOptions& options,
                        const GptKernels* kernels) {
  FLEET_RETURN_IF_ERROR(config.Validate());
  if (options.micro_batch_size < 1) {
    return Status::InvalidArgument("must be >= 1, got " + std::to_string(options.micro_batch_size),
                                   "Global.micro_batch_size");
  }
  if (options.seq_len < 0 || options.seq_len > config.max_position_embeddings) {
    return Status::InvalidArgument("sequence length " + std::to_string(options.seq_len) +
                                       " outside [0, Model.max_position_embeddings = " +
                                       std::to_string(config.max_position_embeddings) + "]",
                                   "Data.seq_len");
  }
  if (options.sharding_degree < 1) {
    return Status::InvalidArgument("must be >= 1, got " + std::to_string(options.sharding_degree),
                                   "Distributed.sharding.sharding_degree");
  }
  if (options.sharding_stage < 0 || options.sharding_stage > 3) {
    return Status::InvalidArgument(
        "must be 0, 1, 2 or 3, got " + std::to_string(options.sharding_stage),
        "Distributed.sharding.sharding_stage");
  }
  GptPlan plan;
  if (options.mp_degree < 1 || config.num_attention_heads % options.mp_degree != 0) {
    return Status::InvalidArgument("must be >= 1 and divide Model.num_attention_heads, got " +
                                       std::to_string(options.mp_degree),
                                   "Distributed.mp_degree");
  }
  if (options.dp_degree < 1 || options.accumulate_steps < 1 || options.ranks_per_node < 1) {
    return Status::InvalidArgument("dp_degree, accumulate_steps and ranks_per_node must be >= 1",
                                   "Distributed.dp_degree");
  }
  const bool lora = config.lora.enabled();
  if (lora && (options.mp_degree > 1 || options.offload ||
               (options.sharding_stage == 3 && options.sharding_degree > 1))) {
    return Status::InvalidArgument(
        "LoRA trains with data parallelism and sharding stages 1-2 only (no mp_degree > 1, "
        "stage 3 or offload)",
        "Model.lora");
  }
  const int M = options.mp_degree;
  // Parameters a rank of a tensor-parallel group holds (all when M = 1):
  // Megatron splits wte by rows (vocabulary parallel), the QKV and first MLP
  // matrices and biases by output (column parallel), the attention and
  // second MLP projections by input (row parallel; their biases, the
  // LayerNorms and wpe are whole on every rank).
  // wte by whole rows: rank 0 holds ceil(V / M) of them.
  int64_t N = 0, embeddings = 0, block = 0, lnf = 0;
  ForEachGptTensor(config, [&](GptTensor kind, int layer, int64_t rows, int64_t cols) {
    const bool split = kind == GptTensor::kQkvW || kind == GptTensor::kQkvB ||
                       kind == GptTensor::kProjW || kind == GptTensor::kFcW ||
                       kind == GptTensor::kFcB || kind == GptTensor::kFcProjW;
    const int64_t whole = rows * (cols ? cols : 1);
    const int64_t n = kind == GptTensor::kWte ? (rows + M - 1) / M * cols
                      : split                 ? (whole + M - 1) / M
                                              : whole;
    N += n;
    if (layer == 0) block += n;
    if (layer < 0) (kind == GptTensor::kWte || kind == GptTensor::kWpe ? embeddings : lnf) += n;
  });
  const int B = options.micro_batch_size;
  const int T = options.seq_len ? options.seq_len : config.max_position_embeddings;
  const int D = options.sharding_degree, stage = options.sharding_stage;
  plan.options = options;
  plan.num_params = GptParamCount(config);
  plan.rank_params = N;
  // What trains: LoRA's adapters over the frozen base, or every parameter.
  const int64_t lora_params = GptLoraParamCount(config);
  const int64_t trained = lora ? lora_params : N;
  plan.trainable_params = trained;
  plan.micro_batch_size = B;
  plan.seq_len = T;

  const bool fp32 = options.precision == Precision::kFp32;
  const int64_t compute_bytes = fp32 ? 4 : 2;
  const int64_t state_bytes = fp32 ? 8 : 12;  // m, v (+ fp32 master weights)
  const int64_t shard = static_cast<int64_t>(ShardRange(static_cast<size_t>(trained), D, 0).size());
  // LoRA: the frozen base in compute precision beside the adapters.
  plan.param_bytes = compute_bytes * (N + (lora ? lora_params : 0));
  // Stages 1 and 2 reduce-scatter into a shard buffer beside the full
  // gradients; stage 2 then releases the full ones bucket by bucket on CPU
  // ranks, while a GPU keeps them (one device allocation).
  const bool full_released = stage == 2 && options.cpu;
  plan.grad_bytes =
      compute_bytes * (full_released ? shard : stage >= 1 ? trained + shard : trained);
  plan.optimizer_bytes = state_bytes * (stage >= 1 ? shard : trained);
  if (stage == 3) {
    // The units held whole during a pass (see the header).
    const int64_t working = embeddings + lnf + 2 * block;
    plan.param_bytes = compute_bytes * (shard + working);
    plan.grad_bytes = compute_bytes * (shard + working);
    const int64_t largest = std::max(embeddings, block);
    plan.comm_buffer_bytes = 4 * ((largest + D - 1) / D) * D;
  }
  const int64_t share = stage >= 1 ? shard : trained;  // what this rank's optimizer updates
  if (options.offload) {
    // fp32 master, m, v and the gradients' copy on the host, per rank.
    plan.optimizer_bytes = 0;
    plan.host_bytes_per_node = int64_t{options.ranks_per_node} * 16 * share;
    plan.host_copy_bytes = 2 * compute_bytes * share;
  }

  const int64_t act_bytes = compute_bytes;
  const GptActivationLayout off = Layout(config, B, T, false, M, kernels);
  const GptActivationLayout on = Layout(config, B, T, true, M, kernels);
  const GptActivationLayout& used = config.use_recompute ? on : off;
  plan.activation_bytes_no_recompute = act_bytes * ActivationFloats(off, false);
  plan.activation_bytes_recompute = act_bytes * ActivationFloats(on, false);
  plan.activation_forward_bytes = act_bytes * ActivationFloats(used, true);
  plan.activation_backward_bytes =
      act_bytes * (ActivationFloats(used, false) - ActivationFloats(used, true));
  plan.activation_bytes = plan.activation_forward_bytes + plan.activation_backward_bytes;
  plan.total_bytes = plan.model_state_bytes() + plan.activation_bytes;

  // Communication per step and rank, ring algorithms: an all-reduce over n
  // ranks moves 2 (n - 1) / n of the buffer, an all-gather or
  // reduce-scatter (n - 1) / n.
  const int k = options.accumulate_steps;
  auto ring = [](int n) { return n > 1 ? static_cast<double>(n - 1) / n : 0.0; };
  // Sharding: gradients reduce-scattered once a step (the last micro-batch),
  // parameters all-gathered after the update (stages 1, 2) or before every
  // micro-batch's forward and backward (stage 3).
  const double gathers = stage == 3 ? 2.0 * k : 1.0;
  plan.sharding_comm_bytes =
      static_cast<int64_t>((1.0 + gathers) * ring(D) * static_cast<double>(trained * compute_bytes));
  // Data parallel: the gradients of the share all-reduced.
  plan.dp_comm_bytes = static_cast<int64_t>(2.0 * ring(options.dp_degree) *
                                            static_cast<double>(share * compute_bytes));
  // Tensor parallel, per micro-batch: per block two all-reduces of [B T, C]
  // forward (one more when recompute runs the forward again without its
  // last projection) and two backward; the embedding's forward and ln_f's
  // input gradient one each; the cross-entropy's row max, sums of
  // exponentials and target logits (3 B T floats).
  const double mp_reduces = config.num_layers * (4.0 + (config.use_recompute ? 1.0 : 0.0)) + 2.0;
  plan.mp_comm_bytes =
      static_cast<int64_t>(k * 2.0 * ring(M) * double(B) * T *
                           (mp_reduces * config.hidden_size * compute_bytes + 3.0 * sizeof(float)));

  const double L = config.num_layers, C = config.hidden_size, F = config.ffn();
  const double matmul_params = static_cast<double>(N) - double(config.max_position_embeddings) * C;
  // LoRA skips the frozen weights' gradient GEMMs (forward and input
  // gradients: 4 N') and trains the adapters fully.
  plan.matmul_flops_per_token =
      lora ? 4.0 * matmul_params + 6.0 * static_cast<double>(lora_params) : 6.0 * matmul_params;
  plan.attention_flops_per_token = 12.0 * L * T * C;
  plan.flops_per_token = plan.matmul_flops_per_token + plan.attention_flops_per_token;
  plan.recompute_flops_per_token =
      config.use_recompute ? L * (8.0 * C * C + 2.0 * C * F + 4.0 * T * C) : 0.0;
  return plan;
}

std::string GptPlan::ToString() const {
  char flops[160];
  std::snprintf(flops, sizeof(flops),
                "FLOPs per token %.4g (matmuls %s %.4g + attention 12LTC %.4g)", flops_per_token,
                trainable_params != rank_params ? "4N'+6n (LoRA)" : "6N'",
                matmul_flops_per_token, attention_flops_per_token);
  const GptPlanOptions& o = options;
  std::string layout = "mp " + std::to_string(o.mp_degree) + " x sharding " +
                       std::to_string(o.sharding_degree) + " (stage " +
                       std::to_string(o.sharding_stage) + ") x dp " + std::to_string(o.dp_degree) +
                       (o.offload ? ", optimizer offloaded" : "");
  std::string out =
      std::to_string(num_params) + " parameters; micro batch " + std::to_string(micro_batch_size) +
      " x " + std::to_string(seq_len) + " tokens, " + std::to_string(o.accumulate_steps) +
      " per step; " + layout + " (" + std::to_string(rank_params) +
      " parameters per tensor-parallel rank)" +
      (trainable_params != rank_params
           ? "; LoRA: " + std::to_string(trainable_params) + " trained, the rest frozen"
           : std::string()) +
      "\nper rank: parameters " + Bytes(param_bytes) +
      ", gradients " + Bytes(grad_bytes) + ", optimizer states " + Bytes(optimizer_bytes) +
      (comm_buffer_bytes > 0 ? ", comm buffers " + Bytes(comm_buffer_bytes) : std::string()) +
      ", activations " + Bytes(activation_bytes) + " (forward " + Bytes(activation_forward_bytes) +
      " + backward " + Bytes(activation_backward_bytes) + "; recompute off " +
      Bytes(activation_bytes_no_recompute) + ", on " + Bytes(activation_bytes_recompute) +
      "), total " + Bytes(total_bytes) + " of device memory\nhost per node (" +
      std::to_string(o.ranks_per_node) + " ranks): " + Bytes(host_bytes_per_node) +
      (o.offload ? " (fp32 master, m, v, gradients)" : " (nothing offloaded)") +
      "\ncommunication per step per rank: sharding " + Bytes(sharding_comm_bytes) +
      ", data parallel " + Bytes(dp_comm_bytes) + ", tensor parallel " + Bytes(mp_comm_bytes) +
      ", device<->host " + Bytes(host_copy_bytes) + "\n" + flops;
  if (recompute_flops_per_token > 0) {
    std::snprintf(flops, sizeof(flops), "; recompute adds %.4g", recompute_flops_per_token);
    out += flops;
  }
  return out;
}

}  // namespace fleet::trainer
