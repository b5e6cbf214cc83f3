#include "trainer/models/gpt_decoder.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>

#include "trainer/models/gpt_lora.h"

namespace fleet::trainer {

Result<std::unique_ptr<GptDecoder>> GptDecoder::Create(GptModel* model,
                                                       const GptDecoderOptions& options) {
  CHECK(model != nullptr);
  if (options.batch < 1) {
    return Status::InvalidArgument("decoder batch must be >= 1, got " +
                                   std::to_string(options.batch));
  }
  if (options.prefill_chunk < 1) {
    return Status::InvalidArgument("decoder prefill_chunk must be >= 1, got " +
                                   std::to_string(options.prefill_chunk));
  }
  if (options.max_lora_rank < 0) {
    return Status::InvalidArgument("decoder max_lora_rank must be >= 0, got " +
                                   std::to_string(options.max_lora_rank));
  }
  if (model->config().lora.enabled()) {
    // The decoder's passes read the weights alone.
    return Status::InvalidArgument(
        "the KV-cache decoder does not decode a model built with LoRA adapters; merge them "
        "first (gpt_convert --merge_lora) and decode the merged checkpoint with a config "
        "without Model.lora (or -o Model.lora=null), or serve them over their base "
        "(gpt_serve --lora NAME=DIR)",
        "Model.lora");
  }
  return std::unique_ptr<GptDecoder>(new GptDecoder(model, options));
}

GptDecoder::GptDecoder(GptModel* model, const GptDecoderOptions& options)
    : model_(model),
      options_(options),
      backend_(model->backend()),
      kernels_(model->kernels()),
      rows_(std::max(options.batch,
                     std::min(options.prefill_chunk, model->config().max_position_embeddings))) {
  const GptConfig& c = model->config();
  const size_t B = options.batch, L = c.num_layers, C = c.hidden_size, F = c.ffn();
  const size_t NH = c.num_attention_heads, V = c.vocab_size, maxT = c.max_position_embeddings;
  const size_t R = rows_;

  const float* base = model->arena().params().data();
  size_t offset = 0;
  ForEachGptTensor(c, [&](GptTensor t, int /*layer*/, int64_t rows, int64_t cols) {
    const float* p = base + offset;
    offset += static_cast<size_t>(rows * std::max<int64_t>(cols, 1));
    switch (t) {
      case GptTensor::kWte:
        wte_ = p;
        break;
      case GptTensor::kWpe:
        wpe_ = p;
        break;
      case GptTensor::kLnfW:
        lnfw_ = p;
        break;
      case GptTensor::kLnfB:
        lnfb_ = p;
        break;
      default:
        block_params_.push_back(p);
        break;
    }
  });
  CHECK_EQ(offset, model->arena().size());
  CHECK_EQ(block_params_.size(), L * kGptTensorsPerBlock);

  k_cache_ = backend_->AllocateFloats(L * B * maxT * C);
  v_cache_ = backend_->AllocateFloats(L * B * maxT * C);
  x_ = backend_->AllocateFloats(R * C);
  ln_ = backend_->AllocateFloats(R * C);
  mean_ = backend_->AllocateFloats(R);
  rstd_ = backend_->AllocateFloats(R);
  qkv_ = backend_->AllocateFloats(R * 3 * C);
  atty_ = backend_->AllocateFloats(R * C);
  fch_ = backend_->AllocateFloats(R * F);
  fch_gelu_ = backend_->AllocateFloats(R * F);
  // AttentionDecodeForward's scratch for Bn x T new rows at `past` is
  // Bn NH T (past + T) <= NH maxT R (Bn T <= R rows, past + T <= maxT).
  scratch_ = backend_->AllocateFloats(NH * maxT * R);
  last_ = backend_->AllocateFloats(B * C);
  logits_ = backend_->AllocateFloats(B * V);
  tokens_ = backend_->AllocateBytes(R * sizeof(int32_t));
  if (options.max_lora_rank > 0)
    lora_scratch_ = backend_->AllocateFloats(R * options.max_lora_rank);
  if (options.prompt_logits) {
    const size_t rows = std::min(options.prefill_chunk, c.max_position_embeddings);
    prompt_logits_ = backend_->AllocateFloats(rows * V);
    prompt_logits_host_.resize(rows * V);
  }
  logits_host_.resize(B * V);
  positions_.assign(B, 0);
  adapters_.assign(B, nullptr);
  for (int b = 0; b < options.batch; ++b) all_slots_.push_back(b);
}

Status GptDecoder::CheckIds(std::span<const int32_t> ids) const {
  const int V = model_->config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= V) {
      return Status::InvalidArgument("token id " + std::to_string(ids[i]) + " at position " +
                                         std::to_string(i) + " is outside [0, " +
                                         std::to_string(V) + ")",
                                     "Model.vocab_size");
    }
  }
  return Status::OK();
}

