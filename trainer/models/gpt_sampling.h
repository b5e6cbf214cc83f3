// Generation: choosing the next token from a model's logits, and the loop
// that decodes sequences with a GptDecoder (gpt_decoder.h).
//
//   TokenSampler     the interface: logits [V] -> a token id.
//   GreedySampler    argmax (decode_strategy greedy_search).
//   RandomSampler    decode_strategy sampling: logits / temperature, keep the
//                    top_k most likely, then the smallest most-likely set
//                    whose probability reaches top_p, renormalise, draw.
//                    O(V) per draw: no sort of the vocabulary.
//   GenerateTokens   prefill the prompt, then sample and step until
//                    end-of-text or max_dec_len, end-of-text masked before
//                    min_dec_len.
//
// Randomness comes only from the caller's std::mt19937_64, and a draw is
// computed from its raw 64-bit output (not a std:: distribution, whose
// algorithm the standard leaves open), so the same seed gives the same
// tokens on every machine with the same logits.
//
// Thread safety: samplers are immutable after construction and may be
// shared; the generator object (rng) is the caller's.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "trainer/models/gpt_decoder.h"

namespace fleet::trainer {

class TokenSampler {
 public:
  virtual ~TokenSampler() = default;
  // The next token for one sequence from its logits [V] (host). Logits of
  // -inf are never chosen (the generator masks end-of-text that way).
  // FailedPrecondition when no logit is finite (e.g. a model whose
  // parameters hold NaN).
  virtual Result<int32_t> Sample(std::span<const float> logits, std::mt19937_64* rng) const = 0;
};

// The highest logit; the lowest id among equal ones. Never uses rng.
class GreedySampler final : public TokenSampler {
 public:
  Result<int32_t> Sample(std::span<const float> logits, std::mt19937_64* rng) const override;
};

struct RandomSamplerOptions {
  // Generation.temperature, > 0: logits are divided by it before the softmax.
  // Towards 0 the draw becomes greedy; above 1 it flattens.
  double temperature = 1.0;
  // Generation.top_k, >= 0: keep only the k highest logits (0: all).
  int64_t top_k = 0;
  // Generation.top_p, in (0, 1]: then keep the smallest set of most likely
  // tokens whose probability (after top_k, renormalised) reaches p (1: all).
  double top_p = 1.0;
};

class RandomSampler final : public TokenSampler {
 public:
  // InvalidArgument naming Generation.<key> for a value out of range.
  static Result<std::unique_ptr<RandomSampler>> Create(const RandomSamplerOptions& options);

  // One candidate of the distribution a draw is made from.
  struct Candidate {
    int32_t id;
    double prob;
  };
  // The renormalised distribution after temperature, top_k and top_p, most
  // likely first (ties: lower id first); probabilities sum to 1. Empty when
  // no logit is finite. Sorts the candidates: the plain statement of the
  // rule, which tests hold Sample to.
  std::vector<Candidate> Distribution(std::span<const float> logits) const;

  // A draw from Distribution(logits) without sorting the vocabulary
  // (trainer/kernels/sampling_kernels.h): the largest logit in one pass;
  // with top_k the k best by partial selection, drawn most likely first;
  // otherwise every token's weight in one vectorised pass, the top_p cut by
  // quickselect on probability mass, and the draw by running weight in id
  // order. One generator output per draw. Thread-safe (per-thread scratch).
  Result<int32_t> Sample(std::span<const float> logits, std::mt19937_64* rng) const override;

 private:
  explicit RandomSampler(const RandomSamplerOptions& options) : options_(options) {}
  const RandomSamplerOptions options_;
};

// "greedy_search" -> GreedySampler; "sampling" -> RandomSampler(options),
// or GreedySampler at temperature 0 (sampling's limit as it cools, what
// OpenAI's API means by it). InvalidArgument naming
// Generation.decode_strategy otherwise, or those of RandomSampler::Create.
Result<std::unique_ptr<TokenSampler>> CreateTokenSampler(const std::string& decode_strategy,
                                                         const RandomSamplerOptions& options);

struct GenerateOptions {
  // Generation.min_dec_len: end-of-text cannot be drawn before this many
  // tokens were generated. >= 0.
  int64_t min_dec_len = 1;
  // Generation.max_dec_len: at most this many tokens per sequence. >= 1.
  int64_t max_dec_len = 200;
  // The end-of-text id (Tokenizer::eot_id()); generation of a sequence stops
  // when it is drawn and it is not part of the output. -1: no end-of-text.
  int32_t eot_id = -1;
  // Ids >= this are never drawn: a model's vocabulary may be padded beyond
  // the tokenizer's (GPT-2's 50257 ids to 50304) and those ids decode to
  // nothing. 0: every id of the model.
  int64_t vocab_limit = 0;
};

struct GeneratedTokens {
  // Per sequence (decoder->batch() of them): the generated ids after the
  // prompt, without the end-of-text.
  std::vector<std::vector<int32_t>> sequences;
  // True when generation stopped because the sequences filled the model's
  // context (Model.max_position_embeddings) before max_dec_len.
  bool context_full = false;
};

// The next token of one sequence that has `generated` tokens so far, from
// its logits [V]: ids >= options.vocab_limit and, while generated <
// options.min_dec_len, end-of-text are masked, then `sampler` draws from
// *rng. `scratch` holds the masked copy (reused between calls). The rule
// GenerateTokens applies to every token; gpt_serve applies it per request.
// Errors: FailedPrecondition from the sampler.
Result<int32_t> SampleNextToken(std::span<const float> logits, const TokenSampler& sampler,
                                std::mt19937_64* rng, int64_t generated,
                                const GenerateOptions& options, std::vector<float>* scratch);

// Feeds `prompt` to every sequence of `decoder` and extends each by sampled
// tokens until it draws end-of-text, has max_dec_len tokens, or the context
// is full. Sequences are drawn in order 0..B-1 at each step from *rng.
// Errors: InvalidArgument for options out of range (vocab_limit leaving no
// id besides end-of-text included) or those of
// GptDecoder::Prefill (empty prompt, longer than the context, bad id);
// FailedPrecondition from the sampler.
Result<GeneratedTokens> GenerateTokens(GptDecoder* decoder, const TokenSampler& sampler,
                                       std::mt19937_64* rng, std::span<const int32_t> prompt,
                                       const GenerateOptions& options);

}  // namespace fleet::trainer
