#include "trainer/models/gpt_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "trainer/kernels/fast_exp.h"
#include "trainer/kernels/sampling_kernels.h"

namespace fleet::trainer {
namespace {

Status NoFiniteLogit() {
  return Status::FailedPrecondition(
      "no finite logit to choose from (do the model's parameters hold NaN or inf?)");
}

// A uniform double in [0, 1) from the generator's raw output: 53 bits, the
// same on every standard library.
double Uniform(std::mt19937_64* rng) { return static_cast<double>((*rng)() >> 11) * 0x1.0p-53; }

}  // namespace

Result<int32_t> GreedySampler::Sample(std::span<const float> logits,
                                      std::mt19937_64* /*rng*/) const {
  const IndexedLogit best = MaxFinite(logits.data(), static_cast<int64_t>(logits.size()));
  if (best.index < 0) return NoFiniteLogit();
  return best.index;
}

Result<std::unique_ptr<RandomSampler>> RandomSampler::Create(const RandomSamplerOptions& options) {
  if (!(options.temperature > 0.0) || !std::isfinite(options.temperature)) {
    return Status::InvalidArgument(
        "temperature must be > 0, got " + std::to_string(options.temperature),
        "Generation.temperature");
  }
  if (options.top_k < 0) {
    return Status::InvalidArgument("top_k must be >= 0, got " + std::to_string(options.top_k),
                                   "Generation.top_k");
  }
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) {
    return Status::InvalidArgument("top_p must be in (0, 1], got " + std::to_string(options.top_p),
                                   "Generation.top_p");
  }
  return std::unique_ptr<RandomSampler>(new RandomSampler(options));
}

std::vector<RandomSampler::Candidate> RandomSampler::Distribution(
    std::span<const float> logits) const {
  // Scaled logits first (in `prob`), turned into probabilities below.
  std::vector<Candidate> c;
  c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) {
      c.push_back({static_cast<int32_t>(i), double{logits[i]} / options_.temperature});
    }
  }
  if (c.empty()) return c;
  const auto more_likely = [](const Candidate& a, const Candidate& b) {
    return a.prob > b.prob || (a.prob == b.prob && a.id < b.id);
  };
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < c.size()) {
    std::partial_sort(c.begin(), c.begin() + options_.top_k, c.end(), more_likely);
    c.resize(static_cast<size_t>(options_.top_k));
  } else {
    std::sort(c.begin(), c.end(), more_likely);
  }
  const double top = c.front().prob;
  double sum = 0.0;
  for (Candidate& x : c) {
    x.prob = std::exp(x.prob - top);
    sum += x.prob;
  }
  for (Candidate& x : c) x.prob /= sum;
  if (options_.top_p < 1.0) {
    double cum = 0.0;
    size_t keep = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
      cum += c[i].prob;
      if (cum >= options_.top_p) {
        keep = i + 1;
        break;
      }
    }
    c.resize(keep);
    for (Candidate& x : c) x.prob /= cum;
  }
  return c;
}

