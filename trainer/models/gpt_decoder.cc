#include "trainer/models/gpt_decoder.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>

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
  logits_host_.resize(B * V);
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

Result<std::span<const float>> GptDecoder::Prefill(std::span<const int32_t> prompt) {
  position_ = 0;
  prefilled_ = false;
  const int maxT = max_positions();
  if (prompt.empty()) return Status::InvalidArgument("the prompt has no tokens");
  if (prompt.size() > static_cast<size_t>(maxT)) {
    return Status::InvalidArgument("the prompt has " + std::to_string(prompt.size()) +
                                       " tokens, more than the model's context of " +
                                       std::to_string(maxT),
                                   "Model.max_position_embeddings");
  }
  FLEET_RETURN_IF_ERROR(CheckIds(prompt));
  const int P = static_cast<int>(prompt.size());
  const int chunk = std::min(rows_, options_.prefill_chunk);
  for (int start = 0; start < P; start += chunk) {
    const int n = std::min(chunk, P - start);
    backend_->CopyFromHost(tokens_.get(), prompt.data() + start, n * sizeof(int32_t));
    Forward(1, n);
  }
  // Sequence 0 holds the prompt's keys and values; give every other
  // sequence the same rows.
  const GptConfig& c = model_->config();
  const size_t C = c.hidden_size, B = options_.batch, seq = size_t(maxT) * C;
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
  prefilled_ = true;
  return std::span<const float>(logits_host_);
}

Result<std::span<const float>> GptDecoder::Step(std::span<const int32_t> tokens) {
  if (!prefilled_) return Status::FailedPrecondition("GptDecoder::Step before a Prefill");
  if (tokens.size() != static_cast<size_t>(options_.batch)) {
    return Status::InvalidArgument("Step takes one token per sequence: got " +
                                   std::to_string(tokens.size()) + ", batch " +
                                   std::to_string(options_.batch));
  }
  if (position_ >= max_positions()) {
    return Status::InvalidArgument("the sequences already hold " + std::to_string(position_) +
                                       " tokens, the model's context (no position left for "
                                       "another token)",
                                   "Model.max_position_embeddings");
  }
  FLEET_RETURN_IF_ERROR(CheckIds(tokens));
  backend_->CopyFromHost(tokens_.get(), tokens.data(), tokens.size() * sizeof(int32_t));
  Forward(options_.batch, 1);
  return std::span<const float>(logits_host_);
}

void GptDecoder::Forward(int Bn, int T) {
  const GptConfig& c = model_->config();
  const int C = c.hidden_size, F = c.ffn(), NH = c.num_attention_heads, V = c.vocab_size;
  const int maxT = c.max_position_embeddings, N = Bn * T;
  CHECK(N <= rows_ && position_ + T <= maxT);
  const size_t layer_cache = size_t(options_.batch) * maxT * C;
  GptKernels* k = kernels_;
  float *x = x_.get(), *ln = ln_.get(), *mean = mean_.get(), *rstd = rstd_.get();
  float *qkv = qkv_.get(), *atty = atty_.get(), *fch = fch_.get(), *fch_gelu = fch_gelu_.get();
  const auto* tokens = static_cast<const int32_t*>(tokens_.get());

  // The new rows sit at positions [position_, position_ + T).
  k->EncoderForward(x, tokens, wte_, wpe_ + size_t(position_) * C, Bn, T, C);
  for (int l = 0; l < c.num_layers; ++l) {
    k->LayerNormForward(ln, mean, rstd, x, P(l, GptTensor::kLn1W), P(l, GptTensor::kLn1B), N, C);
    k->MatmulForward(qkv, ln, P(l, GptTensor::kQkvW), P(l, GptTensor::kQkvB), N, C, 3 * C, false);
    k->AttentionDecodeForward(atty, k_cache_.get() + l * layer_cache,
                              v_cache_.get() + l * layer_cache, scratch_.get(), qkv, Bn, T,
                              position_, maxT, C, NH);
    k->MatmulForward(x, atty, P(l, GptTensor::kProjW), P(l, GptTensor::kProjB), N, C, C, true);
    k->LayerNormForward(ln, mean, rstd, x, P(l, GptTensor::kLn2W), P(l, GptTensor::kLn2B), N, C);
    k->MatmulForward(fch, ln, P(l, GptTensor::kFcW), P(l, GptTensor::kFcB), N, C, F, false);
    k->GeluForward(fch_gelu, fch, size_t(N) * F);
    k->MatmulForward(x, fch_gelu, P(l, GptTensor::kFcProjW), P(l, GptTensor::kFcProjB), N, F, C,
                     true);
  }
  // Only each sequence's last new row needs logits.
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
  position_ += T;
}

}  // namespace fleet::trainer
