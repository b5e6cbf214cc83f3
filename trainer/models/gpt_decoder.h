// GptDecoder: incremental GPT-2 inference with a KV cache, for generation.
//
// A GptModel's Forward recomputes every position of a sequence; decoding
// token by token that way costs O(T^2) matmul rows per sequence. The decoder
// keeps, per layer, the keys and values of every position seen so far
// (k_cache, v_cache [B, maxT, C]) and computes only the new positions:
//
//   x = wte[token] + wpe[position]                        (new rows only)
//   per layer: qkv = ln_1(x) W_qkv^T + b;  AttentionDecodeForward appends
//              k, v to the layer's cache and attends the new queries over
//              rows [0, position]; x += proj(.); x += mlp(ln_2(x))
//   logits = ln_f(x at the last new position) wte^T       -> host [B, V]
//
// Prefill feeds the prompt (shared by the B sequences) in chunks of
// `prefill_chunk` positions through sequence 0 and then copies its cache rows
// to the other sequences; Step feeds one token per sequence. The logits equal
// GptModel::LastLogits over the whole prefix within float rounding
// (gpt_decoder_test checks every step on the CPU twin and the oracle).
//
// Memory (device): 2 L B maxT C floats of cache, plus buffers for
// max(B, prefill_chunk) rows, plus the attention scratch and [B, V] logits.
// Allocated once in Create.
//
// Thread safety: one thread drives a decoder at a time; it shares the
// model's parameters (read only), backend and kernels, so the model must not
// train or be used from another thread meanwhile.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/status.h"
#include "trainer/models/gpt.h"

namespace fleet::trainer {

struct GptDecoderOptions {
  // Sequences decoded together (num_return_sequences); each Step takes one
  // token for each.
  int batch = 1;
  // Prompt positions fed per kernel call by Prefill: bounds the activation
  // buffers and the attention scratch (NH x chunk x maxT floats) without
  // changing the results beyond rounding. 64 keeps a long prompt's matmuls
  // at GEMM speed; lower it only to save memory.
  int prefill_chunk = 64;
};

class GptDecoder {
 public:
  // `model` is not owned and must outlive the decoder; its parameters are
  // read at every call (so a decoder sees parameters loaded after Create).
  // InvalidArgument for batch or prefill_chunk < 1.
  static Result<std::unique_ptr<GptDecoder>> Create(GptModel* model,
                                                    const GptDecoderOptions& options = {});

  // Starts the B sequences over with `prompt` (host ids) and returns the
  // logits after its last token, host [B, V] (B equal rows), valid until the
  // next call. InvalidArgument (naming Model.max_position_embeddings or
  // Model.vocab_size) for an empty prompt, one longer than the model's
  // context, or an id outside [0, V); the decoder is then empty (position 0).
  Result<std::span<const float>> Prefill(std::span<const int32_t> prompt);

  // Appends tokens[b] to sequence b (host ids, size B) and returns the
  // logits after it, host [B, V], valid until the next call.
  // FailedPrecondition before a Prefill; InvalidArgument naming
  // Model.max_position_embeddings when the sequences already hold that many
  // tokens, or naming Model.vocab_size for an id out of range; nothing
  // changes on error.
  Result<std::span<const float>> Step(std::span<const int32_t> tokens);

  // Tokens held per sequence (prompt + steps).
  int position() const { return position_; }
  int batch() const { return options_.batch; }
  // Model.max_position_embeddings: position() never exceeds it.
  int max_positions() const { return model_->config().max_position_embeddings; }

 private:
  GptDecoder(GptModel* model, const GptDecoderOptions& options);
  Status CheckIds(std::span<const int32_t> ids) const;
  // Runs Bn sequences' T new tokens (device ids in tokens_) at positions
  // [position_, position_ + T) through the model and writes the logits of
  // each sequence's last new position to logits_host_ rows [0, Bn).
  void Forward(int Bn, int T);
  // Block tensor `t` of `layer` in the model's parameters.
  const float* P(int layer, GptTensor t) const {
    return block_params_[layer * kGptTensorsPerBlock + static_cast<int>(t) -
                         static_cast<int>(GptTensor::kLn1W)];
  }

  GptModel* const model_;
  const GptDecoderOptions options_;
  Backend* const backend_;
  GptKernels* const kernels_;
  const int rows_;  // max(batch, prefill_chunk): rows of the activation buffers

  // Views of the model's parameters (the arena never moves).
  const float *wte_ = nullptr, *wpe_ = nullptr, *lnfw_ = nullptr, *lnfb_ = nullptr;
  std::vector<const float*> block_params_;  // [L * kGptTensorsPerBlock], arena order

  // Device buffers, allocated in Create (sizes in gpt_decoder.cc).
  std::shared_ptr<float> k_cache_, v_cache_;  // [L, B, maxT, C]
  std::shared_ptr<float> x_, ln_, mean_, rstd_, qkv_, atty_, fch_, fch_gelu_, scratch_, last_,
      logits_;
  std::shared_ptr<void> tokens_;  // int32 [rows_]

  std::vector<float> logits_host_;  // [B, V]
  int position_ = 0;
  bool prefilled_ = false;
};

}  // namespace fleet::trainer
