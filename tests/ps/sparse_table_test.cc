#include "ps/table/sparse_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/byte_io.h"
#include "table_test_util.h"

namespace fleet::ps {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<SparseTable> Make(const std::string& yaml, ThreadPool* pool, ShardRange owned = {0, 0}) {
  TableConfig c = ConfigFromYaml(yaml);
  if (owned.end == 0) owned = {0, c.shard_num};
  return SparseTable::Create(c, owned, pool).value();
}

TEST(SparseTableTest, ConcurrentPushesLoseNoUpdate) {
  ThreadPool pool(2);
  auto t = Make("{id: 1, kind: sparse, dim: 4, shard_num: 16, optimizer: {rule: sgd, learning_rate: 1}}", &pool);
  constexpr int kThreads = 8, kRounds = 150, kBatch = 700, kKeys = 1000;
  std::vector<std::atomic<int>> expected(kKeys);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::vector<uint64_t> keys(kBatch);
      std::vector<float> ones(kBatch * 4, 1.0f), pulled(kBatch * 4);
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < kBatch; ++i) keys[i] = (uint64_t(th) * 7919 + r * 104729 + i * 31) % kKeys;
        ASSERT_TRUE(t->PushGrad(keys, ones).ok());
        for (uint64_t k : keys) expected[k].fetch_add(1);
        ASSERT_TRUE(t->Pull(keys, pulled).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  std::vector<uint64_t> all(kKeys);
  for (int k = 0; k < kKeys; ++k) all[k] = k;
  std::vector<float> values(kKeys * 4);
  ASSERT_TRUE(t->Pull(all, values).ok());
  for (int k = 0; k < kKeys; ++k)
    for (int j = 0; j < 4; ++j) ASSERT_EQ(values[k * 4 + j], -float(expected[k].load())) << "key " << k;
  EXPECT_EQ(t->Stats().rows, uint64_t(kKeys));
}

TEST(SparseTableTest, PullCreatesDeterministicRows) {
  const std::string yaml =
      "{id: 1, kind: sparse, dim: 3, shard_num: 8, initializer: {kind: uniform, range: 0.1, seed: 5}}";
  auto a = Make(yaml, nullptr);
  auto b = Make(yaml, nullptr);
  std::vector<uint64_t> keys = {5, 9, 1ull << 40};
  std::vector<uint64_t> reversed(keys.rbegin(), keys.rend());
  std::vector<float> va(9), vb(9);
  ASSERT_TRUE(a->Pull(keys, va).ok());
  ASSERT_TRUE(b->Pull(reversed, vb).ok());
  for (int k = 0; k < 3; ++k)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(va[k * 3 + j], vb[(2 - k) * 3 + j]);
  EXPECT_NE(va[0], va[3]);
  EXPECT_EQ(a->Stats().rows, 3u);
}

TEST(SparseTableTest, AdmissionCountFilter) {
  auto t = Make(
      "{id: 1, kind: sparse, dim: 2, shard_num: 4, admission: {min_count: 3}, "
      "initializer: {kind: uniform, range: 1}, optimizer: {learning_rate: 1}}",
      nullptr);
  std::vector<uint64_t> key = {77};
  std::vector<float> first(2), v(2), grad = {1.0f, 1.0f};
  ASSERT_TRUE(t->Pull(key, first).ok());  // seen once: not stored
  EXPECT_EQ(t->Stats().rows, 0u);
  EXPECT_EQ(t->Stats().pending_keys, 1u);
  ASSERT_TRUE(t->PushGrad(key, grad).ok());  // seen twice: dropped
  EXPECT_EQ(t->Stats().dropped_pushes, 1u);
  EXPECT_EQ(t->Stats().rows, 0u);
  ASSERT_TRUE(t->Pull(key, v).ok());  // third sighting: admitted with the same initial value
  EXPECT_EQ(v, first);
  EXPECT_EQ(t->Stats().rows, 1u);
  EXPECT_EQ(t->Stats().pending_keys, 0u);
  ASSERT_TRUE(t->PushGrad(key, grad).ok());
  ASSERT_TRUE(t->Pull(key, v).ok());
  EXPECT_FLOAT_EQ(v[0], first[0] - 1.0f);
}

TEST(SparseTableTest, CtrEmbedxEndPassAndShrink) {
  auto t = Make(
      "{id: 2, kind: sparse, dim: 4, accessor: ctr, shard_num: 4, "
      "initializer: {kind: uniform, range: 0.5}, optimizer: {rule: adagrad, learning_rate: 0.1}, "
      "ctr: {embed_dim: 1, nonclk_coeff: 1, click_coeff: 2, embedx_threshold: 3, show_click_decay: 0.5, "
      "delete_after_unseen_passes: 2}}",
      nullptr);
  EXPECT_EQ(t->pull_dim(), 5u);
  const std::vector<uint64_t> keys = {10, 20};
  std::vector<float> v(10), grads(10, 0.5f);
  ASSERT_TRUE(t->Pull(keys, v).ok());
  for (int j = 1; j < 5; ++j) EXPECT_EQ(v[j], 0.0f) << "embedx must be zeros before creation";

  // Key 10: show 1, click 0 -> score 1: no embedx yet.
  const std::vector<float> shows = {1, 1}, clicks = {0, 1};
  ASSERT_TRUE(t->PushGrad(keys, grads, shows, clicks).ok());
  std::vector<float> row, ext;
  ASSERT_TRUE(t->DebugRow(10, &row, &ext));
  EXPECT_FLOAT_EQ(row[CtrAccessor::kShow], 1);
  EXPECT_TRUE(ext.empty());
  // Key 20: show 1 click 1 -> score 2, then 4 after the second push: embedx created.
  ASSERT_TRUE(t->DebugRow(20, &row, &ext));
  EXPECT_TRUE(ext.empty());
  ASSERT_TRUE(t->PushGrad(keys, grads, shows, clicks).ok());
  ASSERT_TRUE(t->DebugRow(20, &row, &ext));
  EXPECT_EQ(ext.size(), 8u);  // embedx 4 + adagrad state 4
  EXPECT_EQ(t->Stats().ext_rows, 1u);
  ASSERT_TRUE(t->Pull(keys, v).ok());
  EXPECT_NE(v[5 + 1], 0.0f);  // key 20's embedx came from the initializer
  EXPECT_EQ(v[1], 0.0f);      // key 10 still has none

  // end_pass decays show/click and ages rows.
  t->EndPass();
  ASSERT_TRUE(t->DebugRow(20, &row, &ext));
  EXPECT_FLOAT_EQ(row[CtrAccessor::kShow], 1.0f);   // 2 * 0.5
  EXPECT_FLOAT_EQ(row[CtrAccessor::kClick], 1.0f);  // 2 * 0.5
  EXPECT_FLOAT_EQ(row[CtrAccessor::kUnseen], 1.0f);
  EXPECT_EQ(t->Shrink(), 0u);

  // Key 20 is pushed again (unseen resets); key 10 is not and goes after 2 passes.
  ASSERT_TRUE(t->PushGrad(std::vector<uint64_t>{20}, std::vector<float>(5, 0.1f)).ok());
  t->EndPass();
  EXPECT_EQ(t->Shrink(), 1u);
  EXPECT_FALSE(t->DebugRow(10, &row, &ext));
  EXPECT_TRUE(t->DebugRow(20, &row, &ext));
  EXPECT_EQ(t->Stats().rows, 1u);
}

// Geo mode with the CTR accessor: a delta carries the shows and clicks of
// the steps it sums, which count as a gradient's do (and create embedx).
TEST(SparseTableTest, CtrDeltasCountShowsAndClicks) {
  auto t = Make(
      "{id: 2, kind: sparse, dim: 2, accessor: ctr, shard_num: 4, "
      "ctr: {embed_dim: 1, nonclk_coeff: 1, click_coeff: 2, embedx_threshold: 3}}",
      nullptr);
  const std::vector<uint64_t> keys = {10, 20};
  std::vector<float> v(6), deltas = {0.5f, 1, 1, 0.25f, 1, 1};
  ASSERT_TRUE(t->Pull(keys, v).ok());
  // Key 10 seen 4 times, never clicked: score 4, embedx created (its delta
  // for the absent embedx dropped); key 20 once: score 1.
  ASSERT_TRUE(t->PushDelta(keys, deltas, std::vector<float>{4, 1}, std::vector<float>{0, 0}).ok());
  std::vector<float> row, ext;
  ASSERT_TRUE(t->DebugRow(10, &row, &ext));
  EXPECT_FLOAT_EQ(row[CtrAccessor::kShow], 4);
  EXPECT_FLOAT_EQ(row[CtrAccessor::kEmbed], v[0] + 0.5f);
  EXPECT_EQ(ext.size(), 2u);  // embedx, sgd keeps no state
  ASSERT_TRUE(t->DebugRow(20, &row, &ext));
  EXPECT_FLOAT_EQ(row[CtrAccessor::kShow], 1);
  EXPECT_TRUE(ext.empty());
  // Without counts a delta only moves values.
  ASSERT_TRUE(t->PushDelta(keys, deltas).ok());
  ASSERT_TRUE(t->DebugRow(20, &row, &ext));
  EXPECT_FLOAT_EQ(row[CtrAccessor::kShow], 1);
  EXPECT_FLOAT_EQ(row[CtrAccessor::kEmbed], v[3] + 0.5f);
  EXPECT_TRUE(t->PushDelta(keys, deltas, std::vector<float>{1}, {}).IsInvalidArgument());
}

TEST(SparseTableTest, BadInputLeavesTableUnchanged) {
  ThreadPool pool(2);
  auto t = Make("{id: 4, kind: sparse, dim: 2, shard_num: 16, initializer: {kind: uniform}}", &pool, {0, 8});
  // Keys this server holds, and one it does not.
  std::vector<uint64_t> held, foreign;
  for (uint64_t k = 0; held.size() < 50 || foreign.empty(); ++k)
    (ShardOfKey(k, 16) < 8 ? held : foreign).push_back(k);
  std::vector<float> v(held.size() * 2), g(held.size() * 2, 0.5f);
  ASSERT_TRUE(t->Pull(held, v).ok());
  ASSERT_TRUE(t->PushGrad(held, g).ok());
  const std::string before = DumpRows(*t);
  const SparseTableStats stats_before = t->Stats();

  std::vector<uint64_t> mixed = held;
  mixed.push_back(foreign[0]);
  std::vector<float> out(mixed.size() * 2, -7.0f);
  Status s = t->Pull(mixed, out);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("key " + std::to_string(foreign[0])));
  EXPECT_THAT(s.message(), HasSubstr("not held"));
  for (float x : out) EXPECT_EQ(x, -7.0f);  // output untouched
  // A key of a shard below the held range, among held ones.
  auto upper = Make("{id: 4, kind: sparse, dim: 2, shard_num: 16}", &pool, {8, 16});
  std::vector<uint64_t> upper_mixed = {foreign[0], held[0]};
  std::vector<float> upper_out(4, -7.0f);
  s = upper->Pull(upper_mixed, upper_out);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("key " + std::to_string(held[0]) + " is in shard"));
  for (float x : upper_out) EXPECT_EQ(x, -7.0f);

  s = t->PushGrad(mixed, std::vector<float>(mixed.size() * 2, 1.0f));
  EXPECT_TRUE(s.IsInvalidArgument());
  s = t->PushGrad(held, std::vector<float>(held.size() * 2 - 1, 1.0f));
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("2 per key"));
  s = t->PushGrad(held, g, std::vector<float>(3, 1.0f));
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("shows"));
  s = t->PushDelta(held, std::vector<float>(held.size() * 3, 1.0f));
  EXPECT_TRUE(s.IsInvalidArgument());
  std::vector<float> tiny(1);
  s = t->Pull(held, tiny);
  EXPECT_TRUE(s.IsInvalidArgument());

  EXPECT_EQ(DumpRows(*t), before);
  EXPECT_EQ(t->Stats().rows, stats_before.rows);
  EXPECT_EQ(t->Stats().pending_keys, 0u);
}

