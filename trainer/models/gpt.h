// GptModel: GPT-2 (Radford et al. 2019) with explicit forward and backward
// over one ParamArena, on any GptKernels twin (CPU now; CUDA to come).
//
//   tokens -> wte[token] + wpe[position]                         (residual 0)
//   L blocks, pre-LayerNorm:  x += attn_proj(causal_MHA(qkv(ln_1(x))))
//                             x += mlp_proj(gelu_tanh(mlp_fc(ln_2(x))))
//   ln_f -> logits = ln_f(x) wte^T   (output projection tied to wte, no bias)
//   loss = mean over positions with a target of cross_entropy(logits, target)
//
// Dropout (GptConfig::hidden_dropout_prob, attention_probs_dropout_prob;
// FleetX's places, "upscale in train"): on the embeddings' sum, on the
// attention probabilities, and on the attention's and the MLP's output
// projections before they are added to the residual stream. Only in a
// training Forward (for_backward) and its Backward; the mask of each site
// comes from the counter-based generator of the kernels (DropoutSpec in
// gpt_kernels.h) keyed by the step's seed (GptForwardOptions::dropout_seed),
// the site (GptDropoutSite) and each sequence's stream (its sample's id), so
// Backward and a recompute draw the same mask again and a sample's mask is
// the same on any rank, micro-batch or tensor-parallel part. Parameters: every tensor of
// GptParamTable in one arena, initialised as GPT-2 does: weights N(0, 0.02),
// the two residual projections N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm
// weight 1 and bias 0.
//
// A training step (gradient accumulation over k micro-batches: call Forward
// and Backward k times with grad_scale = 1/k before one optimizer step;
// Backward adds into the gradients):
//   model->arena().ZeroGrad();
//   for each micro-batch:
//     FLEET_ASSIGN_OR_RETURN(float loss, model->Forward(tokens, targets, B, T, {.grad_scale = 1.0f
//     / k})); model->Backward(dp->grad_ready());
//   adamw->Step();
//
// Activation recompute (GptConfig::use_recompute): Forward keeps only each
// block's input (the residual stream); Backward recomputes a block's
// activations from it, into one block-sized workspace, just before that
// block's backward. Gradients are bit-identical to those without recompute
// (same kernels on the same inputs; the kernels are deterministic), and the
// activation memory holds 1 block instead of L (see GptActivationLayout).
//
// Parameters kept elsewhere (ZeRO stage 3, trainer/param_hooks.h): with
// set_param_hooks the model acquires each unit's parameters (ParamUnits: the
// embeddings wte and wpe, each block, ln_f) just before it reads them and
// releases them when done:
//   forward   embeddings, then block 0 .. L-1 (each released after its
//             forward), then ln_f; the embeddings (wte is the head) and ln_f
//             stay until backward, or are released at the end of an
//             evaluation forward (for_backward false) and of LastLogits;
//   backward  the head, then ln_f released; block L-1 .. 0, each acquired
//             again before its (recompute and) backward and released after;
//             the embeddings released last.
// Each Acquire names the unit to come next (the one after it in that
// order), so an implementation can fetch it while this one computes.
//
// Tensor parallelism (Megatron-LM): with a GptTensorParallel context
// (gpt_tensor_parallel.h) the arena holds this rank's shard of the table and
// the passes all-reduce over the context's group where Megatron does; the
// context's header says what is split and how. Every rank of the group
// must run the same passes on the same tokens. LastLogits needs the whole
// vocabulary and refuses a split model.
//
// LoRA (GptConfig::lora, gpt_lora.h): the arena's weights are frozen (no
// gradient buffer; Backward computes input gradients only) and each targeted
// matmul adds its low-rank adapter's term; the adapters are
// trainable_arena(), which Backward's on_grads_ready ranges then name.
//
// Thread safety: one thread drives a model at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/kernels/gpt_kernels.h"
#include "trainer/param_arena.h"
#include "trainer/param_hooks.h"

