#include "trainer/models/gpt.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>

#include "comm/splitmix.h"
#include "trainer/models/gpt_lora.h"
#include "trainer/models/gpt_tensor_parallel.h"

namespace fleet::trainer {

namespace {

// Each buffer of the activation layout starts on a 64-byte boundary.
constexpr size_t kActAlignFloats = 16;

Status CheckPositive(int value, std::string_view key) {
  if (value > 0) return Status::OK();
  return Status::InvalidArgument("must be > 0, got " + std::to_string(value), key);
}

}  // namespace

// ---- config and parameter table ---------------------------------------------------------

Status GptConfig::Validate() const {
  FLEET_RETURN_IF_ERROR(CheckPositive(vocab_size, "Model.vocab_size"));
  FLEET_RETURN_IF_ERROR(CheckPositive(hidden_size, "Model.hidden_size"));
  FLEET_RETURN_IF_ERROR(CheckPositive(num_layers, "Model.num_layers"));
  FLEET_RETURN_IF_ERROR(CheckPositive(num_attention_heads, "Model.num_attention_heads"));
  FLEET_RETURN_IF_ERROR(CheckPositive(max_position_embeddings, "Model.max_position_embeddings"));
  if (ffn_hidden_size < 0) {
    return Status::InvalidArgument(
        "must be >= 0 (0 = 4 * hidden_size), got " + std::to_string(ffn_hidden_size),
        "Model.ffn_hidden_size");
  }
  if (hidden_size % num_attention_heads != 0) {
    return Status::InvalidArgument("must divide Model.hidden_size (" + std::to_string(hidden_size) +
                                       "), got " + std::to_string(num_attention_heads),
                                   "Model.num_attention_heads");
  }
  if (!(initializer_range > 0.0f) || !std::isfinite(initializer_range)) {
    return Status::InvalidArgument(
        "must be a finite value > 0, got " + std::to_string(initializer_range),
        "Model.initializer_range");
  }
  for (const auto& [p, key] :
       {std::pair{hidden_dropout_prob, "Model.hidden_dropout_prob"},
        std::pair{attention_probs_dropout_prob, "Model.attention_probs_dropout_prob"}}) {
    if (!(p >= 0.0f && p < 1.0f)) {
      return Status::InvalidArgument("must be in [0, 1), got " + std::to_string(p), key);
    }
  }
  if (lora.rank < 0) {
    return Status::InvalidArgument("must be >= 1, got " + std::to_string(lora.rank),
                                   "Model.lora.rank");
  }
  if (lora.enabled() && !(lora.alpha > 0.0f && std::isfinite(lora.alpha))) {
    return Status::InvalidArgument("must be a finite value > 0, got " + std::to_string(lora.alpha),
                                   "Model.lora.alpha");
  }
  if (lora.enabled() && std::find(lora.targets.begin(), lora.targets.end(), true) ==
                            lora.targets.end()) {
    return Status::InvalidArgument("must name at least one of qkv, proj, fc, fc_proj",
                                   "Model.lora.targets");
  }
  return Status::OK();
}

std::string GptTensorName(GptTensor tensor, int layer) {
  const std::string block = "h." + std::to_string(layer) + ".";
  switch (tensor) {
    case GptTensor::kWte:
      return "wte";
    case GptTensor::kWpe:
      return "wpe";
    case GptTensor::kLn1W:
      return block + "ln_1.weight";
    case GptTensor::kLn1B:
      return block + "ln_1.bias";
    case GptTensor::kQkvW:
      return block + "attn.qkv.weight";
    case GptTensor::kQkvB:
      return block + "attn.qkv.bias";
    case GptTensor::kProjW:
      return block + "attn.proj.weight";
    case GptTensor::kProjB:
      return block + "attn.proj.bias";
    case GptTensor::kLn2W:
      return block + "ln_2.weight";
    case GptTensor::kLn2B:
      return block + "ln_2.bias";
    case GptTensor::kFcW:
      return block + "mlp.fc.weight";
    case GptTensor::kFcB:
      return block + "mlp.fc.bias";
    case GptTensor::kFcProjW:
      return block + "mlp.proj.weight";
    case GptTensor::kFcProjB:
      return block + "mlp.proj.bias";
    case GptTensor::kLnfW:
      return "ln_f.weight";
    case GptTensor::kLnfB:
      return "ln_f.bias";
  }
  LOG(FATAL) << "unknown GptTensor " << static_cast<int>(tensor);
}

ParamTable GptParamTable(const GptConfig& config) {
  ParamTable table;
  ForEachGptTensor(config, [&](GptTensor t, int layer, int64_t rows, int64_t cols) {
    table.push_back({GptTensorName(t, layer), cols ? Shape{rows, cols} : Shape{rows}});
  });
  return table;
}

ParamTable GptParamTable(const GptConfig& config, const GptStage& stage) {
  ParamTable table;
  ForEachStageTensor(
      config, stage, [&](GptTensor t, int layer, int64_t rows, int64_t cols, size_t, size_t) {
        table.push_back({GptTensorName(t, layer), cols ? Shape{rows, cols} : Shape{rows}});
      });
  return table;
}

GptStage GptWholeStage(const GptConfig& config) {
  return GptStage{0, config.num_layers, true, true};
}

Result<GptStage> GptPipelineStage(const GptConfig& config, int degree, int index) {
  if (degree < 1 || config.num_layers % degree != 0) {
    return Status::InvalidArgument("must divide Model.num_layers (" +
                                       std::to_string(config.num_layers) + "), got " +
                                       std::to_string(degree),
                                   "Distributed.pp_degree");
  }
  CHECK(index >= 0 && index < degree) << index << " of " << degree;
  const int per = config.num_layers / degree;
  return GptStage{index * per, (index + 1) * per, index == 0, index == degree - 1};
}

int64_t GptParamCount(const GptConfig& config) {
  int64_t n = 0;
  ForEachGptTensor(
      config, [&](GptTensor, int, int64_t rows, int64_t cols) { n += rows * (cols ? cols : 1); });
  return n;
}

// ---- activation layout ------------------------------------------------------------------

GptActivationLayout::GptActivationLayout(const GptConfig& c, int B, int T, bool recompute,
                                         size_t att_saved, size_t att_scratch, int mp_degree,
                                         const GptStage* stage) {
  const size_t M = mp_degree;
  const size_t N = size_t(B) * T, C = c.hidden_size, F = c.ffn() / M;
  const size_t V = (size_t(c.vocab_size) + M - 1) / M, Ca = C / M;  // this rank's widths
  const int L = stage ? stage->layers() : c.num_layers;
  const int head = !stage || stage->head ? 1 : 0;
  const int block_copies = recompute ? 1 : L;
  auto set = [&](GptAct a, size_t floats, int copies) {
    floats_[Index(a)] = floats;
    copies_[Index(a)] = copies;
  };
  set(GptAct::kResidual, N * C, L + 1);
  set(GptAct::kLn1, N * C, block_copies);
  set(GptAct::kLn1Mean, N, block_copies);
  set(GptAct::kLn1Rstd, N, block_copies);
  set(GptAct::kQkv, N * 3 * Ca, block_copies);
  set(GptAct::kAtt, att_saved, block_copies);
  set(GptAct::kAtty, N * Ca, block_copies);
  set(GptAct::kResidual2, N * C, block_copies);
  set(GptAct::kLn2, N * C, block_copies);
  set(GptAct::kLn2Mean, N, block_copies);
  set(GptAct::kLn2Rstd, N, block_copies);
  set(GptAct::kFch, N * F, block_copies);
  set(GptAct::kFchGelu, N * F, block_copies);
  set(GptAct::kLnf, N * C, head);
  set(GptAct::kLnfMean, N, head);
  set(GptAct::kLnfRstd, N, head);
  set(GptAct::kLogits, N * V, head);
  set(GptAct::kCeRowMax, N, M > 1 ? head : 0);
  set(GptAct::kCeSums, 2 * N, M > 1 ? head : 0);
  set(GptAct::kLosses, N, head);
  set(GptAct::kDResidual, N * C, 1);
  set(GptAct::kDBufC, N * C, 1);
  set(GptAct::kDQkv, N * 3 * Ca, 1);
  set(GptAct::kDBufF, N * F, 1);
  set(GptAct::kAttScratch, att_scratch, 1);
  set(GptAct::kLoraScratch, 2 * N * size_t(c.lora.rank), 1);
  set(GptAct::kDropScratch, N * C, c.hidden_dropout_prob > 0.0f ? 1 : 0);
  size_t end = 0;
  for (size_t i = 0; i < kCount; ++i) {
    // Round every copy up to the alignment so that copy k starts aligned too.
    floats_[i] = (floats_[i] + kActAlignFloats - 1) / kActAlignFloats * kActAlignFloats;
    offsets_[i] = end;
    end += floats_[i] * copies_[i];
    if (static_cast<GptAct>(i) == GptAct::kLosses) saved_floats_ = end;
  }
  total_floats_ = end;
}

std::string_view GptActivationLayout::Name(GptAct a) {
  static constexpr std::array<std::string_view, kCount> kNames = {
      "residual",    "ln1",          "ln1_mean",    "ln1_rstd", "qkv",      "att",
      "atty",        "residual2",    "ln2",         "ln2_mean", "ln2_rstd", "fch",
      "fch_gelu",    "lnf",          "lnf_mean",    "lnf_rstd", "logits",   "ce_row_max",
      "ce_sums",     "losses",       "dresidual",   "dbuf_c",   "dqkv",     "dbuf_f",
      "att_scratch", "lora_scratch", "drop_scratch"};
  return kNames[Index(a)];
}

// ---- dropout keys -----------------------------------------------------------------------

uint32_t GptDropoutSiteIndex(int layer, GptDropoutSite site) {
  return 1 + 3 * static_cast<uint32_t>(layer) + static_cast<uint32_t>(site);
}

uint64_t GptDropoutStepSeed(uint64_t seed, int64_t step) {
  return Mix64(Mix64(seed ^ 0x64726f706f7574ULL) + static_cast<uint64_t>(step));
}

// ---- profile ----------------------------------------------------------------------------

std::string_view GptProfile::Name(GptLayerKind kind) {
  static constexpr std::array<std::string_view, kKinds> kNames = {
      "embedding", "layernorm", "matmul", "attention", "gelu", "dropout", "classifier", "memory"};
  return kNames[static_cast<size_t>(kind)];
}

double GptProfile::total() const {
  double t = 0.0;
  for (double s : seconds) t += s;
  return t;
}

// ---- model ------------------------------------------------------------------------------

namespace {

// GPT-2's initialisation of one tensor, from its own random stream (so a
// tensor's values depend only on the seed and its index in the table).
void InitTensor(GptTensor kind, const GptConfig& c, uint64_t seed, size_t index,
                std::span<float> out) {
  switch (kind) {
    case GptTensor::kLn1W:
    case GptTensor::kLn2W:
    case GptTensor::kLnfW:
      std::fill(out.begin(), out.end(), 1.0f);
      return;
    case GptTensor::kWte:
    case GptTensor::kWpe:
    case GptTensor::kQkvW:
    case GptTensor::kProjW:
    case GptTensor::kFcW:
    case GptTensor::kFcProjW:
      break;
    default:  // biases
      std::fill(out.begin(), out.end(), 0.0f);
      return;
  }
  // The residual projections scaled by 1/sqrt(2 L) (GPT-2 paper, section 2.3).
  double std_dev = c.initializer_range;
  if (kind == GptTensor::kProjW || kind == GptTensor::kFcProjW) {
    std_dev /= std::sqrt(2.0 * c.num_layers);
  }
  SplitMix64 rng(Mix64(seed) ^ Mix64(0x6770742d696e6974ULL + index));
  // Box-Muller: two normals from two uniforms (u1 in (0, 1]).
  for (size_t i = 0; i < out.size(); i += 2) {
    const double u1 = 1.0 - rng.UniformDouble();
    const double u2 = rng.UniformDouble();
    const double r = std::sqrt(-2.0 * std::log(u1)) * std_dev;
    out[i] = static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2));
    if (i + 1 < out.size())
      out[i + 1] = static_cast<float>(r * std::sin(2.0 * std::numbers::pi * u2));
  }
}

}  // namespace

