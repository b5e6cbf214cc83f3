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
// The B sequences sit in slots of their own (cache rows, position). Two ways
// to drive them:
//   * shared prompt (gpt_generate's num_return_sequences): Prefill feeds the
//     prompt in chunks of `prefill_chunk` positions through slot 0 and copies
//     its cache rows to the other slots; Step feeds one token per slot.
//   * independent slots (gpt_serve's continuous batching): PrefillSlot starts
//     one slot over with its own prompt, StepSlots feeds one token to each of
//     a set of slots at their own positions. The GEMMs see one row per
//     stepped slot (weights read once per step for all of them); embedding
//     and attention run per slot over its own cache rows.
//
// LoRA adapters (several fine-tunes served over one base): PrefillSlot can
// give a slot a GptLoraAdapters of its own, which the slot uses until its
// next PrefillSlot. Each adapted matrix's GEMM still runs once over every
// row; then each run of consecutive rows with the same adapters adds its
// s (x A^T) B^T (two small GEMMs), so slots of different adapters and of
// the base share one step, and a slot's logits equal those of the base
// with that adapter merged in (gpt_convert --merge_lora) within rounding.
// Either way each slot's logits equal GptModel::LastLogits over that slot's
// whole prefix within float rounding (gpt_decoder_test checks every step on
// the CPU twin and the oracle, with slots at different positions).
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
#include <functional>
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
  // The largest rank of the LoRA adapters PrefillSlot may be given (0:
  // none): sizes their scratch, max(batch, prefill_chunk) x rank floats.
  int max_lora_rank = 0;
  // Whether PrefillSlot may be asked for the logits after every prompt
  // position (a server's echoed prompt with log-probabilities): a
  // [min(prefill_chunk, maxT), V] buffer on the device and the host.
  bool prompt_logits = false;
};

// Given by PrefillSlot the logits after prompt positions [first, first +
// rows) (host [rows, V], valid during the call), chunk by chunk in order.
using PromptLogitsFn = std::function<void(int first, int rows, std::span<const float> logits)>;

class GptDecoder {
 public:
  // `model` is not owned and must outlive the decoder; its parameters are
  // read at every call (so a decoder sees parameters loaded after Create).
  // InvalidArgument for batch or prefill_chunk < 1, max_lora_rank < 0, and
  // for a model built with LoRA adapters (merge them first: gpt_convert
  // --merge_lora, or give them to PrefillSlot over their base).
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

  // Starts slot `slot` over with `prompt` (host ids), leaving the other
  // slots as they are, and returns the logits after its last token, host
  // [V], valid until the next call. The slot computes with `adapters` (not
  // owned, must outlive the slot's use; null: the base alone) until its
  // next PrefillSlot. With `prompt_logits` set it is also given the logits
  // after every prompt position. Errors as Prefill's, and InvalidArgument
  // for adapters of another model shape, device or a rank above
  // max_lora_rank, or prompt_logits without GptDecoderOptions::prompt_logits;
  // the slot is then empty (position 0). REQUIRES: 0 <= slot < batch().
  Result<std::span<const float>> PrefillSlot(int slot, std::span<const int32_t> prompt,
                                             GptLoraAdapters* adapters = nullptr,
                                             const PromptLogitsFn& prompt_logits = nullptr);

  // Appends tokens[i] to slot slots[i] (distinct slots, host ids, one token
  // each) and returns the logits after them, host [slots.size(), V] in the
  // order of `slots`, valid until the next call. Slots not named keep their
  // state. FailedPrecondition for an empty slot (never prefilled, or
  // ResetSlot); InvalidArgument for a repeated slot, sizes that differ, a
  // slot whose context is full (naming Model.max_position_embeddings) or an
  // id out of range (naming Model.vocab_size); nothing changes on error.
  // REQUIRES: every slot in [0, batch()).
  Result<std::span<const float>> StepSlots(std::span<const int> slots,
                                           std::span<const int32_t> tokens);

  // Empties slot `slot` (position 0); its cache rows are overwritten by the
  // next PrefillSlot. REQUIRES: 0 <= slot < batch().
  void ResetSlot(int slot);

  // Tokens held by slot `slot` (prompt + steps); 0 when empty.
  int position(int slot) const { return positions_.at(slot); }
  // Tokens held per sequence after Prefill and Steps (slot 0's position).
  int position() const { return positions_[0]; }
  int batch() const { return options_.batch; }
  // Model.max_position_embeddings: position() never exceeds it.
  int max_positions() const { return model_->config().max_position_embeddings; }

 private:
  GptDecoder(GptModel* model, const GptDecoderOptions& options);
  Status CheckIds(std::span<const int32_t> ids) const;
  Status CheckPrompt(std::span<const int32_t> prompt) const;
  Status CheckAdapters(const GptLoraAdapters& adapters) const;
  // Feeds `prompt` (checked) to slot `slot` in prefill_chunk pieces; the
  // logits after its last token land in logits_host_ row 0, and those after
  // every position go to `prompt_logits` when set.
  void FeedPrompt(int slot, std::span<const int32_t> prompt,
                  const PromptLogitsFn& prompt_logits = nullptr);
  // Runs `slots.size()` slots' T new tokens each (device ids in tokens_,
  // slot after slot) at positions [positions_[s], positions_[s] + T) through
  // the model, writes the logits of each slot's last new position to
  // logits_host_ rows in the order of `slots` (with `all_rows`, of every
  // new row, to prompt_logits_host_; one slot only), and advances their
  // positions.
  void Forward(std::span<const int> slots, int T, bool all_rows = false);
  // Adds each adapted slot's LoRA term of target `t` in layer `l` to out
  // [N, out] given the GEMM's input inp [N, in], over `runs` of rows.
  struct AdapterRun {
    GptLoraAdapters* adapters;
    int first_row, rows;
  };
  void AddLora(std::span<const AdapterRun> runs, int l, LoraTarget t, const float* inp, float* out);
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
  std::shared_ptr<float> lora_scratch_;   // [rows_, max_lora_rank], when adapters may come
  std::shared_ptr<float> prompt_logits_;  // [prefill rows, V], with options.prompt_logits

  std::vector<float> logits_host_;          // [B, V]
  std::vector<float> prompt_logits_host_;   // [prefill rows, V], with options.prompt_logits
  std::vector<int> positions_;              // [B]: tokens each slot holds
  std::vector<GptLoraAdapters*> adapters_;  // [B]: each slot's, null for the base
  std::vector<int> all_slots_;              // 0, 1, ..., B-1
};

}  // namespace fleet::trainer