namespace fleet::trainer {

class GptTensorParallel;
class GptLoraAdapters;

// The four matrices of a block LoRA can adapt (Model.lora.targets): the
// attention's qkv [3C, C] and proj [C, C], the MLP's fc [F, C] and its
// projection fc_proj [C, F].
enum class LoraTarget { kQkv, kProj, kFc, kFcProj };
inline constexpr int kLoraTargets = 4;
std::string_view LoraTargetName(LoraTarget target);  // "qkv", "proj", "fc", "fc_proj"

// Model.lora (Hu et al. 2021): each targeted W [out, in] of every block
// computes x W^T + (alpha / rank) (x A^T) B^T with A [rank, in] and
// B [out, rank] trained and W frozen (trainer/models/gpt_lora.h).
struct GptLoraConfig {
  int rank = 0;  // 0: no LoRA, every parameter trains
  float alpha = 0.0f;
  std::array<bool, kLoraTargets> targets{};  // indexed by LoraTarget
  bool enabled() const { return rank > 0; }
  bool targets_(LoraTarget t) const { return targets[static_cast<size_t>(t)]; }
  float scale() const { return alpha / static_cast<float>(rank); }
};

// The Model section of a GPT job config (FleetX's key names).
struct GptConfig {
  // Model.vocab_size: rows of the token embedding and of the logits. FleetX
  // pads GPT-2's 50257 tokens to 50304 (a multiple of 64 and 128) for faster
  // GEMMs; the padding ids never occur as targets and learn to score low.
  int vocab_size = 50304;
  // Model.hidden_size (C). Model.num_attention_heads must divide it.
  int hidden_size = 768;
  // Model.num_layers (L).
  int num_layers = 12;
  // Model.num_attention_heads (NH); head size C / NH (64 in every GPT-2/3 size).
  int num_attention_heads = 12;
  // Model.ffn_hidden_size (F): the MLP's hidden width; 0 means 4 * hidden_size.
  int ffn_hidden_size = 0;
  // Model.max_position_embeddings: rows of the position table, the longest
  // sequence the model takes.
  int max_position_embeddings = 1024;
  // Model.initializer_range: std of the normal initialisation.
  float initializer_range = 0.02f;
  // Model.use_recompute: trade ~1/3 more compute for activation memory of one
  // block instead of L (see above). Turn on when activations do not fit.
  bool use_recompute = false;
  // Model.hidden_dropout_prob, Model.attention_probs_dropout_prob: dropout
  // probabilities in [0, 1) (see above); 0 is off.
  float hidden_dropout_prob = 0.0f;
  float attention_probs_dropout_prob = 0.0f;
  // Seed of the initialisation; same seed, same parameters on every machine.
  uint64_t seed = 1234;
  // Model.lora: LoRA adapters over frozen weights (rank 0: none).
  GptLoraConfig lora;