Result<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, Backend* backend,
                                                   GptKernels* kernels,
                                                   GptTensorParallel* tensor_parallel,
                                                   const GptStage* stage_or_null) {
  CHECK(backend != nullptr);
  CHECK(kernels != nullptr);
  FLEET_RETURN_IF_ERROR(config.Validate());
  const GptStage stage = stage_or_null ? *stage_or_null : GptWholeStage(config);
  CHECK(tensor_parallel == nullptr || tensor_parallel->stage() == stage)
      << "the tensor split is of another pipeline stage";
  const bool lora = config.lora.enabled();
  if (lora && tensor_parallel != nullptr && tensor_parallel->degree() > 1) {
    return Status::InvalidArgument("LoRA does not split over tensor-parallel ranks; use "
                                   "Distributed.mp_degree 1",
                                   "Model.lora");
  }
  if (lora && !(stage == GptWholeStage(config))) {
    return Status::InvalidArgument(
        "LoRA does not split over pipeline stages; use "
        "Distributed.pp_degree 1",
        "Model.lora");
  }
  if (!(backend->device() == kernels->device())) {
    return Status::InvalidArgument("GPT kernels on " + kernels->device().ToString() +
                                       " but memory on " + backend->device().ToString(),
                                   kernels->name());
  }
  FLEET_ASSIGN_OR_RETURN(ParamArena arena,
                         ParamArena::Create(tensor_parallel ? tensor_parallel->ShardTable()
                                                            : GptParamTable(config, stage),
                                            backend, /*with_grads=*/!lora));
  // Initialise tensor by tensor through one host buffer of the largest size,
  // each from the whole table's index (the head's wte copy as wte); a
  // tensor-parallel shard takes its segments of each whole tensor.
  const std::vector<ArenaSegment>* segments =
      tensor_parallel ? &tensor_parallel->split().mine() : nullptr;
  std::vector<float> host, part;
  size_t index = 0, next_segment = 0;
  ForEachStageTensor(
      config, stage,
      [&](GptTensor kind, int, int64_t rows, int64_t cols, size_t whole_index,
          size_t whole_offset) {
        host.resize(static_cast<size_t>(rows * (cols ? cols : 1)));
        InitTensor(kind, config, config.seed, whole_index, host);
        const float* values = host.data();
        Tensor param = arena.param(index);
        if (segments != nullptr) {
          // The arena's segments in order: those of this tensor.
          const size_t end = arena.offset(index) + size_t(param.numel());
          part.clear();
          for (; next_segment < segments->size() && (*segments)[next_segment].local < end;
               ++next_segment) {
            const ArenaSegment& seg = (*segments)[next_segment];
            const float* from = host.data() + (seg.whole - whole_offset);
            part.insert(part.end(), from, from + seg.size);
          }
          values = part.data();
        }
        CHECK_EQ(size_t(param.numel()), segments ? part.size() : host.size());
        backend->CopyFromHost(param.data(), values, size_t(param.numel()) * sizeof(float));
        ++index;
      });
  std::unique_ptr<GptLoraAdapters> adapters;
  if (lora) {
    FLEET_ASSIGN_OR_RETURN(adapters, GptLoraAdapters::Create(config, backend));
  }
  return std::unique_ptr<GptModel>(new GptModel(config, backend, kernels, std::move(arena),
                                                tensor_parallel, std::move(adapters), stage));
}