TEST(SparseTableTest, PushDeltaAddsToValue) {
  auto t = Make("{id: 1, kind: sparse, dim: 2, shard_num: 4}", nullptr);
  std::vector<uint64_t> keys = {1, 2, 1};  // duplicates apply in order
  ASSERT_TRUE(t->PushDelta(keys, std::vector<float>{1, 2, 3, 4, 5, 6}).ok());
  std::vector<float> v(4);
  ASSERT_TRUE(t->Pull(std::vector<uint64_t>{1, 2}, v).ok());
  EXPECT_EQ(v, (std::vector<float>{6, 8, 3, 4}));
}

// SGD without clipping or decay runs its step inline in the table's lookup
// loop; with either, rows go through OptimizerRule::UpdateRows, which
// clips and decays first. Both must give the rule's results.
TEST(SparseTableTest, SgdPushesClipAndDecayWhenConfigured) {
  const std::vector<uint64_t> key = {7};
  std::vector<float> v(2);
  auto plain = Make(
      "{id: 1, kind: sparse, dim: 2, shard_num: 4, optimizer: {rule: sgd, learning_rate: 0.5}}",
      nullptr);
  ASSERT_TRUE(plain->PushGrad(std::vector<uint64_t>{7, 7}, std::vector<float>{2, 4, 2, 4}).ok());
  ASSERT_TRUE(plain->Pull(key, v).ok());
  EXPECT_EQ(v, (std::vector<float>{-2, -4}));

  auto clipped = Make(
      "{id: 1, kind: sparse, dim: 2, shard_num: 4,"
      " optimizer: {rule: sgd, learning_rate: 1, clip_mode: value, clip_threshold: 0.5}}",
      nullptr);
  ASSERT_TRUE(clipped->PushGrad(key, std::vector<float>{2, -0.25f}).ok());
  ASSERT_TRUE(clipped->Pull(key, v).ok());
  EXPECT_EQ(v, (std::vector<float>{-0.5f, 0.25f}));

  auto decayed = Make(
      "{id: 1, kind: sparse, dim: 2, shard_num: 4,"
      " optimizer: {rule: sgd, learning_rate: 1, l2_decay: 0.5}}",
      nullptr);
  ASSERT_TRUE(decayed->PushGrad(key, std::vector<float>{1, 1}).ok());
  ASSERT_TRUE(decayed->PushGrad(key, std::vector<float>{0, 0}).ok());  // g = 0.5 * w
  ASSERT_TRUE(decayed->Pull(key, v).ok());
  EXPECT_EQ(v, (std::vector<float>{-0.5f, -0.5f}));
}