Status GptDecoder::CheckPrompt(std::span<const int32_t> prompt) const {
  const int maxT = max_positions();
  if (prompt.empty()) return Status::InvalidArgument("the prompt has no tokens");
  if (prompt.size() > static_cast<size_t>(maxT)) {
    return Status::InvalidArgument("the prompt has " + std::to_string(prompt.size()) +
                                       " tokens, more than the model's context of " +
                                       std::to_string(maxT),
                                   "Model.max_position_embeddings");
  }
  return CheckIds(prompt);
}

Status GptDecoder::CheckAdapters(const GptLoraAdapters& adapters) const {
  const GptConfig &a = adapters.config(), &c = model_->config();
  if (a.vocab_size != c.vocab_size || a.hidden_size != c.hidden_size ||
      a.num_layers != c.num_layers || a.num_attention_heads != c.num_attention_heads ||
      a.ffn() != c.ffn() || a.max_position_embeddings != c.max_position_embeddings) {
    return Status::InvalidArgument("LoRA adapters made for another model shape", "Model");
  }
  if (adapters.backend() != backend_) {
    return Status::InvalidArgument("LoRA adapters on another device than the decoder's");
  }
  if (a.lora.rank > options_.max_lora_rank) {
    return Status::InvalidArgument("LoRA adapters of rank " + std::to_string(a.lora.rank) +
                                   ", above the decoder's max_lora_rank " +
                                   std::to_string(options_.max_lora_rank));
  }
  return Status::OK();
}

void GptDecoder::FeedPrompt(int slot, std::span<const int32_t> prompt,
                            const PromptLogitsFn& prompt_logits) {
  positions_[slot] = 0;
  const int P = static_cast<int>(prompt.size());
  const int chunk = std::min(rows_, options_.prefill_chunk);
  const int slots[] = {slot};
  const size_t V = model_->config().vocab_size;
  for (int start = 0; start < P; start += chunk) {
    const int n = std::min(chunk, P - start);
    backend_->CopyFromHost(tokens_.get(), prompt.data() + start, n * sizeof(int32_t));
    Forward(slots, n, prompt_logits != nullptr);
    if (prompt_logits) {
      prompt_logits(start, n, std::span<const float>(prompt_logits_host_).first(n * V));
    }
  }
}

Result<std::span<const float>> GptDecoder::Prefill(std::span<const int32_t> prompt) {
  std::fill(positions_.begin(), positions_.end(), 0);
  std::fill(adapters_.begin(), adapters_.end(), nullptr);
  FLEET_RETURN_IF_ERROR(CheckPrompt(prompt));
  FeedPrompt(0, prompt);
  // Slot 0 holds the prompt's keys and values; give every other slot the
  // same rows.
  const GptConfig& c = model_->config();
  const size_t C = c.hidden_size, B = options_.batch, seq = size_t(max_positions()) * C;
  const size_t P = prompt.size();
  for (int l = 0; l < c.num_layers; ++l) {
    for (size_t b = 1; b < B; ++b) {
      for (float* cache : {k_cache_.get(), v_cache_.get()}) {
        float* layer = cache + l * B * seq;
        backend_->CopyOnDevice(layer + b * seq, layer, P * C * sizeof(float));
      }
    }
  }
  const size_t V = c.vocab_size;
  for (size_t b = 1; b < B; ++b) {
    std::copy_n(logits_host_.begin(), V, logits_host_.begin() + b * V);
  }
  std::fill(positions_.begin(), positions_.end(), static_cast<int>(P));
  return std::span<const float>(logits_host_);
}