  int ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int head_size() const { return hidden_size / num_attention_heads; }
  bool dropout() const { return hidden_dropout_prob > 0.0f || attention_probs_dropout_prob > 0.0f; }
  // InvalidArgument naming the key (Model.<key>) for a non-positive size,
  // heads not dividing hidden_size, initializer_range <= 0, a dropout
  // probability outside [0, 1), or LoRA with a negative rank, alpha <= 0 or
  // no target.
  Status Validate() const;
};

// ---- parameters ----------------------------------------------------------------------

// The tensors of the model, in arena order:
//   wte [V, C], wpe [maxT, C],
//   per layer l: h.l.ln_1.weight [C], h.l.ln_1.bias [C],
//                h.l.attn.qkv.weight [3C, C], h.l.attn.qkv.bias [3C],
//                h.l.attn.proj.weight [C, C], h.l.attn.proj.bias [C],
//                h.l.ln_2.weight [C], h.l.ln_2.bias [C],
//                h.l.mlp.fc.weight [F, C], h.l.mlp.fc.bias [F],
//                h.l.mlp.proj.weight [C, F], h.l.mlp.proj.bias [C],
//   ln_f.weight [C], ln_f.bias [C].
// A block's tensors are contiguous, so backward finishes whole ranges of the
// table from the last tensor to the first (what DataParallel's buckets want).
enum class GptTensor {
  kWte,
  kWpe,
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kLnfW,
  kLnfB,
};
inline constexpr int kGptTensorsPerBlock = 12;

// Calls fn(GptTensor, layer, rows, cols) for every tensor in arena order
// (layer -1 outside the blocks; cols 0 for vectors). Allocates nothing.
template <typename Fn>
void ForEachGptTensor(const GptConfig& c, Fn&& fn) {
  const int64_t V = c.vocab_size, P = c.max_position_embeddings, C = c.hidden_size, F = c.ffn();
  fn(GptTensor::kWte, -1, V, C);
  fn(GptTensor::kWpe, -1, P, C);
  for (int l = 0; l < c.num_layers; ++l) {
    fn(GptTensor::kLn1W, l, C, 0);
    fn(GptTensor::kLn1B, l, C, 0);
    fn(GptTensor::kQkvW, l, 3 * C, C);
    fn(GptTensor::kQkvB, l, 3 * C, 0);
    fn(GptTensor::kProjW, l, C, C);
    fn(GptTensor::kProjB, l, C, 0);
    fn(GptTensor::kLn2W, l, C, 0);
    fn(GptTensor::kLn2B, l, C, 0);
    fn(GptTensor::kFcW, l, F, C);
    fn(GptTensor::kFcB, l, F, 0);
    fn(GptTensor::kFcProjW, l, C, F);
    fn(GptTensor::kFcProjB, l, C, 0);
  }
  fn(GptTensor::kLnfW, -1, C, 0);
  fn(GptTensor::kLnfB, -1, C, 0);
}

// "wte", "h.3.attn.qkv.weight", "ln_f.bias", ...
std::string GptTensorName(GptTensor tensor, int layer);
ParamTable GptParamTable(const GptConfig& config);

// The part of the model one pipeline stage computes (Megatron's pipeline
// parallelism, collective/gpt_pipeline.h): blocks [first_layer, end_layer);
// the first stage also the embeddings (wte, wpe), the last ln_f and the
// output head, for which it keeps its own copy of the tied wte (the two
// copies stay equal: their gradients are summed between the two stages).
// The whole model is one stage holding everything, wte once.
struct GptStage {
  int first_layer = 0;
  int end_layer = 0;
  bool embedding = true;  // the first stage: wte, wpe
  bool head = true;       // the last stage: ln_f, the head (and wte, if not the first too)
  int layers() const { return end_layer - first_layer; }
  // The head's own copy of wte (a last stage that is not also the first).
  bool wte_copy() const { return head && !embedding; }
  bool operator==(const GptStage&) const = default;
};
GptStage GptWholeStage(const GptConfig& config);
// Stage `index` of `degree` (Distributed.pp_degree): L / degree consecutive
// blocks each. InvalidArgument naming Distributed.pp_degree unless degree
// divides Model.num_layers.
Result<GptStage> GptPipelineStage(const GptConfig& config, int degree, int index);

// Calls fn(GptTensor, layer, rows, cols, whole_index, whole_offset) for the
// tensors of `stage` in its arena's order (ForEachGptTensor's, the head's
// wte copy last): whole_index and whole_offset place each in the whole
// table (GptParamTable; the copy is wte's, 0 and 0).
template <typename Fn>
void ForEachStageTensor(const GptConfig& c, const GptStage& stage, Fn&& fn) {
  size_t index = 0, offset = 0;
  ForEachGptTensor(c, [&](GptTensor t, int layer, int64_t rows, int64_t cols) {
    const bool held = layer >= 0 ? layer >= stage.first_layer && layer < stage.end_layer
                      : t == GptTensor::kWte || t == GptTensor::kWpe ? stage.embedding
                                                                     : stage.head;
    if (held) fn(t, layer, rows, cols, index, offset);
    ++index;
    offset += static_cast<size_t>(rows * (cols ? cols : 1));
  });
  if (stage.wte_copy())
    fn(GptTensor::kWte, -1, int64_t{c.vocab_size}, int64_t{c.hidden_size}, 0, 0);
}
// The arena table of a stage's model.
ParamTable GptParamTable(const GptConfig& config, const GptStage& stage);
// Number of parameters (the tied wte counted once). Allocates nothing.
// GPT-2 small (V 50257, maxT 1024, C 768, L 12): 124,439,808.
int64_t GptParamCount(const GptConfig& config);

// ---- activations ---------------------------------------------------------------------

// Every activation buffer of a forward + backward of B x T tokens, as floats,
// in one layout shared by GptModel (which allocates it) and GptPlan (which
// only sums it). N = B T.
//   kept from forward to backward:
//     residual  [L + 1, N, C]   each block's input; the last is ln_f's input
//     per block (L copies, or 1 reused workspace with recompute):
//       ln1 [N, C], ln1_mean [N], ln1_rstd [N], qkv [N, 3C],
//       att [AttentionSavedFloats(B, T, NH)], atty [N, C], residual2 [N, C],
//       ln2 [N, C], ln2_mean [N], ln2_rstd [N], fch [N, F], fch_gelu [N, F]
//     head: lnf [N, C], lnf_mean [N], lnf_rstd [N], logits [N, V] (the
//       gradient in place after Forward), ce_row_max [N], ce_sums [2 N]
//       (tensor parallel only), losses [N]
//   backward only (one copy, reused by every block):
//     dresidual [N, C], dbuf_c [N, C], dqkv [N, 3C], dbuf_f [N, F],
//     att_scratch [AttentionScratchFloats(B, T, NH)],
//     lora_scratch [2 N r] (LoRA rank r: x A^T and its gradient, which
//       forward uses too; recomputed in backward rather than kept)
//     drop_scratch [N, C] (hidden dropout only: a projection's output before
//       its dropout, in forward; the gradient through the dropout, in backward)
// With tensor parallelism over M ranks, the layout of one rank: 3C, the
// attention's C (att, atty), F and V become 3C/M, C/M, F/M and ceil(V/M),
// and attention's buffers are the twin's for NH/M heads.
enum class GptAct {
  kResidual,
  kLn1,
  kLn1Mean,
  kLn1Rstd,
  kQkv,
  kAtt,
  kAtty,
  kResidual2,
  kLn2,
  kLn2Mean,
  kLn2Rstd,
  kFch,
  kFchGelu,
  kLnf,
  kLnfMean,
  kLnfRstd,
  kLogits,
  kCeRowMax,
  kCeSums,
  kLosses,
  kDResidual,
  kDBufC,
  kDQkv,
  kDBufF,
  kAttScratch,
  kLoraScratch,
  kDropScratch,
  kCount,
};

// A pipeline stage's layout (`stage`, default the whole model) holds its
// blocks (residual [layers + 1, N, C]) and, on the last stage only, the
// head's buffers (lnf ... losses).
class GptActivationLayout {
 public:
  // att_saved / att_scratch: the twin's AttentionSavedFloats(B, T, NH / M)
  // and AttentionScratchFloats(B, T, NH / M); mp_degree M (see above).
  GptActivationLayout(const GptConfig& config, int B, int T, bool recompute, size_t att_saved,
                      size_t att_scratch, int mp_degree = 1, const GptStage* stage = nullptr);
  GptActivationLayout() = default;

