// Token sampling and the generation loop: the row kernels equal their plain
// statements; greedy is the argmax; top-k never leaves the k best; top-p
// keeps the smallest set reaching p; temperature towards 0 becomes greedy
// (and 0 is greedy); draws follow the renormalised distribution (chi-square
// over many draws with a fixed seed, on the top-k path and the whole-row
// path); the same seed gives the same tokens; GenerateTokens honours
// min_dec_len, max_dec_len, end-of-text and the model's context.
#include "trainer/models/gpt_sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/sampling_kernels.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_decoder.h"

namespace fleet::trainer {
namespace {

using testing::RandomVector;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::unique_ptr<RandomSampler> Sampler(double temperature, int64_t top_k, double top_p) {
  auto s = RandomSampler::Create({.temperature = temperature, .top_k = top_k, .top_p = top_p});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(*s);
}

std::vector<float> LogProbs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

TEST(SamplingKernels, EqualTheirPlainStatements) {
  std::vector<float> x = RandomVector(1000, 17, -6.0f, 6.0f);
  x[5] = -kInf;
  x[300] = NAN;
  x[999] = kInf;
  const int64_t n = static_cast<int64_t>(x.size());
  float max = -kInf;
  int32_t argmax = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i]) && x[i] > max) {
      max = x[i];
      argmax = i;
    }
  }
  const IndexedLogit top = MaxFinite(x.data(), n);
  EXPECT_EQ(top.index, argmax);
  EXPECT_EQ(top.value, max);

  const float scale = 0.7f;
  std::vector<float> w(n);
  std::vector<double> blocks(SampleBlocks(n));
  const double total = ExpWeights(x.data(), n, scale, max, w.data(), blocks.data());
  double plain_total = 0.0;
  std::vector<double> running;  // the running sum in index order
  for (int64_t i = 0; i < n; ++i) {
    const double want = std::isfinite(x[i]) ? std::exp(double{scale} * (x[i] - max)) : 0.0;
    ASSERT_NEAR(w[i], want, 2e-6 * want + 1e-30) << i;  // float arguments
    plain_total += w[i];
    running.push_back(plain_total);
  }
  EXPECT_NEAR(total, plain_total, 1e-9 * plain_total);
  // The draw: the first index whose running sum passes the target.
  std::mt19937_64 rng(2);
  for (int t = 0; t < 200; ++t) {
    const double target = std::uniform_real_distribution<double>(0, total)(rng);
    const int64_t want = std::upper_bound(running.begin(), running.end(), target) - running.begin();
    const int64_t got = FindByRunningWeight(w.data(), blocks.data(), n, target);
    // Sums in another order may differ in the last bits: a neighbour at most.
    EXPECT_LE(std::abs(got - want), 1) << target;
    EXPECT_GT(w[got], 0.0f);
  }
  EXPECT_EQ(FindByRunningWeight(w.data(), blocks.data(), n, total * 2), 998);  // last weighted
  std::vector<float> zero(10, 0.0f);
  std::vector<double> zero_blocks(1, 0.0);
  EXPECT_EQ(FindByRunningWeight(zero.data(), zero_blocks.data(), 10, 0.0), -1);

  double plain_lse = 0.0;
  for (float v : x) plain_lse += std::isfinite(v) ? std::exp(double{v} - max) : 0.0;
  EXPECT_NEAR(LogSumExp(x.data(), n, w.data(), blocks.data()), max + std::log(plain_lse), 1e-5);

  std::vector<IndexedLogit> scratch, best;
  TopK(x.data(), n, 7, &scratch, &best);
  std::vector<IndexedLogit> sorted;
  for (int32_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) sorted.push_back({i, x[i]});
  }
  std::sort(sorted.begin(), sorted.end(), MoreLikely);
  ASSERT_EQ(best.size(), 7u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(best[i].index, sorted[i].index);
  TopK(x.data(), n, 5000, &scratch, &best);
  EXPECT_EQ(best.size(), sorted.size());
}

