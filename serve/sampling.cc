#include "serve/sampling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "trainer/kernels/sampling_kernels.h"

namespace fleet::serve {
namespace {

// One thread's row buffers (the scheduler samples rows on several threads).
struct RowScratch {
  std::vector<float> row, weights;
  std::vector<double> block_sums;
  std::vector<trainer::IndexedLogit> candidates, top;
};
RowScratch& ThreadScratch() {
  thread_local RowScratch scratch;
  return scratch;
}

Status OutOfRange(const std::string& key, const std::string& range, double value) {
  return Status::InvalidArgument(key + " must be in " + range + ", got " + std::to_string(value));
}

}  // namespace

TokenLogprob LogprobsOf(std::span<const float> logits, int64_t vocab_limit, int32_t token,
                        int top) {
  RowScratch& s = ThreadScratch();
  const int64_t n = std::min<int64_t>(vocab_limit, logits.size());
  s.weights.resize(n);
  s.block_sums.resize(trainer::SampleBlocks(n));
  const double lse = trainer::LogSumExp(logits.data(), n, s.weights.data(), s.block_sums.data());
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(logits[token] - lse);
  if (top > 0) {
    trainer::TopK(logits.data(), n, top, &s.candidates, &s.top);
    for (const trainer::IndexedLogit& c : s.top) {
      out.top.push_back({c.index, static_cast<float>(c.value - lse)});
    }
  }
  return out;
}

Result<std::unique_ptr<SequenceSampler>> SequenceSampler::Create(const SamplingParams& params,
                                                                 int64_t vocab_limit) {
  if (!(params.temperature >= 0 && params.temperature <= 2)) {
    return OutOfRange("temperature", "[0, 2]", params.temperature);
  }
  if (!(params.presence_penalty >= -2 && params.presence_penalty <= 2)) {
    return OutOfRange("presence_penalty", "[-2, 2]", params.presence_penalty);
  }
  if (!(params.frequency_penalty >= -2 && params.frequency_penalty <= 2)) {
    return OutOfRange("frequency_penalty", "[-2, 2]", params.frequency_penalty);
  }
  if (params.top_logprobs < -1 || params.top_logprobs > kMaxTopLogprobs) {
    return OutOfRange("top_logprobs", "[0, " + std::to_string(kMaxTopLogprobs) + "]",
                      params.top_logprobs);
  }
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= vocab_limit) {
      return Status::InvalidArgument("logit_bias: token " + std::to_string(token) +
                                     " is outside [0, " + std::to_string(vocab_limit) + ")");
    }
    if (!(bias >= -100 && bias <= 100)) return OutOfRange("logit_bias values", "[-100, 100]", bias);
  }
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::TokenSampler> sampler,
                         trainer::CreateTokenSampler("sampling", {.temperature = params.temperature,
                                                                  .top_k = params.top_k,
                                                                  .top_p = params.top_p}));
  return std::unique_ptr<SequenceSampler>(
      new SequenceSampler(params, vocab_limit, std::move(sampler)));
}

SequenceSampler::SequenceSampler(const SamplingParams& params, int64_t vocab_limit,
                                 std::unique_ptr<trainer::TokenSampler> sampler)
    : params_(params), vocab_limit_(vocab_limit), sampler_(std::move(sampler)), rng_(params.seed) {}

Result<int32_t> SequenceSampler::Next(std::span<const float> logits, TokenLogprob* logprob) {
  std::span<const float> row = logits.first(std::min<size_t>(vocab_limit_, logits.size()));
  const bool penalised = params_.presence_penalty != 0 || params_.frequency_penalty != 0;
  if (!params_.logit_bias.empty() || (penalised && !counts_.empty())) {
    // A copy with the few adjusted logits; the rest of the row as it is.
    std::vector<float>& copy = ThreadScratch().row;
    copy.assign(row.begin(), row.end());
    for (const auto& [token, bias] : params_.logit_bias) copy[token] += bias;
    if (penalised) {
      for (const auto& [token, count] : counts_) {
        copy[token] -=
            static_cast<float>(count * params_.frequency_penalty + params_.presence_penalty);
      }
    }
    row = copy;
  }
  FLEET_ASSIGN_OR_RETURN(int32_t token, sampler_->Sample(row, &rng_));
  if (penalised) ++counts_[token];
  if (params_.top_logprobs >= 0 && logprob != nullptr) {
    *logprob = LogprobsOf(logits, vocab_limit_, token, params_.top_logprobs);
  }
  return token;
}

}  // namespace fleet::serve