Result<std::span<const float>> GptDecoder::PrefillSlot(int slot, std::span<const int32_t> prompt,
                                                       GptLoraAdapters* adapters,
                                                       const PromptLogitsFn& prompt_logits) {
  CHECK(slot >= 0 && slot < options_.batch) << "slot " << slot << " of " << options_.batch;
  positions_[slot] = 0;
  adapters_[slot] = nullptr;
  FLEET_RETURN_IF_ERROR(CheckPrompt(prompt));
  if (adapters != nullptr) FLEET_RETURN_IF_ERROR(CheckAdapters(*adapters));
  if (prompt_logits && !options_.prompt_logits) {
    return Status::InvalidArgument(
        "the logits of every prompt position need GptDecoderOptions::prompt_logits");
  }
  adapters_[slot] = adapters;
  FeedPrompt(slot, prompt, prompt_logits);
  return std::span<const float>(logits_host_).first(model_->config().vocab_size);
}

void GptDecoder::ResetSlot(int slot) {
  CHECK(slot >= 0 && slot < options_.batch) << "slot " << slot << " of " << options_.batch;
  positions_[slot] = 0;
  adapters_[slot] = nullptr;
}

Result<std::span<const float>> GptDecoder::Step(std::span<const int32_t> tokens) {
  if (positions_[0] == 0) return Status::FailedPrecondition("GptDecoder::Step before a Prefill");
  if (tokens.size() != static_cast<size_t>(options_.batch)) {
    return Status::InvalidArgument("Step takes one token per sequence: got " +
                                   std::to_string(tokens.size()) + ", batch " +
                                   std::to_string(options_.batch));
  }
  return StepSlots(all_slots_, tokens);
}

Result<std::span<const float>> GptDecoder::StepSlots(std::span<const int> slots,
                                                     std::span<const int32_t> tokens) {
  if (tokens.size() != slots.size()) {
    return Status::InvalidArgument("StepSlots takes one token per slot: got " +
                                   std::to_string(tokens.size()) + " tokens for " +
                                   std::to_string(slots.size()) + " slots");
  }
  std::vector<char> seen(options_.batch, 0);
  for (int slot : slots) {
    CHECK(slot >= 0 && slot < options_.batch) << "slot " << slot << " of " << options_.batch;
    if (seen[slot]++) {
      return Status::InvalidArgument("slot " + std::to_string(slot) + " is stepped twice");
    }
    if (positions_[slot] == 0) {
      return Status::FailedPrecondition("slot " + std::to_string(slot) +
                                        " holds no prompt (PrefillSlot it first)");
    }
    if (positions_[slot] >= max_positions()) {
      return Status::InvalidArgument("slot " + std::to_string(slot) + " already holds " +
                                         std::to_string(positions_[slot]) +
                                         " tokens, the model's context (no position left for "
                                         "another token)",
                                     "Model.max_position_embeddings");
    }
  }
  FLEET_RETURN_IF_ERROR(CheckIds(tokens));
  if (slots.empty()) return std::span<const float>();
  backend_->CopyFromHost(tokens_.get(), tokens.data(), tokens.size() * sizeof(int32_t));
  Forward(slots, 1);
  return std::span<const float>(logits_host_).first(slots.size() * model_->config().vocab_size);
}

void GptDecoder::AddLora(std::span<const AdapterRun> runs, int l, LoraTarget t, const float* inp,
                         float* out) {
  const auto [in, out_dim] = LoraTargetShape(model_->config(), t);
  for (const AdapterRun& run : runs) {
    run.adapters->Forward(l, t, inp + size_t(run.first_row) * in,
                          out + size_t(run.first_row) * out_dim, run.rows, lora_scratch_.get());
  }
}