TEST(GreedySampler, PicksTheArgmax) {
  GreedySampler g;
  std::mt19937_64 rng(1);
  EXPECT_EQ(*g.Sample(std::vector<float>{0.1f, 2.0f, -3.0f, 1.9f}, &rng), 1);
  EXPECT_EQ(*g.Sample(std::vector<float>{5.0f, 1.0f, 5.0f}, &rng), 0);       // ties: lowest id
  EXPECT_EQ(*g.Sample(std::vector<float>{kInf, 1.0f, NAN, 0.5f}, &rng), 1);  // not finite: skipped
  EXPECT_EQ(*g.Sample(std::vector<float>{-kInf, -7.0f}, &rng), 1);
  for (int i = 0; i < 20; ++i) {
    const auto logits = RandomVector(100, 10 + i, -5.0f, 5.0f);
    EXPECT_EQ(*g.Sample(logits, &rng),
              std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  EXPECT_TRUE(g.Sample(std::vector<float>{NAN, -kInf}, &rng).status().code() ==
              StatusCode::kFailedPrecondition);
}

TEST(RandomSampler, RejectsOptionsOutOfRange) {
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(RandomSampler::Create({.temperature = 0.0}).status(),
                                               "Generation.temperature"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(RandomSampler::Create({.top_k = -1}).status(),
                                               "Generation.top_k"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(RandomSampler::Create({.top_p = 0.0}).status(),
                                               "Generation.top_p"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(RandomSampler::Create({.top_p = 1.5}).status(),
                                               "Generation.top_p"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(CreateTokenSampler("beam_search", {}).status(),
                                               "Generation.decode_strategy"));
  EXPECT_TRUE(CreateTokenSampler("greedy_search", {}).ok());
  EXPECT_TRUE(CreateTokenSampler("sampling", {}).ok());
  // Temperature 0 is the argmax, not an error.
  auto zero = CreateTokenSampler("sampling", {.temperature = 0.0});
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  std::mt19937_64 rng(1);
  EXPECT_EQ(*(*zero)->Sample(std::vector<float>{0.1f, 2.0f, 1.9f}, &rng), 1);
}

TEST(RandomSampler, TopKNeverLeavesTheKBest) {
  const auto logits = RandomVector(50, 3, -2.0f, 2.0f);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int64_t k : {1, 3, 10}) {
    auto s = Sampler(1.0, k, 1.0);
    const std::vector<int32_t> best(order.begin(), order.begin() + k);
    const auto dist = s->Distribution(logits);
    ASSERT_EQ(dist.size(), size_t(k));
    for (size_t i = 0; i < dist.size(); ++i) EXPECT_EQ(dist[i].id, best[i]) << "k " << k;
    std::mt19937_64 rng(9);
    for (int i = 0; i < 5000; ++i) {
      const int32_t t = *s->Sample(logits, &rng);
      ASSERT_NE(std::find(best.begin(), best.end(), t), best.end()) << "k " << k << " drew " << t;
    }
  }
}

TEST(RandomSampler, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at ids 2, 0, 3, 1.
  const auto logits = LogProbs({0.3, 0.05, 0.5, 0.15});
  const auto ids = [&](double p) {
    std::vector<int32_t> out;
    for (const auto& c : Sampler(1.0, 0, p)->Distribution(logits)) out.push_back(c.id);
    return out;
  };
  EXPECT_EQ(ids(0.4), (std::vector<int32_t>{2}));
  EXPECT_EQ(ids(0.75), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(ids(0.9), (std::vector<int32_t>{2, 0, 3}));
  EXPECT_EQ(ids(0.97), (std::vector<int32_t>{2, 0, 3, 1}));
  EXPECT_EQ(ids(1.0), (std::vector<int32_t>{2, 0, 3, 1}));
  // Renormalised over what is kept.
  const auto d = Sampler(1.0, 0, 0.75)->Distribution(logits);
  EXPECT_NEAR(d[0].prob, 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(d[1].prob, 0.3 / 0.8, 1e-6);
  // After top-k (2 and 0 kept, renormalised to 0.625 / 0.375), p = 0.6 keeps one.
  EXPECT_EQ(Sampler(1.0, 2, 0.6)->Distribution(logits).size(), 1u);
}

TEST(RandomSampler, TemperatureTowardsZeroIsGreedy) {
  const auto logits = RandomVector(200, 5, -1.0f, 1.0f);
  const int32_t argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  double prev_top = 0.0;
  for (double t : {2.0, 1.0, 0.3, 0.1, 0.01, 1e-4}) {
    const auto d = Sampler(t, 0, 1.0)->Distribution(logits);
    EXPECT_EQ(d.front().id, argmax);
    EXPECT_GT(d.front().prob, prev_top) << "temperature " << t;
    prev_top = d.front().prob;
  }
  EXPECT_GT(prev_top, 1.0 - 1e-9);
  auto cold = Sampler(1e-4, 0, 1.0);
  std::mt19937_64 rng(4);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(*cold->Sample(logits, &rng), argmax);
}

// Draws follow the distribution temperature, top-k and top-p leave, and that
// distribution is the one computed here from the logits directly.
TEST(RandomSampler, FrequenciesMatchTheRenormalisedDistribution) {
  const auto logits = RandomVector(12, 21, -1.5f, 1.5f);
  const double temperature = 0.8, top_p = 0.85;
  const int64_t top_k = 8;
  // Expected: softmax(logits / T) over the 8 best, then the smallest prefix reaching p.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  order.resize(top_k);
  std::vector<double> p;
  for (int32_t id : order) p.push_back(std::exp(logits[id] / temperature));
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  size_t keep = 0;
  double cum = 0.0;
  while (cum < top_p) cum += p[keep++] / z;
  order.resize(keep);

  auto s = Sampler(temperature, top_k, top_p);
  const auto dist = s->Distribution(logits);
  ASSERT_EQ(dist.size(), keep);
  std::map<int32_t, double> want;
  for (size_t i = 0; i < keep; ++i) {
    EXPECT_EQ(dist[i].id, order[i]);
    want[order[i]] = p[i] / z / cum;
    EXPECT_NEAR(dist[i].prob, want[order[i]], 1e-9);
  }
  ASSERT_GE(keep, 3u);  // a distribution worth testing

  const int draws = 200000;
  std::map<int32_t, int> count;
  std::mt19937_64 rng(12345);
  for (int i = 0; i < draws; ++i) ++count[*s->Sample(logits, &rng)];
  double chi2 = 0.0;
  for (const auto& [id, n] : count) {
    ASSERT_TRUE(want.count(id)) << "drew " << id << ", outside the kept set";
  }
  for (const auto& [id, q] : want) {
    const double e = q * draws, o = count[id];
    chi2 += (o - e) * (o - e) / e;
  }
  // keep - 1 <= 7 degrees of freedom: P(chi2 > 30) < 1e-4.
  EXPECT_LT(chi2, 30.0) << keep << " candidates";
}

// The whole-row path (no top_k): the top_p cut found by quickselect on
// mass keeps exactly Distribution()'s set, and draws follow it.
TEST(RandomSampler, TopPOverTheWholeRowFollowsTheDistribution) {
  const auto logits = RandomVector(40, 33, -2.0f, 2.0f);
  auto s = Sampler(0.8, 0, 0.85);
  const auto dist = s->Distribution(logits);
  ASSERT_GE(dist.size(), 5u);
  ASSERT_LT(dist.size(), 40u);
  std::map<int32_t, double> want;
  for (const auto& c : dist) want[c.id] = c.prob;
  const int draws = 200000;
  std::map<int32_t, int> count;
  std::mt19937_64 rng(777);
  for (int i = 0; i < draws; ++i) ++count[*s->Sample(logits, &rng)];
  for (const auto& [id, n] : count) ASSERT_TRUE(want.count(id)) << "drew " << id;
  double chi2 = 0.0;
  for (const auto& [id, q] : want) {
    const double e = q * draws, o = count[id];
    chi2 += (o - e) * (o - e) / e;
  }
  // Fewer than 40 degrees of freedom: P(chi2 > 80) < 1e-4.
  EXPECT_LT(chi2, 80.0) << dist.size() << " candidates";
}

TEST(RandomSampler, SameSeedSameTokens) {
  const auto logits = RandomVector(30, 8, -1.0f, 1.0f);
  auto s = Sampler(1.0, 0, 1.0);
  const auto draw = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(*s->Sample(logits, &rng));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

// ---- GenerateTokens over a tiny model -----------------------------------------------------

// A model whose every next-token argmax is `eot` (ln_f outputs wte[eot]
// whatever its input), so the loop's handling of end-of-text shows.
struct EotModel {
  static constexpr int kEot = 5;
  EotModel() : kernels(nullptr) {
    GptConfig c;
    c.vocab_size = 11;
    c.max_position_embeddings = 12;
    c.hidden_size = 8;
    c.num_attention_heads = 2;
    c.num_layers = 1;
    model = std::move(GptModel::Create(c, &backend, &kernels).value());
    ParamArena& a = model->arena();
    std::vector<float> p = a.ParamsToHost();
    const size_t wte = 0, lnfw = *a.Find("ln_f.weight"), lnfb = *a.Find("ln_f.bias");
    const size_t C = c.hidden_size;
    for (size_t i = 0; i < C; ++i) {
      p[wte + kEot * C + i] = 3.0f;
      p[a.offset(lnfw) + i] = 0.0f;
      p[a.offset(lnfb) + i] = 3.0f;
    }
    CHECK(a.ParamsFromHost(p).ok());
  }
  CpuBackend backend;
  CpuGptKernels kernels;
  std::unique_ptr<GptModel> model;
};

TEST(GenerateTokens, HonoursMinAndMaxDecLenAndEndOfText) {
  EotModel m;
  auto d = std::move(GptDecoder::Create(m.model.get(), {.batch = 2}).value());
  GreedySampler greedy;
  auto sampling = Sampler(1.0, 3, 1.0);
  const std::vector<int32_t> prompt = {1, 2};
  const auto run = [&](const TokenSampler& s, int64_t min_len, int64_t max_len, int32_t eot) {
    std::mt19937_64 rng(3);
    auto r = GenerateTokens(d.get(), s, &rng, prompt,
                            {.min_dec_len = min_len, .max_dec_len = max_len, .eot_id = eot});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(*r);
  };
  for (const TokenSampler* s : {static_cast<const TokenSampler*>(&greedy),
                                static_cast<const TokenSampler*>(sampling.get())}) {
    // End-of-text is the argmax: drawn at once unless masked.
    auto r = run(*s, 0, 8, EotModel::kEot);
    EXPECT_TRUE(r.sequences[0].empty());
    r = run(*s, 3, 8, EotModel::kEot);
    for (const auto& seq : r.sequences) {
      EXPECT_EQ(seq.size(), 3u);
      EXPECT_EQ(std::count(seq.begin(), seq.end(), EotModel::kEot), 0);
    }
    r = run(*s, 6, 2, EotModel::kEot);
    EXPECT_EQ(r.sequences[1].size(), 2u);
    EXPECT_FALSE(r.context_full);
  }
  // Without an end-of-text id: max_dec_len tokens, or until the context is
  // full (12 positions: 10 fed after the prompt, 11 drawn).
  auto r = run(greedy, 0, 4, -1);
  EXPECT_EQ(r.sequences[0], std::vector<int32_t>(4, EotModel::kEot));
  EXPECT_FALSE(r.context_full);
  r = run(greedy, 0, 100, -1);
  EXPECT_EQ(r.sequences[0].size(), 11u);
  EXPECT_TRUE(r.context_full);

  // Ids at or beyond vocab_limit are never drawn (ids 6..10 here, the
  // argmax 5 being masked as end-of-text while min_dec_len lasts).
  for (const TokenSampler* s : {static_cast<const TokenSampler*>(&greedy),
                                static_cast<const TokenSampler*>(sampling.get())}) {
    std::mt19937_64 rng(5);
    auto limited = GenerateTokens(
        d.get(), *s, &rng, prompt,
        {.min_dec_len = 8, .max_dec_len = 8, .eot_id = EotModel::kEot, .vocab_limit = 6});
    ASSERT_TRUE(limited.ok()) << limited.status().ToString();
    for (const auto& seq : limited->sequences) {
      EXPECT_EQ(seq.size(), 8u);
      for (int32_t t : seq) EXPECT_LT(t, EotModel::kEot);
    }
  }

  std::mt19937_64 rng(1);
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(
      GenerateTokens(d.get(), greedy, &rng, prompt, {.max_dec_len = 0}).status(),
      "Generation.max_dec_len"));
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(
      GenerateTokens(d.get(), greedy, &rng, std::vector<int32_t>(13, 1), {}).status(),
      "Model.max_position_embeddings"));
}

}  // namespace
}  // namespace fleet::trainer
