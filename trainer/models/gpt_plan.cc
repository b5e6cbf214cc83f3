#include "trainer/models/gpt_plan.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "trainer/models/adamw.h"
#include "trainer/models/gpt_lora.h"

namespace fleet::trainer {

namespace {

// The activation layout of one rank of a tensor-parallel group of M for
// B x T (what GptModel allocates), with the twin's attention memory or a
// flash twin's, for this rank's NH / M heads.
GptActivationLayout Layout(const GptConfig& c, int B, int T, bool recompute, int M,
                           const GptKernels* kernels, const GptStage& stage) {
  const int NH = c.num_attention_heads / M;
  const size_t saved = kernels ? kernels->AttentionSavedFloats(B, T, NH) : size_t(B) * NH * T;
  const size_t scratch = kernels ? kernels->AttentionScratchFloats(B, T, NH) : 0;
  return GptActivationLayout(c, B, T, recompute, saved, scratch, M, &stage);
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

// Parameters a rank of a tensor-parallel group of M holds of `stage` (all
// when M = 1): Megatron splits wte by rows (vocabulary parallel; rank 0
// holds ceil(V / M) of them), the QKV and first MLP matrices and biases by
// output (column parallel), the attention and second MLP projections by
// input (row parallel; their biases, the LayerNorms and wpe are whole on
// every rank). Also the floats of the embeddings, one block and ln_f (the
// head's wte copy counted with ln_f).
struct RankParams {
  int64_t all = 0, embeddings = 0, block = 0, lnf = 0;
};
RankParams CountRankParams(const GptConfig& config, int M, const GptStage& stage) {
  RankParams p;
  ForEachStageTensor(
      config, stage, [&](GptTensor kind, int layer, int64_t rows, int64_t cols, size_t, size_t) {
        const bool split = kind == GptTensor::kQkvW || kind == GptTensor::kQkvB ||
                           kind == GptTensor::kProjW || kind == GptTensor::kFcW ||
                           kind == GptTensor::kFcB || kind == GptTensor::kFcProjW;
        const int64_t whole = rows * (cols ? cols : 1);
        const int64_t n = kind == GptTensor::kWte ? (rows + M - 1) / M * cols
                          : split                 ? (whole + M - 1) / M
                                                  : whole;
        p.all += n;
        if (layer == stage.first_layer) p.block += n;
        if (layer < 0) {
          const bool embedding =
              (kind == GptTensor::kWte && stage.embedding) || kind == GptTensor::kWpe;
          (embedding ? p.embeddings : p.lnf) += n;
        }
      });
  return p;
}

// The memory and communication of one rank of `stage` holding the
// activations of `in_flight` micro-batches at once (1 without a pipeline).
GptPlan PlanStage(const GptConfig& config, const GptPlanOptions& options, const GptKernels* kernels,
                  const GptStage& stage, int in_flight) {
  GptPlan plan;
  const bool lora = config.lora.enabled();
  const int M = options.mp_degree;
  const RankParams counted = CountRankParams(config, M, stage);
  const int64_t N = counted.all, embeddings = counted.embeddings, block = counted.block,
                lnf = counted.lnf;
  const int B = options.micro_batch_size;
  const int T = options.seq_len ? options.seq_len : config.max_position_embeddings;
  const int D = options.sharding_degree, zero = options.sharding_stage;
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
  const bool full_released = zero == 2 && options.cpu;
  plan.grad_bytes = compute_bytes * (full_released ? shard : zero >= 1 ? trained + shard : trained);
  plan.optimizer_bytes = state_bytes * (zero >= 1 ? shard : trained);
  if (zero == 3) {
    // The units held whole during a pass (see the header).
    const int64_t working = embeddings + lnf + 2 * block;
    plan.param_bytes = compute_bytes * (shard + working);
    plan.grad_bytes = compute_bytes * (shard + working);
    const int64_t largest = std::max(embeddings, block);
    plan.comm_buffer_bytes = 4 * ((largest + D - 1) / D) * D;
  }
  const int64_t share = zero >= 1 ? shard : trained;  // what this rank's optimizer updates
  if (options.offload) {
    // fp32 master, m, v and the gradients' copy on the host, per rank.
    plan.optimizer_bytes = 0;
    plan.host_bytes_per_node = int64_t{options.ranks_per_node} * 16 * share;
    plan.host_copy_bytes = 2 * compute_bytes * share;
  }

  // The kept buffers once per micro-batch in flight, the backward ones once.
  const int64_t act_bytes = compute_bytes;
  auto bytes = [&](const GptActivationLayout& layout) {
    return act_bytes * (ActivationFloats(layout, true) * in_flight +
                        ActivationFloats(layout, false) - ActivationFloats(layout, true));
  };
  const GptActivationLayout off = Layout(config, B, T, false, M, kernels, stage);
  const GptActivationLayout on = Layout(config, B, T, true, M, kernels, stage);
  const GptActivationLayout& used = config.use_recompute ? on : off;
  plan.activations_in_flight = in_flight;
  plan.activation_bytes_no_recompute = bytes(off);
  plan.activation_bytes_recompute = bytes(on);
  plan.activation_forward_bytes = act_bytes * ActivationFloats(used, true) * in_flight;
  plan.activation_bytes = bytes(used);
  plan.activation_backward_bytes = plan.activation_bytes - plan.activation_forward_bytes;
  plan.total_bytes = plan.model_state_bytes() + plan.activation_bytes;

  // Communication per step and rank, ring algorithms: an all-reduce over n
  // ranks moves 2 (n - 1) / n of the buffer, an all-gather or
  // reduce-scatter (n - 1) / n.
  const int k = options.accumulate_steps;
  auto ring = [](int n) { return n > 1 ? static_cast<double>(n - 1) / n : 0.0; };
  // Sharding: gradients reduce-scattered once a step (the last micro-batch),
  // parameters all-gathered after the update (stages 1, 2) or before every
  // micro-batch's forward and backward (stage 3).
  const double gathers = zero == 3 ? 2.0 * k : 1.0;
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
  const double mp_reduces = stage.layers() * (4.0 + (config.use_recompute ? 1.0 : 0.0)) +
                            (stage.embedding ? 1.0 : 0.0) + (stage.head ? 1.0 : 0.0);
  plan.mp_comm_bytes = static_cast<int64_t>(
      k * 2.0 * ring(M) * double(B) * T *
      (mp_reduces * config.hidden_size * compute_bytes + (stage.head ? 3.0 * sizeof(float) : 0.0)));
  // Pipeline, per micro-batch: the output activation [B T, C] up and the
  // input's gradient down; the first and last stage also all-reduce wte's
  // gradient (vocabulary rows of this tensor-parallel rank) between them.
  const int64_t boundary = int64_t{B} * T * config.hidden_size * compute_bytes;
  plan.pp_comm_bytes = k * boundary * ((stage.head ? 0 : 1) + (stage.embedding ? 0 : 1));
  if (options.pp_degree > 1 && (stage.embedding || stage.head)) {
    const int64_t wte_rows = (int64_t{config.vocab_size} + M - 1) / M;
    plan.pp_comm_bytes += wte_rows * config.hidden_size * compute_bytes;  // 2 (n-1)/n at n = 2
  }
  return plan;
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
  if (options.mp_degree < 1 || config.num_attention_heads % options.mp_degree != 0) {
    return Status::InvalidArgument("must be >= 1 and divide Model.num_attention_heads, got " +
                                       std::to_string(options.mp_degree),
                                   "Distributed.mp_degree");
  }
  if (options.pp_degree < 1 || config.num_layers % options.pp_degree != 0) {
    return Status::InvalidArgument(
        "must be >= 1 and divide Model.num_layers, got " + std::to_string(options.pp_degree),
        "Distributed.pp_degree");
  }
  if (options.dp_degree < 1 || options.accumulate_steps < 1 || options.ranks_per_node < 1) {
    return Status::InvalidArgument("dp_degree, accumulate_steps and ranks_per_node must be >= 1",
                                   "Distributed.dp_degree");
  }
  const bool lora = config.lora.enabled();
  if (lora && (options.mp_degree > 1 || options.pp_degree > 1 || options.offload ||
               (options.sharding_stage == 3 && options.sharding_degree > 1))) {
    return Status::InvalidArgument(
        "LoRA trains with data parallelism and sharding stages 1-2 only (no mp_degree or "
        "pp_degree > 1, stage 3 or offload)",
        "Model.lora");
  }
  // Every stage's plan; the one holding the most is the plan.
  const int P = options.pp_degree;
  GptPlan plan;
  std::vector<GptPlan::Stage> stages;
  for (int s = 0; s < P; ++s) {
    FLEET_ASSIGN_OR_RETURN(GptStage stage, GptPipelineStage(config, P, s));
    const int in_flight = P > 1 ? std::min(P - s, options.accumulate_steps) : 1;
    GptPlan planned = PlanStage(config, options, kernels, stage, in_flight);
    stages.push_back({stage.first_layer, stage.end_layer, in_flight, planned.rank_params,
                      planned.activation_bytes, planned.total_bytes, planned.pp_comm_bytes});
    if (s == 0 || planned.total_bytes > plan.total_bytes) {
      plan = std::move(planned);
      plan.planned_stage = s;
    }
  }
  if (P > 1) {
    plan.stages = std::move(stages);
    plan.bubble_fraction = static_cast<double>(P - 1) / (options.accumulate_steps + P - 1);
  }

  // FLOPs of the whole model per tensor-parallel rank.
  const int T = static_cast<int>(plan.seq_len);
  const int64_t N = CountRankParams(config, options.mp_degree, GptWholeStage(config)).all;
  const int64_t lora_params = GptLoraParamCount(config);
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
  std::string layout = (o.pp_degree > 1 ? "pp " + std::to_string(o.pp_degree) + " x " : "") +
                       "mp " + std::to_string(o.mp_degree) + " x sharding " +
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
      "\nper rank: parameters " + Bytes(param_bytes) + ", gradients " + Bytes(grad_bytes) +
      ", optimizer states " + Bytes(optimizer_bytes) +
      (comm_buffer_bytes > 0 ? ", comm buffers " + Bytes(comm_buffer_bytes) : std::string()) +
      ", activations " + Bytes(activation_bytes) + " (forward " + Bytes(activation_forward_bytes) +
      " + backward " + Bytes(activation_backward_bytes) + "; recompute off " +
      Bytes(activation_bytes_no_recompute) + ", on " + Bytes(activation_bytes_recompute) +
      "), total " + Bytes(total_bytes) + " of device memory\nhost per node (" +
      std::to_string(o.ranks_per_node) + " ranks): " + Bytes(host_bytes_per_node) +
      (o.offload ? " (fp32 master, m, v, gradients)" : " (nothing offloaded)") +
      "\ncommunication per step per rank: sharding " + Bytes(sharding_comm_bytes) +
      ", data parallel " + Bytes(dp_comm_bytes) + ", tensor parallel " + Bytes(mp_comm_bytes) +
      (o.pp_degree > 1 ? ", pipeline " + Bytes(pp_comm_bytes) : std::string()) +
      ", device<->host " + Bytes(host_copy_bytes) + "\n" + flops;
  if (recompute_flops_per_token > 0) {
    std::snprintf(flops, sizeof(flops), "; recompute adds %.4g", recompute_flops_per_token);
    out += flops;
  }
  if (stages.empty()) return out;
  // Pipeline: every stage, then the bubble.
  out += "\npipeline: per rank above is stage " + std::to_string(planned_stage) +
         "'s, the one holding the most";
  for (size_t s = 0; s < stages.size(); ++s) {
    const Stage& st = stages[s];
    out += "\n  stage " + std::to_string(s) + ": blocks " + std::to_string(st.first_layer) + "-" +
           std::to_string(st.end_layer - 1) + ", " + std::to_string(st.rank_params) +
           " parameters per rank, activations " + Bytes(st.activation_bytes) + " (" +
           std::to_string(st.in_flight) + (st.in_flight == 1 ? " micro-batch" : " micro-batches") +
           " in flight), total " + Bytes(st.total_bytes) + ", sends " + Bytes(st.comm_bytes) +
           " per step";
  }
  std::snprintf(flops, sizeof(flops),
                "\npipeline bubble: %.1f%% of each step ((P-1)/(m+P-1), P %d stages, m %d "
                "micro-batches)",
                100.0 * bubble_fraction, o.pp_degree, o.accumulate_steps);
  return out + flops;
}

}  // namespace fleet::trainer
