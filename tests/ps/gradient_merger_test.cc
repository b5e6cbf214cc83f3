#include "ps/table/gradient_merger.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include <gtest/gtest.h>

namespace fleet::ps {
namespace {

// Values whose float sum depends on the order of addition.
std::vector<float> Contribution(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (rank % 2 ? 1e8f : 1.0f) * (0.1f + rank) * float(i + 1) / 3.0f;
  return v;
}

TEST(GradientMergerTest, DenseSumIsIndependentOfArrivalOrder) {
  constexpr int kWorkers = 5;
  constexpr size_t kWidth = 64;
  std::vector<std::vector<float>> results;
  std::mt19937 rng(1);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> applied;
    int applies = 0;
    GradientMerger m(kWorkers, kWidth, /*keyed=*/false, [&](std::span<const uint64_t> keys, std::span<const float> v) {
      EXPECT_TRUE(keys.empty());
      applied.assign(v.begin(), v.end());
      ++applies;
      return Status::OK();
    });
    std::vector<int> order(kWorkers);
    for (int i = 0; i < kWorkers; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 0; i < kWorkers; ++i) {
      Result<bool> r = m.Add(0, order[i], {}, Contribution(order[i], kWidth));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(*r, i == kWorkers - 1);
    }
    EXPECT_EQ(applies, 1);
    results.push_back(applied);
  }
  for (const auto& r : results) EXPECT_EQ(0, std::memcmp(r.data(), results[0].data(), kWidth * sizeof(float)));
  // And it is exactly the rank-ordered sum.
  for (size_t i = 0; i < kWidth; ++i) {
    float s = Contribution(0, kWidth)[i];
    for (int r = 1; r < kWorkers; ++r) s += Contribution(r, kWidth)[i];
    EXPECT_EQ(results[0][i], s);
  }
}

TEST(GradientMergerTest, SparseMergesKeysInRankOrderFromThreads) {
  constexpr int kWorkers = 4;
  std::vector<uint64_t> first_keys;
  std::vector<float> first_vals;
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<uint64_t> keys;
    std::vector<float> vals;
    GradientMerger m(kWorkers, 2, /*keyed=*/true, [&](std::span<const uint64_t> k, std::span<const float> v) {
      keys.assign(k.begin(), k.end());
      vals.assign(v.begin(), v.end());
      return Status::OK();
    });
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorkers; ++r) {
      threads.emplace_back([&, r] {
        std::vector<uint64_t> k = {uint64_t(100 + r), 7, 8};
        std::vector<float> v = {1e8f * r, 0.3f, 1.0f / (r + 1), 0.7f * r, 2, 3};
        ASSERT_TRUE(m.Add(0, r, k, v).ok());
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(keys.size(), 3u + kWorkers - 1);
    EXPECT_EQ(keys[0], 100u);  // rank 0's keys first, in its order
    EXPECT_EQ(keys[1], 7u);
    EXPECT_EQ(keys[2], 8u);
    if (trial == 0) {
      first_keys = keys;
      first_vals = vals;
    }
    EXPECT_EQ(keys, first_keys);
    EXPECT_EQ(0, std::memcmp(vals.data(), first_vals.data(), vals.size() * sizeof(float)));
  }
}

TEST(GradientMergerTest, RejectsBadContributions) {
  int applies = 0;
  GradientMerger m(2, 3, /*keyed=*/false, [&](auto, auto) {
    ++applies;
    return Status::OK();
  });
  std::vector<float> g(3, 1.0f);
  EXPECT_TRUE(m.Add(0, 2, {}, g).status().IsInvalidArgument());
  EXPECT_TRUE(m.Add(0, 0, {}, std::vector<float>(2)).status().IsInvalidArgument());
  ASSERT_TRUE(m.Add(0, 0, {}, g).ok());
  EXPECT_TRUE(m.Add(0, 0, {}, g).status().IsInvalidArgument());  // twice
  EXPECT_EQ(m.pending_steps(), 1u);
  ASSERT_TRUE(m.Add(0, 1, {}, g).value());
  EXPECT_EQ(applies, 1);
  EXPECT_TRUE(m.Add(0, 1, {}, g).status().IsInvalidArgument());  // step already applied
  EXPECT_EQ(m.pending_steps(), 0u);
}

// Heter workers push one dense contribution per micro-batch: a step waits
// for the count its pushes name (not the worker count), sums them in slot
// order, and with `idempotent` a resent slot is dropped, whether the step
// still waits or was applied.
TEST(GradientMergerTest, ContributorsPerStepAndIdempotentResends) {
  std::vector<float> applied;
  int applies = 0;
  GradientMerger m(2, 4, /*keyed=*/false, [&](auto, std::span<const float> v) {
    applied.assign(v.begin(), v.end());
    ++applies;
    return Status::OK();
  });
  const GradientMerger::AddOptions four{.contributors = 4, .idempotent = true};
  for (int rank : {3, 0, 2}) ASSERT_FALSE(m.Add(0, rank, {}, Contribution(rank, 4), four).value());
  // Resent slot 2 while the step waits: dropped, still waiting.
  ASSERT_FALSE(m.Add(0, 2, {}, std::vector<float>(4, 1e6f), four).value());
  // A push that disagrees on the count is refused.
  auto wrong = m.Add(0, 1, {}, Contribution(1, 4), {.contributors = 2, .idempotent = true});
  EXPECT_TRUE(wrong.status().IsInvalidArgument());
  EXPECT_NE(wrong.status().message().find("waits for 4 contributions"), std::string::npos);
  EXPECT_EQ(applies, 0);
  ASSERT_TRUE(m.Add(0, 1, {}, Contribution(1, 4), four).value());
  ASSERT_EQ(applies, 1);
  for (size_t i = 0; i < 4; ++i) {
    float s = Contribution(0, 4)[i];
    for (int r = 1; r < 4; ++r) s += Contribution(r, 4)[i];
    EXPECT_EQ(applied[i], s) << i;  // slot order; the resend's 1e6 is not in it
  }
  // Resent after the step was applied: answered as applied, not applied again.
  ASSERT_TRUE(m.Add(0, 3, {}, Contribution(3, 4), four).value());
  EXPECT_EQ(applies, 1);
  // Without idempotent the same resend is an error, as before.
  EXPECT_TRUE(
      m.Add(0, 3, {}, Contribution(3, 4), {.contributors = 4}).status().IsInvalidArgument());
  // Slots out of the step's range, and absurd counts, are refused.
  EXPECT_TRUE(m.Add(1, 4, {}, Contribution(0, 4), four).status().IsInvalidArgument());
  EXPECT_TRUE(
      m.Add(1, 0, {}, Contribution(0, 4), {.contributors = -1}).status().IsInvalidArgument());
  EXPECT_TRUE(
      m.Add(1, 0, {}, Contribution(0, 4), {.contributors = 1 << 30}).status().IsInvalidArgument());
  EXPECT_EQ(m.pending_steps(), 0u);
}

}  // namespace
}  // namespace fleet::ps