void GptDecoder::Forward(std::span<const int> slots, int T, bool all_rows) {
  const GptConfig& c = model_->config();
  const int C = c.hidden_size, F = c.ffn(), NH = c.num_attention_heads, V = c.vocab_size;
  const int maxT = c.max_position_embeddings, Bn = static_cast<int>(slots.size()), N = Bn * T;
  CHECK(N <= rows_);
  CHECK(!all_rows || Bn == 1);
  const size_t layer_cache = size_t(options_.batch) * maxT * C, slot_cache = size_t(maxT) * C;
  GptKernels* k = kernels_;
  float *x = x_.get(), *ln = ln_.get(), *mean = mean_.get(), *rstd = rstd_.get();
  float *qkv = qkv_.get(), *atty = atty_.get(), *fch = fch_.get(), *fch_gelu = fch_gelu_.get();
  const auto* tokens = static_cast<const int32_t*>(tokens_.get());

  // Runs of slots with consecutive ids at one position share one embedding
  // and one attention call (a shared-prompt Step is a single run); slots at
  // their own positions get a call each. {first row index i, run length n}.
  std::vector<std::pair<int, int>> runs;
  for (int i = 0; i < Bn; ++i) {
    CHECK(positions_[slots[i]] + T <= maxT);
    if (!runs.empty()) {
      auto& [first, n] = runs.back();
      if (slots[first] + n == slots[i] && positions_[slots[first]] == positions_[slots[i]]) {
        ++n;
        continue;
      }
    }
    runs.push_back({i, 1});
  }
  // Rows of adapted slots, in runs of consecutive slots with the same
  // adapters: each adds its LoRA terms after the base GEMM over all rows.
  std::vector<AdapterRun> lora_runs;
  for (int i = 0; i < Bn; ++i) {
    GptLoraAdapters* a = adapters_[slots[i]];
    if (a == nullptr) continue;
    if (!lora_runs.empty() && lora_runs.back().adapters == a &&
        lora_runs.back().first_row + lora_runs.back().rows == i * T) {
      lora_runs.back().rows += T;
    } else {
      lora_runs.push_back({a, i * T, T});
    }
  }
  // Each run's new rows sit at positions [past, past + T).
  for (auto [i, n] : runs) {
    const size_t row = size_t(i) * T;
    k->EncoderForward(x + row * C, tokens + row, wte_, wpe_ + size_t(positions_[slots[i]]) * C, n,
                      T, C);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    k->LayerNormForward(ln, mean, rstd, x, P(l, GptTensor::kLn1W), P(l, GptTensor::kLn1B), N, C);
    k->MatmulForward(qkv, ln, P(l, GptTensor::kQkvW), P(l, GptTensor::kQkvB), N, C, 3 * C, false);
    AddLora(lora_runs, l, LoraTarget::kQkv, ln, qkv);
    for (auto [i, n] : runs) {
      const size_t row = size_t(i) * T, cache = l * layer_cache + slots[i] * slot_cache;
      k->AttentionDecodeForward(atty + row * C, k_cache_.get() + cache, v_cache_.get() + cache,
                                scratch_.get(), qkv + row * 3 * C, n, T, positions_[slots[i]], maxT,
                                C, NH);
    }
    k->MatmulForward(x, atty, P(l, GptTensor::kProjW), P(l, GptTensor::kProjB), N, C, C, true);
    AddLora(lora_runs, l, LoraTarget::kProj, atty, x);
    k->LayerNormForward(ln, mean, rstd, x, P(l, GptTensor::kLn2W), P(l, GptTensor::kLn2B), N, C);
    k->MatmulForward(fch, ln, P(l, GptTensor::kFcW), P(l, GptTensor::kFcB), N, C, F, false);
    AddLora(lora_runs, l, LoraTarget::kFc, ln, fch);
    k->GeluForward(fch_gelu, fch, size_t(N) * F);
    k->MatmulForward(x, fch_gelu, P(l, GptTensor::kFcProjW), P(l, GptTensor::kFcProjB), N, F, C,
                     true);
    AddLora(lora_runs, l, LoraTarget::kFcProj, fch_gelu, x);
  }
  if (all_rows) {
    // Every new row's logits (the slot's prompt, echoed with its
    // log-probabilities); the last row's also go to logits_host_ row 0.
    k->LayerNormForward(ln, mean, rstd, x, lnfw_, lnfb_, N, C);
    k->MatmulForward(prompt_logits_.get(), ln, wte_, nullptr, N, C, V, false);
    backend_->CopyToHost(prompt_logits_host_.data(), prompt_logits_.get(),
                         size_t(N) * V * sizeof(float));
    std::copy_n(prompt_logits_host_.begin() + size_t(N - 1) * V, V, logits_host_.begin());
    positions_[slots[0]] += T;
    return;
  }
  // Only each slot's last new row needs logits.
  const float* last = x;
  if (T > 1) {
    for (int b = 0; b < Bn; ++b) {
      backend_->CopyOnDevice(last_.get() + size_t(b) * C, x + (size_t(b) * T + T - 1) * C,
                             C * sizeof(float));
    }
    last = last_.get();
  }
  k->LayerNormForward(ln, mean, rstd, last, lnfw_, lnfb_, Bn, C);
  k->MatmulForward(logits_.get(), ln, wte_, nullptr, Bn, C, V, false);
  backend_->CopyToHost(logits_host_.data(), logits_.get(), size_t(Bn) * V * sizeof(float));
  for (int slot : slots) positions_[slot] += T;
}

}  // namespace fleet::trainer