GptModel::GptModel(const GptConfig& config, Backend* backend, GptKernels* kernels, ParamArena arena,
                   GptTensorParallel* tp, std::unique_ptr<GptLoraAdapters> lora,
                   const GptStage& stage)
    : config_(config),
      backend_(backend),
      kernels_(kernels),
      tp_(tp),
      arena_(std::move(arena)),
      lora_(std::move(lora)),
      stage_(stage) {
  // Tensor indices: [wte, wpe,] the stage's blocks (12 each), [ln_f (2),
  // the head's wte copy].
  first_block_tensor_ = stage_.embedding ? 2 : 0;
  for (int i = 0; i < stage_.layers(); ++i) {
    block_offset_.push_back(arena_.offset(first_block_tensor_ + size_t(i) * kGptTensorsPerBlock));
  }
  const size_t lnf_tensor = first_block_tensor_ + size_t(stage_.layers()) * kGptTensorsPerBlock;
  if (stage_.head) lnf_offset_ = arena_.offset(lnf_tensor);
  wte_index_ = stage_.embedding ? 0 : stage_.wte_copy() ? static_cast<int>(lnf_tensor + 2) : -1;
  slot_state_.assign(1, SlotState{});
}

GptModel::~GptModel() = default;

ParamArena& GptModel::trainable_arena() { return lora_ ? lora_->arena() : arena_; }

void GptModel::LoraForward(int layer, LoraTarget target, const float* inp, float* out, int N) {
  if (lora_ == nullptr) return;
  Timed(GptLayerKind::kMatmul,
        [&] { lora_->Forward(layer, target, inp, out, N, Act(GptAct::kLoraScratch)); });
}

void GptModel::LoraBackward(int layer, LoraTarget target, const float* dout, const float* inp,
                            float* dinp, int N) {
  if (lora_ == nullptr) return;
  float* u = Act(GptAct::kLoraScratch);
  float* du = u + size_t(N) * config_.lora.rank;
  Timed(GptLayerKind::kMatmul, [&] { lora_->Backward(layer, target, dout, inp, dinp, N, u, du); });
}

