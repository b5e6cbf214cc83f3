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
        ASSERT_TRUE(m.Add(42, r, k, v).ok());
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

}  // namespace
}  // namespace fleet::ps