  static std::string_view Name(GptAct a);
  // Floats of one copy, number of copies, and offset of copy 0 of buffer a.
  size_t floats(GptAct a) const { return floats_[Index(a)]; }
  int copies(GptAct a) const { return copies_[Index(a)]; }
  size_t offset(GptAct a, int copy = 0) const { return offsets_[Index(a)] + copy * floats(a); }
  // Buffers kept from forward to backward, the backward-only ones, and all.
  size_t saved_floats() const { return saved_floats_; }
  size_t backward_floats() const { return total_floats_ - saved_floats_; }
  size_t total_floats() const { return total_floats_; }

 private:
  static size_t Index(GptAct a) { return static_cast<size_t>(a); }
  static constexpr size_t kCount = static_cast<size_t>(GptAct::kCount);
  std::array<size_t, kCount> floats_{};
  std::array<int, kCount> copies_{};
  std::array<size_t, kCount> offsets_{};
  size_t saved_floats_ = 0;
  size_t total_floats_ = 0;
};

// ---- timing by layer kind ------------------------------------------------------------

enum class GptLayerKind {
  kEmbedding,
  kLayerNorm,
  kMatmul,
  kAttention,
  kGelu,
  kDropout,
  kClassifier,
  kMemory,
  kCount,
};

// Wall time of the model's kernel calls by kind (kMemory: copies and
// zeroing). On an asynchronous device (CUDA) these are launch times unless
// the twin synchronises; on CPU they are the kernels' times.
struct GptProfile {
  static constexpr size_t kKinds = static_cast<size_t>(GptLayerKind::kCount);
  std::array<double, kKinds> seconds{};
  static std::string_view Name(GptLayerKind kind);
  double total() const;
  void Reset() { seconds.fill(0.0); }
};

// ---- the model -----------------------------------------------------------------------

// The dropout sites of the model: its key's `site` is
// GptDropoutSiteIndex(layer, site) (the embeddings' is 0).
enum class GptDropoutSite { kAttentionProbs, kAttentionOutput, kMlpOutput };
uint32_t GptDropoutSiteIndex(int layer, GptDropoutSite site);
inline constexpr uint32_t kGptEmbeddingDropoutSite = 0;
// The key of step `step`'s dropout masks in a run seeded `seed`.
uint64_t GptDropoutStepSeed(uint64_t seed, int64_t step);

struct GptForwardOptions {
  // Compute the logits' gradient in place (the fused cross-entropy) so that
  // Backward can follow. False for evaluation: Backward may then not be
  // called, and the pass costs no gradient work (and no dropout).
  bool for_backward = true;
  // Backward produces the gradient of grad_scale * loss. 1/k for k
  // micro-batches of gradient accumulation; the loss scale of fp16 training.
  float grad_scale = 1.0f;
  // Which of set_activation_slots()'s activation sets the pass uses (its
  // Backward then names it too): a pipeline stage keeps the activations of
  // several micro-batches between their forward and backward.
  int slot = 0;
  // Dropout of a training pass, when the config has any: the step's key
  // (GptDropoutStepSeed) and each sequence's stream ([B]: its sample's id,
  // the same on every rank that computes it).
  uint64_t dropout_seed = 0;
  std::span<const uint32_t> dropout_streams = {};
};

class GptModel {
 public:
  // InvalidArgument for a bad config (config.Validate()), and for LoRA with
  // tensor parallelism. `backend` allocates
  // the arena and activations and `kernels` computes; both not owned, must
  // outlive the model, and must be on the same device (InvalidArgument
  // otherwise). Parameters are initialised from config.seed (a tensor-parallel
  // shard with the values of the whole model's rows and columns it holds).
  // `tensor_parallel` (not owned, outlives the model; null: the whole model
  // on this rank) splits the model over its group. `stage` (null: the whole
  // model) makes this a pipeline stage's model (GptStage; the tensor split
  // must be of the same stage); InvalidArgument for a stage with LoRA.
  static Result<std::unique_ptr<GptModel>> Create(const GptConfig& config, Backend* backend,
                                                  GptKernels* kernels,
                                                  GptTensorParallel* tensor_parallel = nullptr,
                                                  const GptStage* stage = nullptr);