template <typename Fn>
void GptModel::Timed(GptLayerKind kind, Fn&& fn) {
  if (profile_ == nullptr) {
    fn();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  fn();
  profile_->seconds[static_cast<size_t>(kind)] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Status GptModel::comm_status() const { return tp_ ? tp_->status() : Status::OK(); }

int GptModel::AttnWidth() const { return tp_ ? tp_->attention_width() : config_.hidden_size; }
int GptModel::Heads() const { return tp_ ? tp_->heads() : config_.num_attention_heads; }
int GptModel::FfnWidth() const { return tp_ ? tp_->ffn() : config_.ffn(); }
int GptModel::VocabRows() const { return tp_ ? tp_->vocab_rows() : config_.vocab_size; }

GptModel::BlockTensors GptModel::Block(float* base, int layer) const {
  // This rank's shapes (the whole model's without tensor parallelism).
  const int64_t C = config_.hidden_size, F = FfnWidth(), Ca = AttnWidth();
  float* p = base + block_offset_[Local(layer)];
  BlockTensors t;
  auto take = [&p](int64_t n) {
    float* at = p;
    p += n;
    return at;
  };
  // The order of ForEachGptTensor.
  t.ln1w = take(C);
  t.ln1b = take(C);
  t.qkvw = take(3 * Ca * C);
  t.qkvb = take(3 * Ca);
  t.projw = take(C * Ca);
  t.projb = take(C);
  t.ln2w = take(C);
  t.ln2b = take(C);
  t.fcw = take(F * C);
  t.fcb = take(F);
  t.fcprojw = take(C * F);
  t.fcprojb = take(C);
  return t;
}

float* GptModel::Act(GptAct a, int copy) const {
  DCHECK_LT(copy, layout_.copies(a));
  const size_t offset = layout_.offset(a, copy), saved = layout_.saved_floats();
  // The kept buffers of the running pass's slot, or the shared backward ones.
  return acts_.get() + (offset < saved ? size_t(slot_) * saved + offset
                                       : size_t(slots_) * saved + (offset - saved));
}

int32_t* GptModel::SlotIds(int slot) const {
  return static_cast<int32_t*>(ids_.get()) + size_t(slot) * (2 * size_t(cap_b_) * cap_t_ + cap_b_);
}

void GptModel::set_activation_slots(int slots) {
  CHECK_GE(slots, 1);
  if (slots == slots_) return;
  slots_ = slots;
  slot_state_.assign(slots, SlotState{});
  // Reallocated for the new count at the next pass.
  acts_.reset();
  ids_.reset();
  cap_b_ = cap_t_ = 0;
}

float* GptModel::StageInput(int slot) {
  CHECK(slot >= 0 && slot < slots_ && acts_ != nullptr);
  slot_ = slot;
  return Act(GptAct::kResidual, 0);
}

float* GptModel::StageOutput(int slot) {
  CHECK(slot >= 0 && slot < slots_ && acts_ != nullptr);
  const size_t saved = layout_.saved_floats();
  return acts_.get() + size_t(slot) * saved + layout_.offset(GptAct::kResidual, stage_.layers());
}

float* GptModel::OutputGrad() {
  CHECK(acts_ != nullptr);
  return Act(GptAct::kDResidual);
}

float* GptModel::InputGrad() {
  CHECK(acts_ != nullptr);
  return Act(GptAct::kDResidual);
}

GptModel::BlockActs GptModel::BlockBuffers(int layer) const {
  const int copy = config_.use_recompute ? 0 : Local(layer);
  return BlockActs{
      Act(GptAct::kLn1, copy),       Act(GptAct::kLn1Mean, copy), Act(GptAct::kLn1Rstd, copy),
      Act(GptAct::kQkv, copy),       Act(GptAct::kAtt, copy),     Act(GptAct::kAtty, copy),
      Act(GptAct::kResidual2, copy), Act(GptAct::kLn2, copy),     Act(GptAct::kLn2Mean, copy),
      Act(GptAct::kLn2Rstd, copy),   Act(GptAct::kFch, copy),     Act(GptAct::kFchGelu, copy)};
}

void GptModel::EnsureActivations(int B, int T) {
  if (B <= cap_b_ && T <= cap_t_) return;
  cap_b_ = std::max(cap_b_, B);
  cap_t_ = std::max(cap_t_, T);
  const int NH = Heads();
  acts_.reset();  // free the old buffers before allocating the larger ones
  ids_.reset();
  layout_ = GptActivationLayout(config_, cap_b_, cap_t_, config_.use_recompute,
                                kernels_->AttentionSavedFloats(cap_b_, cap_t_, NH),
                                kernels_->AttentionScratchFloats(cap_b_, cap_t_, NH),
                                tp_ ? tp_->degree() : 1, &stage_);
  acts_ = backend_->AllocateFloats(layout_.saved_floats() * slots_ + layout_.backward_floats());
  ids_ = backend_->AllocateBytes(size_t(slots_) * (2 * size_t(cap_b_) * cap_t_ + cap_b_) *
                                 sizeof(int32_t));
}

Status GptModel::CheckIds(std::span<const int32_t> ids, int lo, std::string_view what) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < lo || ids[i] >= config_.vocab_size) {
      return Status::InvalidArgument(std::string(what) + " id " + std::to_string(ids[i]) +
                                         " at position " + std::to_string(i) + " is outside [" +
                                         std::to_string(lo) + ", " +
                                         std::to_string(config_.vocab_size) + ")",
                                     "Model.vocab_size");
    }
  }
  return Status::OK();
}

Status GptModel::ValidateInputs(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                int B, int T) const {
  if (B < 1) return Status::InvalidArgument("batch size must be >= 1, got " + std::to_string(B));
  if (T < 1 || T > config_.max_position_embeddings) {
    return Status::InvalidArgument("sequence length " + std::to_string(T) + " outside [1, " +
                                       std::to_string(config_.max_position_embeddings) + "]",
                                   "Model.max_position_embeddings");
  }
  const size_t n = size_t(B) * T;
  if (tokens.size() != n) {
    return Status::InvalidArgument("got " + std::to_string(tokens.size()) +
                                   " tokens for B x T = " + std::to_string(n));
  }
  if (!targets.empty() && targets.size() != n) {
    return Status::InvalidArgument("got " + std::to_string(targets.size()) +
                                   " targets for B x T = " + std::to_string(n));
  }
  FLEET_RETURN_IF_ERROR(CheckIds(tokens, 0, "token"));
  return CheckIds(targets, -1, "target");
}

