// Supervised fine-tuning data: JSONL files of prompt/response pairs, one
// JSON object a line,
//   {"prompt": "Q: 2+3=", "response": " 5"}
// (other fields are ignored; blank lines are skipped), as a GptSamples the
// GPT task trains on with the loss on the response tokens only.
//
// How a pair becomes a sample. ids = Encode(prompt) + Encode(response) +
// [end-of-text] (prompt and response tokenized apart, so the boundary is
// where the loss starts; end-of-text teaches the model to stop). The
// inputs are ids[0 .. T) and the targets ids[1 .. T], with target -1 (no
// loss) at every position whose next token belongs to the prompt, and at
// the padding after the pair (inputs padded with end-of-text). A pair
// longer than T + 1 tokens keeps its first T + 1: the response is cut, never
// the prompt. One pair a sample: pairs are not packed together, because
// attention here has no mask between documents, and a packed pair would see
// the one before it.
//
// Parts. The pairs of all files, in order, are cut into train / eval /
// test parts by count in proportion to the split weights (as GptDataset
// cuts documents).
//
// Errors name the file and line ("data/sft.jsonl:17: ...") for a line that
// is not a JSON object, lacks a string "prompt" or "response", or whose
// prompt leaves no room in T for a single response token.
//
// Thread safety: immutable after Open.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"

namespace fleet::data {

struct PromptResponseOptions {
  // Tokens per sequence T (Data.*.dataset.max_seq_len), >= 1.
  int64_t seq_len = 1024;
  // Model.vocab_size; the tokenizer's ids must be below it.
  int64_t vocab_size = 50304;
  // Split weights and which part to read (0 train, 1 eval, 2 test).
  std::vector<double> split = {1, 0, 0};
  int part = 0;
};

class PromptResponseDataset final : public GptSamples {
 public:
  // Reads and tokenizes every pair of `files` (plain or gzip). Errors:
  // NotFound / IOError for a file; InvalidArgument naming file:line as
  // above; InvalidArgument for a tokenizer whose ids exceed vocab_size
  // (naming Model.vocab_size) or a part without pairs.
  static Result<std::unique_ptr<PromptResponseDataset>> Open(const std::vector<std::string>& files,
                                                             const Tokenizer& tokenizer,
                                                             const PromptResponseOptions& options);

  int64_t num_samples() const override { return static_cast<int64_t>(prompt_tokens_.size()); }
  int64_t seq_len() const override { return options_.seq_len; }
  int64_t vocab_size() const override { return options_.vocab_size; }
  Status ReadInputsAndTargets(std::span<const int64_t> ids, int32_t* tokens,
                              int32_t* targets) const override;

  // Pair i's ids (prompt, response, end-of-text; cut to T + 1) and how many
  // of them are the prompt's. For tests and inspection.
  std::span<const int32_t> pair_ids(int64_t i) const {
    return std::span<const int32_t>(ids_).subspan(starts_[i], starts_[i + 1] - starts_[i]);
  }
  int64_t prompt_tokens(int64_t i) const { return prompt_tokens_[i]; }

 private:
  PromptResponseDataset(const PromptResponseOptions& options, int32_t pad)
      : options_(options), pad_(pad) {}

  const PromptResponseOptions options_;
  const int32_t pad_;                   // end-of-text, the inputs' padding
  std::vector<int32_t> ids_;            // every pair's ids back to back
  std::vector<int64_t> starts_{0};      // offset of each pair in ids_, then ids_.size()
  std::vector<int64_t> prompt_tokens_;  // per pair
};

}  // namespace fleet::data