// How global shards are grouped in memory (local_shard_num) must not change
// any result: the same requests (duplicate keys, keys below the admission
// count, pushes of keys never pulled) give the same rows and the same
// checkpoint images whether the 16 shards live in 1, 5 or 16 local shards.
TEST(SparseTableTest, LocalShardCountDoesNotChangeResults) {
  ThreadPool pool(2);
  std::vector<std::string> dumps;
  std::vector<std::vector<float>> pulls;
  for (int locals : {1, 5, 16}) {
    auto t = Make(absl::StrCat("{id: 1, kind: sparse, dim: 3, shard_num: 16, local_shard_num: ", locals,
                               ", optimizer: {rule: adagrad}, admission: {min_count: 2},"
                               " initializer: {kind: uniform, range: 0.1}}"),
                  &pool);
    EXPECT_EQ(t->local_shard_count(), static_cast<size_t>(locals));
    std::vector<float> all_pulled;
    for (int round = 0; round < 20; ++round) {
      std::vector<uint64_t> keys(5000);  // >= the pool threshold, with duplicates
      for (size_t i = 0; i < keys.size(); ++i) keys[i] = Mix64(round * 7 + i % 1700) % 3000;
      std::vector<float> v(keys.size() * 3), g(keys.size() * 3);
      for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * float(i % 11) - 0.05f;
      ASSERT_TRUE(t->Pull(keys, v).ok());
      ASSERT_TRUE(t->PushGrad(keys, g).ok());
      all_pulled.insert(all_pulled.end(), v.begin(), v.end());
    }
    dumps.push_back(DumpRows(*t));
    pulls.push_back(std::move(all_pulled));
  }
  for (size_t i = 1; i < dumps.size(); ++i) {
    EXPECT_TRUE(dumps[i] == dumps[0]) << "checkpoint images differ for layout " << i;
    EXPECT_TRUE(pulls[i] == pulls[0]) << "pulled values differ for layout " << i;
  }
}