void GptModel::LoadInputs(std::span<const int32_t> tokens, std::span<const int32_t> targets, int B,
                          int T, std::span<const uint32_t> streams) {
  EnsureActivations(B, T);
  B_ = B;
  T_ = T;
  slot_state_[slot_].backward_ready = false;
  int32_t* ids = SlotIds(slot_);
  const size_t n = size_t(B) * T, cap = size_t(cap_b_) * cap_t_;
  Timed(GptLayerKind::kMemory, [&] {
    backend_->CopyFromHost(ids, tokens.data(), n * sizeof(int32_t));
    if (!targets.empty()) backend_->CopyFromHost(ids + cap, targets.data(), n * sizeof(int32_t));
    if (!streams.empty()) {
      backend_->CopyFromHost(ids + 2 * cap, streams.data(), streams.size() * sizeof(uint32_t));
    }
  });
}

DropoutSpec GptModel::Dropout(uint32_t site, float p, int head_offset) const {
  DropoutSpec d;
  if (!dropout_on_ || p <= 0.0f) return d;
  d.p = p;
  d.seed = dropout_seed_;
  d.site = site;
  d.streams = reinterpret_cast<const uint32_t*>(SlotIds(slot_) + 2 * size_t(cap_b_) * cap_t_);
  d.head_offset = head_offset;
  return d;
}

void GptModel::ProjectionForward(int layer, LoraTarget target, GptDropoutSite site, float* out,
                                 const float* residual, const float* inp, const float* weight,
                                 const float* bias, int IC) {
  const int N = B_ * T_, C = config_.hidden_size;
  GptKernels* k = kernels_;
  // With tensor parallelism only the lead rank adds the residual and the
  // bias; the others contribute their partial product, and the sum is the
  // whole.
  const bool lead = tp_ == nullptr || tp_->lead();
  auto all_reduce = [&](float* x) {
    if (tp_ != nullptr) Timed(GptLayerKind::kMemory, [&] { tp_->AllReduceSum(x, size_t(N) * C); });
  };
  if (!hidden_dropout()) {
    // out = residual + inp weight^T + bias: copy, then accumulate onto it.
    if (lead) {
      Timed(GptLayerKind::kMemory,
            [&] { backend_->CopyOnDevice(out, residual, size_t(N) * C * sizeof(float)); });
    }
    Timed(GptLayerKind::kMatmul, [&] {
      k->MatmulForward(out, inp, weight, lead ? bias : nullptr, N, IC, C, /*accumulate=*/lead);
    });
    LoraForward(layer, target, inp, out, N);
    all_reduce(out);
    return;
  }
  // The projection whole (summed over the group) first, then dropped out
  // onto the residual: every rank draws the same mask.
  float* proj = Act(GptAct::kDropScratch);
  Timed(GptLayerKind::kMatmul,
        [&] { k->MatmulForward(proj, inp, weight, lead ? bias : nullptr, N, IC, C, false); });
  LoraForward(layer, target, inp, proj, N);
  all_reduce(proj);
  const DropoutSpec d = Dropout(GptDropoutSiteIndex(layer, site), config_.hidden_dropout_prob);
  Timed(GptLayerKind::kDropout,
        [&] { k->DropoutForward(out, proj, residual, B_, size_t(T_) * C, d); });
}

void GptModel::ProjectionBackward(int layer, LoraTarget target, GptDropoutSite site,
                                  const float* dres, const float* inp, const float* weight,
                                  float* dweight, float* dbias, float* dinp, int IC) {
  const int N = B_ * T_, C = config_.hidden_size;
  // The residual's gradient flows into the projection unchanged, or through
  // the dropout's mask.
  const float* dproj = dres;
  if (hidden_dropout()) {
    float* d = Act(GptAct::kDropScratch);
    const DropoutSpec spec = Dropout(GptDropoutSiteIndex(layer, site), config_.hidden_dropout_prob);
    Timed(GptLayerKind::kDropout,
          [&] { kernels_->DropoutBackward(d, dres, B_, size_t(T_) * C, spec); });
    dproj = d;
  }
  Timed(GptLayerKind::kMatmul,
        [&] { kernels_->MatmulBackward(dinp, dweight, dbias, dproj, inp, weight, N, IC, C); });
  LoraBackward(layer, target, dproj, inp, dinp, N);
}

void GptModel::AllReduceInputGrad(float* dinp, size_t n) {
  if (tp_ != nullptr) Timed(GptLayerKind::kMemory, [&] { tp_->AllReduceSum(dinp, n); });
}

void GptModel::BlockForward(int layer, const float* x, float* y) {
  const int B = B_, T = T_, N = B * T, C = config_.hidden_size, F = FfnWidth();
  const int NH = Heads(), Ca = AttnWidth();
  const BlockTensors P = Block(arena_.params().data(), layer);
  const BlockActs A = BlockBuffers(layer);
  GptKernels* k = kernels_;
  Timed(GptLayerKind::kLayerNorm,
        [&] { k->LayerNormForward(A.ln1, A.ln1_mean, A.ln1_rstd, x, P.ln1w, P.ln1b, N, C); });
  Timed(GptLayerKind::kMatmul,
        [&] { k->MatmulForward(A.qkv, A.ln1, P.qkvw, P.qkvb, N, C, 3 * Ca, false); });
  LoraForward(layer, LoraTarget::kQkv, A.ln1, A.qkv, N);
  const DropoutSpec att_dropout =
      Dropout(GptDropoutSiteIndex(layer, GptDropoutSite::kAttentionProbs),
              config_.attention_probs_dropout_prob, tp_ ? tp_->rank() * NH : 0);
  Timed(GptLayerKind::kAttention, [&] {
    k->AttentionForward(A.atty, A.att, Act(GptAct::kAttScratch), A.qkv, B, T, Ca, NH, att_dropout);
  });
  ProjectionForward(layer, LoraTarget::kProj, GptDropoutSite::kAttentionOutput, A.res2, x, A.atty,
                    P.projw, P.projb, Ca);
  Timed(GptLayerKind::kLayerNorm,
        [&] { k->LayerNormForward(A.ln2, A.ln2_mean, A.ln2_rstd, A.res2, P.ln2w, P.ln2b, N, C); });
  Timed(GptLayerKind::kMatmul,
        [&] { k->MatmulForward(A.fch, A.ln2, P.fcw, P.fcb, N, C, F, false); });
  LoraForward(layer, LoraTarget::kFc, A.ln2, A.fch, N);
  Timed(GptLayerKind::kGelu, [&] { k->GeluForward(A.fch_gelu, A.fch, size_t(N) * F); });
  if (y == nullptr) return;
  ProjectionForward(layer, LoraTarget::kFcProj, GptDropoutSite::kMlpOutput, y, A.res2, A.fch_gelu,
                    P.fcprojw, P.fcprojb, F);
}