  ~GptModel();

  const GptConfig& config() const { return config_; }
  // The model's weights (GptParamTable). With LoRA (config.lora) they are
  // frozen: the arena has no gradients (has_grads() false) and Backward
  // computes none for them.
  ParamArena& arena() { return arena_; }
  const ParamArena& arena() const { return arena_; }
  // LoRA's adapters (GptLoraParamTable, with gradients); null without LoRA.
  GptLoraAdapters* lora() const { return lora_.get(); }
  // What trains: the adapters with LoRA, else arena(). Backward's
  // on_grads_ready ranges are tensors of this arena.
  ParamArena& trainable_arena();
  Backend* backend() const { return backend_; }
  GptKernels* kernels() const { return kernels_; }
  GptTensorParallel* tensor_parallel() const { return tp_; }
  // OK, or the first failed collective call of tensor parallelism (the
  // passes since are garbage). Check after Forward and Backward.
  Status comm_status() const;

  // tokens, targets: host int32 [B, T]; T <= max_position_embeddings; tokens
  // in [0, vocab_size); targets in [0, vocab_size), or -1 for a position
  // without a target (e.g. padding). Returns the mean loss over positions
  // with a target (0 on a pipeline stage without the head, where targets
  // may be all -1). InvalidArgument (nothing changed) for B or T out of range,
  // a size mismatch, an id out of range (naming its position and value), no
  // position with a target, or a training pass of a model with dropout
  // without B dropout streams. Activation buffers grow to the largest B and
  // T seen and are kept.
  Result<float> Forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, int B,
                        int T, const GptForwardOptions& options = {});
  // Adds d(grad_scale * loss)/d(params) into arena().grads(). Calls
  // on_grads_ready(first, end) as table tensors [first, end) become final,
  // last tensors first. REQUIRES: a Forward with for_backward of `slot`
  // since its last Backward (CHECK).
  void Backward(const GradReadyFn& on_grads_ready = {}, int slot = 0);

