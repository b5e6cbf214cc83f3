// How one served sequence chooses its tokens: OpenAI's sampling fields over
// the samplers gpt_generate uses (trainer/models/gpt_sampling.h), at the
// cost of what they keep.
//
//   logit_bias          added to the named tokens' logits
//   presence_penalty    subtracted once from the logit of every token
//                       generated so far
//   frequency_penalty   subtracted from it once per time generated
//   temperature/top_k/top_p  then the draw (temperature 0: the argmax)
//
// Bias and penalties touch only the tokens they name (a sparse list, kept
// per sequence), in a copy of the row made only when there are any; the
// draw is O(V) (no sort of the vocabulary). Log-probabilities are the
// model's own, log-softmax of the raw logits over the tokenizer's ids
// (before bias, penalties and temperature, as vLLM reports them), with the
// `top` most likely tokens by partial selection.
//
// Randomness: the sequence's own mt19937_64, seeded once, so a seeded
// request gives the same tokens whatever it is batched with.
//
// Thread safety: a SequenceSampler is one sequence's (one thread at a
// time); different sequences' samplers run on different threads at once
// (the scheduler samples a batch's rows in parallel).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "comm/status.h"
#include "trainer/models/gpt_sampling.h"

namespace fleet::serve {

struct SamplingParams {
  double temperature = 1.0;        // [0, 2]; 0: the most likely token
  int64_t top_k = 0;               // >= 0; 0: every token
  double top_p = 1.0;              // (0, 1]
  double presence_penalty = 0.0;   // [-2, 2]
  double frequency_penalty = 0.0;  // [-2, 2]
  // (token, bias in [-100, 100]), each token once.
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  // -1: no log-probabilities; 0..kMaxTopLogprobs: the chosen token's and
  // this many most likely alternatives at each position.
  int top_logprobs = -1;
  uint64_t seed = 0;
};

inline constexpr int kMaxTopLogprobs = 20;

// One position's log-probabilities.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top = {};  // most likely first
};

// log-softmax(logits[0, vocab_limit)) at `token`, and the `top` most likely
// (ties: lower id first). O(V); `token` < vocab_limit.
TokenLogprob LogprobsOf(std::span<const float> logits, int64_t vocab_limit, int32_t token, int top);

class SequenceSampler {
 public:
  // Ids >= vocab_limit (a model's padded vocabulary) are never drawn.
  // InvalidArgument for values out of the ranges above.
  static Result<std::unique_ptr<SequenceSampler>> Create(const SamplingParams& params,
                                                         int64_t vocab_limit);

  // The next token from logits [V] (V >= vocab_limit), remembered for the
  // penalties; with params.top_logprobs >= 0 its log-probabilities go to
  // *logprob. FailedPrecondition when no logit is finite.
  Result<int32_t> Next(std::span<const float> logits, TokenLogprob* logprob);

  bool wants_logprobs() const { return params_.top_logprobs >= 0; }

 private:
  SequenceSampler(const SamplingParams& params, int64_t vocab_limit,
                  std::unique_ptr<trainer::TokenSampler> sampler);

  const SamplingParams params_;
  const int64_t vocab_limit_;
  const std::unique_ptr<trainer::TokenSampler> sampler_;
  std::mt19937_64 rng_;
  absl::flat_hash_map<int32_t, int32_t> counts_;  // token -> times generated
};

}  // namespace fleet::serve