void GptModel::BlockBackward(int layer, const float* x, float* dres) {
  const int B = B_, T = T_, N = B * T, C = config_.hidden_size, F = FfnWidth();
  const int NH = Heads(), Ca = AttnWidth();
  const BlockTensors P = Block(arena_.params().data(), layer);
  // Frozen weights (LoRA) have no gradients: every pointer null, so the
  // kernels compute input gradients only.
  const BlockTensors G =
      arena_.has_grads() ? Block(arena_.grads().data(), layer) : BlockTensors{};
  const BlockActs A = BlockBuffers(layer);
  float* dF = Act(GptAct::kDBufF);
  float* dC = Act(GptAct::kDBufC);
  float* dqkv = Act(GptAct::kDQkv);
  GptKernels* k = kernels_;
  auto zero = [&](float* buf, size_t n) {
    Timed(GptLayerKind::kMemory, [&] { backend_->Fill(buf, n, 0.0f); });
  };
  // MLP: dres flows into the projection (row parallel: unchanged on every
  // rank); GELU in place; fc (column parallel: its input gradient summed
  // over ranks); ln_2 adds to dres.
  zero(dF, size_t(N) * F);
  ProjectionBackward(layer, LoraTarget::kFcProj, GptDropoutSite::kMlpOutput, dres, A.fch_gelu,
                     P.fcprojw, G.fcprojw, G.fcprojb, dF, F);
  Timed(GptLayerKind::kGelu, [&] { k->GeluBackward(dF, A.fch, dF, size_t(N) * F); });
  zero(dC, size_t(N) * C);
  Timed(GptLayerKind::kMatmul,
        [&] { k->MatmulBackward(dC, G.fcw, G.fcb, dF, A.ln2, P.fcw, N, C, F); });
  LoraBackward(layer, LoraTarget::kFc, dF, A.ln2, dC, N);
  AllReduceInputGrad(dC, size_t(N) * C);
  Timed(GptLayerKind::kLayerNorm, [&] {
    k->LayerNormBackward(dres, G.ln2w, G.ln2b, dC, A.res2, P.ln2w, A.ln2_mean, A.ln2_rstd, N, C);
  });
  // Attention: projection, attention, qkv; ln_1 adds to dres.
  zero(dC, size_t(N) * Ca);
  ProjectionBackward(layer, LoraTarget::kProj, GptDropoutSite::kAttentionOutput, dres, A.atty,
                     P.projw, G.projw, G.projb, dC, Ca);
  zero(dqkv, size_t(N) * 3 * Ca);
  const DropoutSpec att_dropout =
      Dropout(GptDropoutSiteIndex(layer, GptDropoutSite::kAttentionProbs),
              config_.attention_probs_dropout_prob, tp_ ? tp_->rank() * NH : 0);
  Timed(GptLayerKind::kAttention, [&] {
    k->AttentionBackward(dqkv, Act(GptAct::kAttScratch), dC, A.qkv, A.atty, A.att, B, T, Ca, NH,
                         att_dropout);
  });
  zero(dC, size_t(N) * C);
  Timed(GptLayerKind::kMatmul,
        [&] { k->MatmulBackward(dC, G.qkvw, G.qkvb, dqkv, A.ln1, P.qkvw, N, C, 3 * Ca); });
  LoraBackward(layer, LoraTarget::kQkv, dqkv, A.ln1, dC, N);
  AllReduceInputGrad(dC, size_t(N) * C);
  Timed(GptLayerKind::kLayerNorm, [&] {
    k->LayerNormBackward(dres, G.ln1w, G.ln1b, dC, x, P.ln1w, A.ln1_mean, A.ln1_rstd, N, C);
  });
}

TensorRange GptModel::BlockUnit(int layer) const {
  const size_t first = first_block_tensor_ + size_t(Local(layer)) * kGptTensorsPerBlock;
  return {first, first + kGptTensorsPerBlock};
}

TensorRange GptModel::LnfUnit() const {
  const size_t first = first_block_tensor_ + size_t(stage_.layers()) * kGptTensorsPerBlock;
  return {first, first + (stage_.wte_copy() ? 3 : 2)};
}

std::vector<TensorRange> GptModel::ParamUnits() const {
  std::vector<TensorRange> units;
  if (stage_.embedding) units.push_back(EmbeddingUnit());
  for (int l = stage_.first_layer; l < stage_.end_layer; ++l) units.push_back(BlockUnit(l));
  if (stage_.head) units.push_back(LnfUnit());
  return units;
}