namespace {

// The row buffers of one thread's draws, reused (a server samples several
// sequences' rows at once, one per thread).
struct SampleScratch {
  std::vector<float> weights;
  std::vector<double> block_sums, kept_weights;
  std::vector<IndexedLogit> candidates, kept;
};
SampleScratch& ThreadScratch() {
  thread_local SampleScratch scratch;
  return scratch;
}

// Among candidates [first, last), in the order MoreLikely, the one at which
// the running mass (weights[index], most likely first) reaches `target`:
// mass(more likely ones) < target <= that + its own. The last one when
// rounding leaves target above the total. Quickselect by mass: each round
// partitions around a pivot and keeps the side holding the target, O(n)
// expected, without sorting. REQUIRES: first < last.
IndexedLogit FindByMass(IndexedLogit* first, IndexedLogit* last, const float* weights,
                        double target) {
  while (last - first > 1) {
    // Median of three by MoreLikely, moved to the end as the pivot.
    IndexedLogit* mid = first + (last - first) / 2;
    IndexedLogit* end = last - 1;
    if (MoreLikely(*mid, *first)) std::swap(*mid, *first);
    if (MoreLikely(*end, *first)) std::swap(*end, *first);
    if (MoreLikely(*mid, *end)) std::swap(*mid, *end);
    const IndexedLogit pivot = *end;
    IndexedLogit* store = first;
    double better_mass = 0.0;
    for (IndexedLogit* it = first; it != end; ++it) {
      if (MoreLikely(*it, pivot)) {
        better_mass += weights[it->index];
        std::swap(*it, *store++);
      }
    }
    std::swap(*store, *end);  // the pivot between the two sides
    const double pivot_mass = weights[pivot.index];
    if (target <= better_mass && store != first) {
      last = store;
    } else if (target <= better_mass + pivot_mass || store + 1 == last) {
      return pivot;
    } else {
      target -= better_mass + pivot_mass;
      first = store + 1;
    }
  }
  return *first;
}

}  // namespace

// One O(V) pass for the largest logit, then either a small candidate set
// (top_k) or the whole row's weights, never a sort of the vocabulary.
// Distribution() above is the same rule written plainly (its oracle).
Result<int32_t> RandomSampler::Sample(std::span<const float> logits, std::mt19937_64* rng) const {
  const auto n = static_cast<int64_t>(logits.size());
  const IndexedLogit top = MaxFinite(logits.data(), n);
  if (top.index < 0) return NoFiniteLogit();
  const auto scale = static_cast<float>(1.0 / options_.temperature);
  // So cold that every other weight is 0: the draw is the argmax.
  if (!std::isfinite(scale)) return top.index;
  SampleScratch& s = ThreadScratch();
  const double u = Uniform(rng);

  if (options_.top_k > 0 && options_.top_k < n) {
    // The k best, most likely first; weights, the top_p cut and the draw
    // over them in that order, as Distribution() has them.
    TopK(logits.data(), n, options_.top_k, &s.candidates, &s.kept);
    std::vector<double>& w = s.kept_weights;
    w.resize(s.kept.size());
    double total = 0.0;
    for (size_t i = 0; i < s.kept.size(); ++i) {
      w[i] = ExpF((s.kept[i].value - top.value) * scale);
      total += w[i];
    }
    size_t keep = s.kept.size();
    if (options_.top_p < 1.0) {
      double running = 0.0;
      for (size_t i = 0; i < s.kept.size(); ++i) {
        running += w[i];
        if (running >= options_.top_p * total) {
          keep = i + 1;
          total = running;
          break;
        }
      }
    }
    const double target = u * total;
    double running = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      running += w[i];
      if (target < running) return s.kept[i].index;
    }
    for (size_t i = keep; i-- > 0;)
      if (w[i] > 0.0) return s.kept[i].index;
    return s.kept.front().index;
  }

  s.weights.resize(logits.size());
  s.block_sums.resize(SampleBlocks(n));
  double total =
      ExpWeights(logits.data(), n, scale, top.value, s.weights.data(), s.block_sums.data());
  if (options_.top_p < 1.0) {
    // The nucleus: the least likely candidate it keeps, then every weight
    // below it zeroed.
    s.candidates.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (s.weights[i] > 0.0f) s.candidates.push_back({static_cast<int32_t>(i), logits[i]});
    }
    const IndexedLogit cut =
        FindByMass(s.candidates.data(), s.candidates.data() + s.candidates.size(), s.weights.data(),
                   options_.top_p * total);
    for (int64_t i = 0; i < n; ++i) {
      if (MoreLikely(cut, {static_cast<int32_t>(i), logits[i]})) s.weights[i] = 0.0f;
    }
    total = BlockSums(s.weights.data(), n, s.block_sums.data());
  }
  const int64_t id = FindByRunningWeight(s.weights.data(), s.block_sums.data(), n, u * total);
  return static_cast<int32_t>(id >= 0 ? id : top.index);
}

