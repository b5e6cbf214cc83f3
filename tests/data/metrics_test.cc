#include "data/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace fleet::data {
namespace {

// O(n^2) definition: P(score of a positive > score of a negative), ties 1/2.
double PairwiseAuc(const std::vector<float>& p, const std::vector<float>& y) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    for (size_t j = 0; j < p.size(); ++j) {
      if (y[i] > 0.5f && y[j] <= 0.5f) {
        pairs += 1;
        wins += p[i] > p[j] ? 1.0 : (p[i] == p[j] ? 0.5 : 0.0);
      }
    }
  }
  return wins / pairs;
}

// Random labels with predictions that carry some signal.
void MakeData(int n, uint32_t seed, std::vector<float>* p, std::vector<float>* y) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int i = 0; i < n; ++i) {
    const float label = u(rng) < 0.3f ? 1.0f : 0.0f;
    y->push_back(label);
    p->push_back(std::clamp(0.35f * label + 0.65f * u(rng), 0.0f, 1.0f));
  }
}

TEST(AucTest, PerfectInverseTiesAndUndefined) {
  const std::vector<float> y = {0, 0, 1, 1, 0, 1};
  const std::vector<float> perfect = {0.1f, 0.2f, 0.8f, 0.9f, 0.3f, 0.7f};
  std::vector<float> inverse;
  for (float p : perfect) inverse.push_back(1.0f - p);
  const std::vector<float> ties(y.size(), 0.4f);
  EXPECT_DOUBLE_EQ(ExactAuc(perfect, y), 1.0);
  EXPECT_DOUBLE_EQ(ExactAuc(inverse, y), 0.0);
  EXPECT_DOUBLE_EQ(ExactAuc(ties, y), 0.5);
  BucketedAuc b;
  b.Add(perfect, y);
  EXPECT_DOUBLE_EQ(b.Auc(), 1.0);
  b.Reset();
  b.Add(ties, y);
  EXPECT_DOUBLE_EQ(b.Auc(), 0.5);
  const std::vector<float> all_neg(y.size(), 0.0f);
  EXPECT_TRUE(std::isnan(ExactAuc(perfect, all_neg)));
  EXPECT_TRUE(std::isnan(ExactAuc({}, {})));
  BucketedAuc empty;
  EXPECT_TRUE(std::isnan(empty.Auc()));
}

TEST(AucTest, ExactMatchesPairwiseDefinitionWithTies) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> level(0, 9);  // few distinct values: many ties
  std::vector<float> p, y;
  for (int i = 0; i < 400; ++i) {
    p.push_back(level(rng) / 10.0f);
    y.push_back(level(rng) < 4 ? 1.0f : 0.0f);
  }
  EXPECT_NEAR(ExactAuc(p, y), PairwiseAuc(p, y), 1e-12);
}

TEST(AucTest, RandomPredictionsGiveAboutHalf) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> p, y;
  for (int i = 0; i < 100000; ++i) {
    p.push_back(u(rng));
    y.push_back(u(rng) < 0.25f ? 1.0f : 0.0f);
  }
  EXPECT_NEAR(ExactAuc(p, y), 0.5, 0.01);
}

TEST(AucTest, BucketedCloseToExactAndMergeEqualsWhole) {
  std::vector<float> p, y;
  MakeData(200000, 11, &p, &y);
  const double exact = ExactAuc(p, y);
  BucketedAuc whole;
  ASSERT_GE(whole.num_buckets(), 1 << 16);
  whole.Add(p, y);
  EXPECT_NEAR(whole.Auc(), exact, 1e-3);
  EXPECT_GT(exact, 0.7);  // the data carries signal, so the check is not trivial

  const size_t half = p.size() / 2;
  BucketedAuc first, second;
  first.Add({p.data(), half}, {y.data(), half});
  second.Add({p.data() + half, p.size() - half}, {y.data() + half, y.size() - half});
  // Merging in place, as an all-reduce over workers would.
  std::vector<double> pos = first.positives(), neg = first.negatives();
  for (size_t b = 0; b < pos.size(); ++b) {
    pos[b] += second.positives()[b];
    neg[b] += second.negatives()[b];
  }
  EXPECT_EQ(pos, whole.positives());
  EXPECT_EQ(neg, whole.negatives());
  EXPECT_DOUBLE_EQ(AucFromBuckets(pos, neg), whole.Auc());
  first.Merge(second);
  EXPECT_DOUBLE_EQ(first.Auc(), whole.Auc());
}

TEST(AucTest, OutOfRangePredictionsAreClamped) {
  const std::vector<float> y = {0, 1, 0, 1};
  const std::vector<float> p = {-3.0f, 7.0f, NAN, 0.5f};
  EXPECT_DOUBLE_EQ(ExactAuc(p, y), 1.0);
  BucketedAuc b(16);
  b.Add(p, y);
  EXPECT_DOUBLE_EQ(b.Auc(), 1.0);
  EXPECT_EQ(b.positives()[15], 1.0);  // p = 7 lands in the top bucket
  EXPECT_EQ(b.negatives()[0], 2.0);   // -3 and NaN in the bottom one
}

TEST(AccuracyTest, BinaryAndArgmax) {
  EXPECT_EQ(CountCorrectBinary(std::vector<float>{0.9f, 0.2f, 0.5f, 0.4f},
                               std::vector<float>{1, 0, 0, 1}),
            2);
  const std::vector<float> scores = {0.1f, 0.7f, 0.2f,   // argmax 1
                                     0.5f, 0.5f, 0.0f,   // tie -> first, 0
                                     0.0f, 0.1f, 0.9f};  // argmax 2
  EXPECT_EQ(CountCorrectArgmax(scores, 3, std::vector<int32_t>{1, 0, 1}), 2);
  EXPECT_EQ(CountCorrectArgmax(scores, 3, std::vector<int32_t>{-1, 3, 2}), 1);
}

TEST(MeanMetricTest, RunningMeanMergesAsSums) {
  MeanMetric a, b;
  EXPECT_EQ(a.Mean(), 0.0);
  a.Add(3.0, 2);
  b.Add(6.0, 4);
  a.Merge(b);
  EXPECT_DOUBLE_EQ(a.Mean(), 1.5);
  EXPECT_EQ(a.count(), 6.0);
  a.sums()[0] *= 2;  // as if a second worker's equal sums were all-reduced in
  a.sums()[1] *= 2;
  EXPECT_DOUBLE_EQ(a.Mean(), 1.5);
  a.Reset();
  EXPECT_EQ(a.count(), 0.0);
}

TEST(LogLossTest, MatchesDefinitionAndClamps) {
  const std::vector<float> p = {0.8f, 0.3f, 0.0f};
  const std::vector<float> y = {1, 0, 1};
  const double expected = -std::log(0.8) - std::log(0.7) - std::log(1e-7);
  EXPECT_NEAR(LogLossSum(p, y), expected, 1e-5);
}

}  // namespace
}  // namespace fleet::data