void GptModel::ForwardTrunk(bool then_backward) {
  const int B = B_, T = T_, N = B * T, C = config_.hidden_size;
  const int first = stage_.first_layer, end = stage_.end_layer, L = stage_.layers();
  const float* params = arena_.params().data();
  const int32_t* tokens = SlotIds(slot_);
  if (stage_.embedding) {
    Acquire(EmbeddingUnit(), L > 0 ? BlockUnit(first) : LnfUnit());
    Timed(GptLayerKind::kEmbedding, [&] {
      float* out = Act(GptAct::kResidual, 0);
      const float* wte = params + arena_.offset(0);
      const float* wpe = params + arena_.offset(1);
      if (tp_ == nullptr) {
        kernels_->EncoderForward(out, tokens, wte, wpe, B, T, C);
        return;
      }
      // Vocabulary parallel: each rank its rows' tokens, wpe once, summed.
      kernels_->EncoderShardForward(out, tokens, wte, tp_->lead() ? wpe : nullptr, B, T, C,
                                    tp_->vocab_begin(), tp_->vocab_rows());
      tp_->AllReduceSum(out, size_t(N) * C);
    });
    if (hidden_dropout()) {
      float* out = Act(GptAct::kResidual, 0);
      const DropoutSpec d = Dropout(kGptEmbeddingDropoutSite, config_.hidden_dropout_prob);
      Timed(GptLayerKind::kDropout,
            [&] { kernels_->DropoutForward(out, out, nullptr, B, size_t(T) * C, d); });
    }
  }
  // (A later stage's input, the previous stage's output, is in residual 0.)
  for (int l = first; l < end; ++l) {
    const TensorRange next = l + 1 < end   ? BlockUnit(l + 1)
                             : stage_.head ? LnfUnit()
                                           : TensorRange{};
    Acquire(BlockUnit(l), next);
    BlockForward(l, Act(GptAct::kResidual, Local(l)), Act(GptAct::kResidual, Local(l) + 1));
    Release(BlockUnit(l));
  }
  if (!stage_.head) return;  // the output stays in residual L
  Acquire(LnfUnit(), then_backward && L > 0 ? BlockUnit(end - 1) : TensorRange{});
  Timed(GptLayerKind::kLayerNorm, [&] {
    kernels_->LayerNormForward(Act(GptAct::kLnf), Act(GptAct::kLnfMean), Act(GptAct::kLnfRstd),
                               Act(GptAct::kResidual, L), params + lnf_offset_,
                               params + lnf_offset_ + C, N, C);
  });
}

void GptModel::CrossEntropy(float* losses, float* logits, const int32_t* targets, int N,
                            float dloss, bool write_dlogits) {
  const int V = VocabRows();
  if (tp_ == nullptr) {
    kernels_->CrossEntropyForward(losses, logits, targets, N, V, dloss, write_dlogits);
    return;
  }
  // Vocabulary parallel: the row max, then the sums of exponentials and the
  // target logits, each reduced over the ranks; the logits stay split.
  float* row_max = Act(GptAct::kCeRowMax);
  float* sums = Act(GptAct::kCeSums);
  kernels_->CrossEntropyShardMax(row_max, logits, N, V);
  tp_->AllReduceMax(row_max, N);
  kernels_->CrossEntropyShardSums(sums, logits, row_max, targets, N, V, tp_->vocab_begin());
  tp_->AllReduceSum(sums, 2 * size_t(N));
  kernels_->CrossEntropyShardFinish(losses, logits, row_max, sums, targets, N, V,
                                    tp_->vocab_begin(), dloss, write_dlogits);
}

Result<float> GptModel::Forward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                int B, int T, const GptForwardOptions& options) {
  if (targets.size() != tokens.size()) {
    return Status::InvalidArgument("got " + std::to_string(targets.size()) + " targets for " +
                                   std::to_string(tokens.size()) + " tokens");
  }
  if (options.slot < 0 || options.slot >= slots_) {
    return Status::InvalidArgument("activation slot " + std::to_string(options.slot) +
                                   " outside [0, " + std::to_string(slots_) + ")");
  }
  FLEET_RETURN_IF_ERROR(ValidateInputs(tokens, targets, B, T));
  size_t count = 0;
  for (int32_t t : targets) count += t >= 0;
  if (count == 0 && stage_.head) {
    return Status::InvalidArgument("no position has a target (every target is -1)");
  }
  const bool dropout = options.for_backward && config_.dropout();
  if (dropout && options.dropout_streams.size() != size_t(B)) {
    return Status::InvalidArgument("a training pass with dropout needs one stream per sequence (" +
                                       std::to_string(B) + "), got " +
                                       std::to_string(options.dropout_streams.size()),
                                   "Model.hidden_dropout_prob");
  }
  slot_ = options.slot;
  LoadInputs(tokens, targets, B, T,
             dropout ? options.dropout_streams : std::span<const uint32_t>{});
  dropout_on_ = dropout;
  dropout_seed_ = options.dropout_seed;
  SlotState& state = slot_state_[slot_];
  state.dropout_on = dropout;
  state.dropout_seed = options.dropout_seed;
  ForwardTrunk(options.for_backward);
  state.backward_ready = options.for_backward;
  if (!stage_.head) {
    if (!options.for_backward && stage_.embedding) Release(EmbeddingUnit());
    FLEET_RETURN_IF_ERROR(comm_status());
    return 0.0f;
  }
  const int N = B * T, C = config_.hidden_size, V = VocabRows();
  float* logits = Act(GptAct::kLogits);
  float* losses = Act(GptAct::kLosses);
  const float* wte = arena_.params().data() + arena_.offset(wte_index_);
  const int32_t* target_ids = SlotIds(slot_) + size_t(cap_b_) * cap_t_;
  Timed(GptLayerKind::kMatmul,
        [&] { kernels_->MatmulForward(logits, Act(GptAct::kLnf), wte, nullptr, N, C, V, false); });
  const float dloss = options.grad_scale / static_cast<float>(count);
  Timed(GptLayerKind::kClassifier,
        [&] { CrossEntropy(losses, logits, target_ids, N, dloss, options.for_backward); });
  std::vector<float> host(N);
  backend_->CopyToHost(host.data(), losses, host.size() * sizeof(float));
  double sum = 0.0;
  for (float l : host) sum += l;
  if (!options.for_backward) {
    Release(LnfUnit());
    if (stage_.embedding) Release(EmbeddingUnit());
  }
  FLEET_RETURN_IF_ERROR(comm_status());
  return static_cast<float>(sum / static_cast<double>(count));
}