  // ---- pipeline stages ----
  const GptStage& stage() const { return stage_; }
  // Keeps the activations of `slots` passes at once (Forward's
  // options.slot); frees the current buffers. >= 1; default 1.
  void set_activation_slots(int slots);
  int activation_slots() const { return slots_; }
  // Sizes the activations for B x T now (Forward would): the buffers below
  // exist from then on.
  void PrepareActivations(int B, int T) { EnsureActivations(B, T); }
  // [B, T, C] on the device. A stage without the embeddings reads its input
  // (the previous stage's output) from StageInput(slot), which the caller
  // fills before Forward; a stage without the head leaves its output in
  // StageOutput(slot). Backward of a stage without the head starts from the
  // gradient of its output, which the caller puts in OutputGrad() (shared by
  // the slots); after Backward of a stage without the embeddings,
  // InputGrad() holds the gradient of its input (until the next Backward).
  float* StageInput(int slot);
  float* StageOutput(int slot);
  float* OutputGrad();
  float* InputGrad();
  // The tensor index of wte in arena(): the embeddings', or the head's copy
  // (GptStage::wte_copy); -1 when the stage holds neither.
  int wte_index() const { return wte_index_; }

  // Logits at position T - 1 of each sequence (the next-token scores
  // generation samples from), host [B, V]. Same errors as Forward for
  // tokens. Clobbers the activations of the last Forward (call Backward
  // first).
  Result<std::vector<float>> LastLogits(std::span<const int32_t> tokens, int B, int T);

  // Bytes of activation buffers allocated now (0 before the first Forward):
  // the kept buffers once per slot, the backward ones once.
  size_t activation_bytes() const {
    return (layout_.saved_floats() * slots_ + layout_.backward_floats()) * sizeof(float);
  }
  const GptActivationLayout& layout() const { return layout_; }

  // Accumulates kernel times into `profile` (not owned; null = off).
  void set_profile(GptProfile* profile) { profile_ = profile; }

  // The units of the parameter table the hooks are called with, in table
  // order: the embeddings, block 0 .. L-1, ln_f.
  std::vector<TensorRange> ParamUnits() const;
  // Calls `hooks` (not owned; must outlive its use; null: the parameters are
  // always in the arena) around every use of a unit's parameters (see the
  // top of this file).
  void set_param_hooks(ParamUseHooks* hooks) { hooks_ = hooks; }

 private:
  // Views of one block's parameter (or gradient) tensors.
  struct BlockTensors {
    float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  // Views of one block's activation buffers.
  struct BlockActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu;
  };