// Local shards hold blocks of consecutive global shards, every held shard in
// exactly one, none empty.
TEST(SparseTableTest, LocalShardsHoldBlocksOfGlobalShards) {
  for (int locals : {1, 3, 8}) {
    auto t = Make(absl::StrCat("{id: 1, kind: sparse, dim: 1, shard_num: 16, local_shard_num: ", locals, "}"),
                  nullptr, ShardRange{4, 12});
    ASSERT_EQ(t->local_shard_count(), static_cast<size_t>(locals));
    uint32_t next = 4;
    for (int l = 0; l < locals; ++l) {
      const ShardRange held = t->LocalShardRange(l);
      EXPECT_EQ(held.begin, next) << locals << " " << l;
      EXPECT_GT(held.size(), 0u) << locals << " " << l;
      next = held.end;
    }
    EXPECT_EQ(next, 12u) << locals;
  }
}

// Under the range partition a request's increasing keys are routed by
// binary search over the local shards' blocks (SparseTable::Route); the
// same keys in any other order take the general path. Both must pull the
// same value for each key and leave the same rows, keys on the blocks'
// edges included, and a key outside the held shards at either end of a
// sorted request is refused, naming it, with nothing changed.
TEST(SparseTableTest, RangePartitionSortedKeysRouteLikeAnyOrder) {
  ThreadPool pool(2);
  const ShardRange owned{4, 12};
  for (int locals : {1, 3, 8}) {
    const std::string yaml =
        absl::StrCat("{id: 1, kind: sparse, dim: 2, shard_num: 16, partition: range, local_shard_num: ", locals,
                     ", optimizer: {rule: adagrad}, initializer: {kind: uniform, range: 0.1, seed: 3}}");
    auto sorted_table = Make(yaml, &pool, owned);
    auto shuffled_table = Make(yaml, &pool, owned);
    std::vector<uint64_t> keys;
    for (uint32_t s = owned.begin; s < owned.end; ++s) {
      const uint64_t first = FirstKeyOfShard(s, 16);
      for (uint64_t k : {first, first + 1, first + 977, first + (uint64_t{1} << 58)}) keys.push_back(k);
      if (s > owned.begin) keys.push_back(first - 1);
    }
    keys.push_back(FirstKeyOfShard(owned.end, 16) - 1);
    std::sort(keys.begin(), keys.end());
    ASSERT_TRUE(StrictlyIncreasing(keys));
    std::vector<uint64_t> shuffled = keys;
    std::reverse(shuffled.begin(), shuffled.end());
    std::swap(shuffled[3], shuffled[17]);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> sorted_values(keys.size() * 2), shuffled_values(keys.size() * 2);
      ASSERT_TRUE(sorted_table->Pull(keys, sorted_values).ok());
      ASSERT_TRUE(shuffled_table->Pull(shuffled, shuffled_values).ok());
      std::map<uint64_t, std::vector<float>> by_key;
      for (size_t i = 0; i < shuffled.size(); ++i)
        by_key[shuffled[i]] = {shuffled_values[2 * i], shuffled_values[2 * i + 1]};
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_EQ(by_key[keys[i]], (std::vector<float>{sorted_values[2 * i], sorted_values[2 * i + 1]}))
            << "locals " << locals << " key " << keys[i];
      }
      std::vector<float> g(keys.size() * 2), shuffled_g(keys.size() * 2);
      for (size_t i = 0; i < keys.size(); ++i) {
        g[2 * i] = 0.01f * float(keys[i] % 13);
        g[2 * i + 1] = -0.02f * float(keys[i] % 7);
      }
      for (size_t i = 0; i < shuffled.size(); ++i) {
        const size_t at = std::lower_bound(keys.begin(), keys.end(), shuffled[i]) - keys.begin();
        shuffled_g[2 * i] = g[2 * at];
        shuffled_g[2 * i + 1] = g[2 * at + 1];
      }
      ASSERT_TRUE(sorted_table->PushGrad(keys, g).ok());
      ASSERT_TRUE(shuffled_table->PushGrad(shuffled, shuffled_g).ok());
    }
    EXPECT_EQ(sorted_table->Stats().rows, keys.size());
    const std::string dump = DumpRows(*sorted_table);
    EXPECT_TRUE(dump == DumpRows(*shuffled_table)) << "rows differ, locals " << locals;

    for (uint64_t foreign : {FirstKeyOfShard(owned.begin, 16) - 1, FirstKeyOfShard(owned.end, 16)}) {
      std::vector<uint64_t> with_foreign = keys;
      with_foreign.push_back(foreign);
      std::sort(with_foreign.begin(), with_foreign.end());
      std::vector<float> g(with_foreign.size() * 2, 1.0f);
      Status st = sorted_table->PushGrad(with_foreign, g);
      EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("key " + std::to_string(foreign)));
      EXPECT_TRUE(DumpRows(*sorted_table) == dump) << "a refused push changed rows";
    }
  }
}