void GptModel::Backward(const GradReadyFn& on_grads_ready, int slot) {
  CHECK(slot >= 0 && slot < slots_) << "activation slot " << slot << " of " << slots_;
  SlotState& state = slot_state_[slot];
  CHECK(state.backward_ready) << "GptModel::Backward needs a Forward with for_backward first";
  state.backward_ready = false;
  slot_ = slot;
  dropout_on_ = state.dropout_on;
  dropout_seed_ = state.dropout_seed;
  const int B = B_, T = T_, N = B * T, C = config_.hidden_size, V = VocabRows();
  const int first = stage_.first_layer, L = stage_.layers();
  const float* params = arena_.params().data();
  float* grads = arena_.grads().data();  // null for frozen weights (LoRA)
  auto grad_at = [grads](size_t offset) { return grads ? grads + offset : nullptr; };
  float* dres = Act(GptAct::kDResidual);
  float* dC = Act(GptAct::kDBufC);
  auto ready = [&](size_t first_tensor, size_t end_tensor) {
    if (on_grads_ready) on_grads_ready(first_tensor, end_tensor);
  };
  if (stage_.head) {
    // Head: logits hold dlogits; dwte (or the head's copy) gets its part here.
    const size_t wte = arena_.offset(wte_index_);
    Timed(GptLayerKind::kMemory, [&] {
      backend_->Fill(dC, size_t(N) * C, 0.0f);
      backend_->Fill(dres, size_t(N) * C, 0.0f);
    });
    Timed(GptLayerKind::kMatmul, [&] {
      kernels_->MatmulBackward(dC, grad_at(wte), nullptr, Act(GptAct::kLogits), Act(GptAct::kLnf),
                               params + wte, N, C, V);
    });
    if (stage_.wte_copy()) ready(wte_index_, wte_index_ + 1);
    AllReduceInputGrad(dC, size_t(N) * C);
    Timed(GptLayerKind::kLayerNorm, [&] {
      kernels_->LayerNormBackward(dres, grad_at(lnf_offset_), grad_at(lnf_offset_ + C), dC,
                                  Act(GptAct::kResidual, L), params + lnf_offset_,
                                  Act(GptAct::kLnfMean), Act(GptAct::kLnfRstd), N, C);
    });
    const size_t lnf_tensor = LnfUnit().first;
    if (lora_ == nullptr) ready(lnf_tensor, lnf_tensor + 2);
    Release(LnfUnit());
  }
  // (A stage without the head starts from its output's gradient in dres.)
  for (int l = stage_.end_layer - 1; l >= first; --l) {
    Acquire(BlockUnit(l), l > first ? BlockUnit(l - 1) : TensorRange{});
    if (config_.use_recompute) BlockForward(l, Act(GptAct::kResidual, Local(l)), nullptr);
    BlockBackward(l, Act(GptAct::kResidual, Local(l)), dres);
    const TensorRange block = BlockUnit(l);
    // The ranges name tensors of trainable_arena(): with LoRA the block's adapters.
    const TensorRange done = lora_ ? lora_->BlockRange(l) : block;
    ready(done.first, done.end);
    Release(block);
  }
  if (!stage_.embedding) return;  // dres holds the gradient of the stage's input
  if (lora_ != nullptr) {
    // Frozen embeddings: nothing to compute below the first block.
    Release(EmbeddingUnit());
    return;
  }
  if (hidden_dropout()) {
    const DropoutSpec d = Dropout(kGptEmbeddingDropoutSite, config_.hidden_dropout_prob);
    Timed(GptLayerKind::kDropout,
          [&] { kernels_->DropoutBackward(dres, dres, B, size_t(T) * C, d); });
  }
  // The embeddings' backward reads no parameters.
  Timed(GptLayerKind::kEmbedding, [&] {
    const int32_t* tokens = SlotIds(slot_);
    float* dwte = grads + arena_.offset(0);
    float* dwpe = grads + arena_.offset(1);
    if (tp_ == nullptr) {
      kernels_->EncoderBackward(dwte, dwpe, dres, tokens, B, T, C);
    } else {
      kernels_->EncoderShardBackward(dwte, dwpe, dres, tokens, B, T, C, tp_->vocab_begin(),
                                     tp_->vocab_rows());
    }
  });
  ready(0, 2);
  Release(EmbeddingUnit());
}

Result<std::vector<float>> GptModel::LastLogits(std::span<const int32_t> tokens, int B, int T) {
  if (tp_ != nullptr && tp_->degree() > 1) {
    return Status::FailedPrecondition(
        "next-token logits need the whole vocabulary; load the checkpoint (whole-model layout) "
        "into a model without tensor parallelism",
        "Distributed.mp_degree");
  }
  if (!(stage_ == GptWholeStage(config_))) {
    return Status::FailedPrecondition(
        "next-token logits need every layer; load the checkpoint (whole-model layout) into a "
        "model without pipeline stages",
        "Distributed.pp_degree");
  }
  FLEET_RETURN_IF_ERROR(ValidateInputs(tokens, {}, B, T));
  slot_ = 0;
  LoadInputs(tokens, {}, B, T, {});
  dropout_on_ = false;
  ForwardTrunk(/*then_backward=*/false);
  const int C = config_.hidden_size, V = config_.vocab_size;
  // Gather ln_f's output at position T - 1 of each row into [B, C].
  float* last = Act(GptAct::kDBufC);
  Timed(GptLayerKind::kMemory, [&] {
    for (int b = 0; b < B; ++b) {
      backend_->CopyOnDevice(last + size_t(b) * C, Act(GptAct::kLnf) + (size_t(b) * T + T - 1) * C,
                             C * sizeof(float));
    }
  });
  float* logits = Act(GptAct::kLogits);
  Timed(GptLayerKind::kMatmul, [&] {
    kernels_->MatmulForward(logits, last, arena_.params().data(), nullptr, B, C, V, false);
  });
  std::vector<float> host(size_t(B) * V);
  backend_->CopyToHost(host.data(), logits, host.size() * sizeof(float));
  Release(LnfUnit());
  Release(EmbeddingUnit());
  return host;
}

}  // namespace fleet::trainer