  GptModel(const GptConfig& config, Backend* backend, GptKernels* kernels, ParamArena arena,
           GptTensorParallel* tp, std::unique_ptr<GptLoraAdapters> lora, const GptStage& stage);
  // The targeted matmul's LoRA term: out [N, OC] += its adapter of inp
  // [N, IC] (nothing when the target is not adapted).
  void LoraForward(int layer, LoraTarget target, const float* inp, float* out, int N);
  // Its backward: the adapters' gradients, and dinp [N, IC] += its share.
  void LoraBackward(int layer, LoraTarget target, const float* dout, const float* inp, float* dinp,
                    int N);
  Status CheckIds(std::span<const int32_t> ids, int lo, std::string_view what) const;
  // Checks shapes and ids (targets may be empty); changes nothing.
  Status ValidateInputs(std::span<const int32_t> tokens, std::span<const int32_t> targets, int B,
                        int T) const;
  // Sizes the activations for B x T and copies the ids (and the dropout
  // streams, may be empty) to the device.
  void LoadInputs(std::span<const int32_t> tokens, std::span<const int32_t> targets, int B, int T,
                  std::span<const uint32_t> streams);
  void EnsureActivations(int B, int T);
  float* Act(GptAct a, int copy = 0) const;
  // The slot's ids: int32 tokens [cap], targets [cap], uint32 streams [cap_b_].
  int32_t* SlotIds(int slot) const;
  BlockTensors Block(float* base, int layer) const;
  BlockActs BlockBuffers(int layer) const;
  // Runs block `layer` on x [N, C] into its buffers and writes its output
  // into y [N, C]; y == nullptr skips the last matmul (recompute needs only
  // the activations).
  void BlockForward(int layer, const float* x, float* y);
  void BlockBackward(int layer, const float* x, float* dres);
  // out [N, C] = `residual` plus the dropout of the row-parallel projection
  // of inp [N, IC] plus bias (and LoRA's term for `target`), over the
  // tensor-parallel group (one rank: the plain matmul).
  void ProjectionForward(int layer, LoraTarget target, GptDropoutSite site, float* out,
                         const float* residual, const float* inp, const float* weight,
                         const float* bias, int IC);
  // Its backward from the residual stream's gradient dres [N, C]: the
  // weight, bias and LoRA gradients and dinp [N, IC] += the input's.
  void ProjectionBackward(int layer, LoraTarget target, GptDropoutSite site, const float* dres,
                          const float* inp, const float* weight, float* dweight, float* dbias,
                          float* dinp, int IC);
  // The dropout of a site in the current pass (p 0: off).
  DropoutSpec Dropout(uint32_t site, float p, int head_offset = 0) const;
  bool hidden_dropout() const { return dropout_on_ && config_.hidden_dropout_prob > 0.0f; }
  // The tensor-parallel sum of an input gradient before a LayerNorm's backward.
  void AllReduceInputGrad(float* dinp, size_t n);
  // losses [N] (and the logits' gradient in place) of the logits [N, V_rank].
  void CrossEntropy(float* losses, float* logits, const int32_t* targets, int N, float dloss,
                    bool write_dlogits);
  // This rank's widths: q, k, v and attention output (C / M), heads, MLP, vocabulary rows.
  int AttnWidth() const;
  int Heads() const;
  int FfnWidth() const;
  int VocabRows() const;
  // Forward up to ln_f (residual stream, blocks, final LayerNorm), leaving
  // the embeddings and ln_f acquired; `then_backward`: the next unit after
  // ln_f is block L-1's backward.
  void ForwardTrunk(bool then_backward);
  TensorRange EmbeddingUnit() const { return {0, 2}; }
  TensorRange BlockUnit(int layer) const;
  // ln_f (with the head's wte copy after it on a last stage).
  TensorRange LnfUnit() const;
  // Local index of layer's residual stream (its input) in this stage.
  int Local(int layer) const { return layer - stage_.first_layer; }
  void Acquire(TensorRange unit, TensorRange next) {
    if (hooks_ != nullptr) hooks_->Acquire(unit, next);
  }
  void Release(TensorRange unit) {
    if (hooks_ != nullptr) hooks_->Release(unit);
  }
  template <typename Fn>
  void Timed(GptLayerKind kind, Fn&& fn);

  // Fixed after construction.
  const GptConfig config_;
  Backend* const backend_;
  GptKernels* const kernels_;
  GptTensorParallel* const tp_;  // null: not split
  ParamArena arena_;
  const std::unique_ptr<GptLoraAdapters> lora_;  // null: no LoRA
  const GptStage stage_;
  std::vector<size_t> block_offset_;  // arena offset of each of the stage's blocks' first tensor
  size_t first_block_tensor_ = 0;     // arena index of the stage's first block tensor
  size_t lnf_offset_ = 0;             // the head stage's
  int wte_index_ = -1;

  // Activations, sized for the largest B and T seen (cap_b_, cap_t_): the
  // kept buffers per slot, then the backward ones once.
  int cap_b_ = 0, cap_t_ = 0;
  int slots_ = 1;
  GptActivationLayout layout_;
  std::shared_ptr<float> acts_;
  // Per slot: int32 tokens [cap], targets [cap]; uint32 streams [cap_b_].
  std::shared_ptr<void> ids_;
  int B_ = 0, T_ = 0;  // shape of the last Forward
  // What each slot's Forward left for its Backward.
  struct SlotState {
    bool backward_ready = false;
    bool dropout_on = false;  // the pass's dropout and its key
    uint64_t dropout_seed = 0;
  };
  std::vector<SlotState> slot_state_ = std::vector<SlotState>(1);
  int slot_ = 0;  // the slot the running pass uses
  // The running pass's dropout (its slot's).
  bool dropout_on_ = false;
  uint64_t dropout_seed_ = 0;

  GptProfile* profile_ = nullptr;
  ParamUseHooks* hooks_ = nullptr;
};

}  // namespace fleet::trainer