Result<std::unique_ptr<TokenSampler>> CreateTokenSampler(const std::string& decode_strategy,
                                                         const RandomSamplerOptions& options) {
  // Temperature 0 is the limit of sampling ever colder: the argmax.
  if (decode_strategy == "greedy_search" ||
      (decode_strategy == "sampling" && options.temperature == 0.0)) {
    return std::unique_ptr<TokenSampler>(new GreedySampler);
  }
  if (decode_strategy == "sampling") {
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<RandomSampler> s, RandomSampler::Create(options));
    return std::unique_ptr<TokenSampler>(std::move(s));
  }
  return Status::InvalidArgument(
      "unknown decode strategy \"" + decode_strategy + "\" (sampling or greedy_search)",
      "Generation.decode_strategy");
}

Result<int32_t> SampleNextToken(std::span<const float> logits, const TokenSampler& sampler,
                                std::mt19937_64* rng, int64_t generated,
                                const GenerateOptions& options, std::vector<float>* scratch) {
  const size_t V = logits.size();
  const bool has_eot = options.eot_id >= 0 && static_cast<size_t>(options.eot_id) < V;
  const size_t limit =
      options.vocab_limit > 0 ? std::min(V, static_cast<size_t>(options.vocab_limit)) : V;
  const bool mask_eot = has_eot && generated < options.min_dec_len;
  if (!mask_eot && limit == V) return sampler.Sample(logits, rng);
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  scratch->assign(logits.begin(), logits.end());
  std::fill(scratch->begin() + limit, scratch->end(), kNever);
  if (mask_eot) (*scratch)[options.eot_id] = kNever;
  return sampler.Sample(*scratch, rng);
}

Result<GeneratedTokens> GenerateTokens(GptDecoder* decoder, const TokenSampler& sampler,
                                       std::mt19937_64* rng, std::span<const int32_t> prompt,
                                       const GenerateOptions& options) {
  if (options.min_dec_len < 0) {
    return Status::InvalidArgument(
        "min_dec_len must be >= 0, got " + std::to_string(options.min_dec_len),
        "Generation.min_dec_len");
  }
  if (options.max_dec_len < 1) {
    return Status::InvalidArgument(
        "max_dec_len must be >= 1, got " + std::to_string(options.max_dec_len),
        "Generation.max_dec_len");
  }
  FLEET_ASSIGN_OR_RETURN(std::span<const float> logits, decoder->Prefill(prompt));
  const size_t B = decoder->batch(), V = logits.size() / B;
  const bool has_eot = options.eot_id >= 0 && static_cast<size_t>(options.eot_id) < V;
  const size_t limit =
      options.vocab_limit > 0 ? std::min(V, static_cast<size_t>(options.vocab_limit)) : V;
  if (limit < 2 && has_eot) {
    return Status::InvalidArgument("vocab_limit " + std::to_string(options.vocab_limit) +
                                   " leaves no token to generate");
  }
  GeneratedTokens out;
  out.sequences.resize(B);
  std::vector<char> done(B, 0);
  // The token each sequence is fed next; a finished sequence keeps feeding
  // its last one (any valid id: its logits are no longer read).
  std::vector<int32_t> next(B, 0);
  std::vector<float> scratch;
  for (int64_t step = 0;; ++step) {
    for (size_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      FLEET_ASSIGN_OR_RETURN(int32_t token, SampleNextToken(logits.subspan(b * V, V), sampler, rng,
                                                            step, options, &scratch));
      if (has_eot && token == options.eot_id) {
        done[b] = 1;
        continue;
      }
      out.sequences[b].push_back(token);
      next[b] = token;
      if (static_cast<int64_t>(out.sequences[b].size()) >= options.max_dec_len) done[b] = 1;
    }
    if (std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) break;
    if (decoder->position() >= decoder->max_positions()) {
      out.context_full = true;
      break;
    }
    FLEET_ASSIGN_OR_RETURN(logits, decoder->Step(next));
  }
  return out;
}

}  // namespace fleet::trainer