// A local shard holds several global shards, so a shard file may only touch
// keys of its own global shard: a deleted key of another one is refused and
// nothing changes.
TEST(SparseTableTest, ShardFileCannotDeleteKeysOfAnotherShardInTheSameLocalShard) {
  auto t = Make("{id: 1, kind: sparse, dim: 2, shard_num: 4, local_shard_num: 1}", nullptr);
  ASSERT_EQ(t->local_shard_count(), 1u);
  uint64_t other = 0;  // a key of shard 1
  while (ShardOfKey(other, 4) != 1) ++other;
  std::vector<float> v(2);
  ASSERT_TRUE(t->Pull(std::vector<uint64_t>{other}, v).ok());
  const std::string before = DumpRows(*t);

  std::string image;  // a delta file of shard 0 that deletes `other`
  ByteWriter w(&image);
  w.PutBytes("FPSSHARD");
  for (uint32_t field : {1u, 1u, 0u, 1u, 2u, 0u})
    w.Put<uint32_t>(field);  // version table shard mode widths
  w.Put<uint64_t>(0);
  w.Put<uint64_t>(1);
  w.Put<uint64_t>(other);
  Status s = t->ApplyShardFile(0, image, "shard0.delta");
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_THAT(s.ToString(), HasSubstr("does not belong"));
  EXPECT_EQ(DumpRows(*t), before);
}

TEST(SparseTableTest, MemoryPerRowWithinBudget) {
  ThreadPool pool(2);
  auto t = Make("{id: 1, kind: sparse, dim: 8, shard_num: 1000, optimizer: {rule: adagrad}}", &pool);
  constexpr size_t kRows = 300000, kBatch = 30000;
  std::vector<uint64_t> keys(kBatch);
  std::vector<float> v(kBatch * 8);
  for (size_t b = 0; b < kRows / kBatch; ++b) {
    for (size_t i = 0; i < kBatch; ++i) keys[i] = Mix64(b * kBatch + i + 1);
    ASSERT_TRUE(t->Pull(keys, v).ok());
  }
  const SparseTableStats s = t->Stats();
  ASSERT_EQ(s.rows, kRows);
  const double raw = 8 + 8 * 4 + 8 * 4;  // key + value + adagrad state
  const double per_row = double(s.bytes) / s.rows;
  RecordProperty("bytes_per_row", std::to_string(per_row));
  EXPECT_LE(per_row, 1.5 * raw) << per_row << " bytes per row";
}

}  // namespace
}  // namespace fleet::ps
