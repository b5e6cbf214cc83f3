#include "ps/table/table_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "ps/table/partition.h"

namespace fleet::ps {
namespace {

using ::testing::HasSubstr;

Result<TableConfig> Parse(const std::string& yaml) { return ParseTableConfig(YAML::Load(yaml)); }

TEST(TableConfigTest, ParsesEveryKey) {
  Result<TableConfig> c = Parse(R"(
id: 3
kind: sparse
dim: 8
accessor: ctr
shard_num: 64
local_shard_num: 8
partition: range
optimizer: {rule: adam, learning_rate: 0.5, l2_decay: 0.01, clip_mode: norm, clip_threshold: 2,
            initial_g2sum: 0.2, beta1: 0.8, beta2: 0.99, epsilon: 1.0e-6}
initializer: {kind: gaussian, seed: 7, range: 0.5, std: 0.02}
ctr: {embed_dim: 2, nonclk_coeff: 0.2, click_coeff: 2, embedx_threshold: 5, show_click_decay: 0.9,
      delete_after_unseen_passes: 3, delete_threshold: 0.5}
admission: {min_count: 4}
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->id, 3u);
  EXPECT_EQ(c->accessor, AccessorKind::kCtr);
  EXPECT_EQ(c->shard_num, 64u);
  EXPECT_EQ(c->local_shard_num, 8u);
  EXPECT_EQ(c->partition, Partition::kRange);
  EXPECT_EQ(c->optimizer.rule, OptimizerKind::kAdam);
  EXPECT_FLOAT_EQ(c->optimizer.beta2, 0.99f);
  EXPECT_EQ(c->optimizer.clip_mode, ClipMode::kNorm);
  EXPECT_EQ(c->initializer.kind, InitializerKind::kGaussian);
  EXPECT_EQ(c->initializer.seed, 7u);
  EXPECT_EQ(c->ctr.embed_dim, 2);
  EXPECT_EQ(c->ctr.delete_after_unseen_passes, 3);
  EXPECT_EQ(c->admission_min_count, 4u);

  // The YAML form used in manifests reads back to the same config.
  Result<TableConfig> back = Parse(TableConfigToYaml(*c));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(TableConfigToYaml(*back), TableConfigToYaml(*c));
  EXPECT_TRUE(CheckCheckpointCompatible(*c, *back).ok());
}

TEST(TableConfigTest, DefaultsMatchDocumentation) {
  Result<TableConfig> c = Parse("{id: 1, kind: sparse, dim: 4}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->shard_num, 1000u);
  EXPECT_EQ(c->local_shard_num, 16u);
  EXPECT_EQ(c->partition, Partition::kHash);
  EXPECT_EQ(c->optimizer.rule, OptimizerKind::kSgd);
  EXPECT_EQ(c->admission_min_count, 1u);
  EXPECT_EQ(c->initializer.kind, InitializerKind::kZeros);
}

TEST(TableConfigTest, BadInputNamesTheKey) {
  struct Case {
    const char* yaml;
    const char* key;
  };
  const Case cases[] = {
      {"{kind: sparse, dim: 4}", "id"},
      {"{id: 1, kind: sparse, dim: 4, dimm: 3}", "dimm"},
      {"{id: 1, kind: spars, dim: 4}", "kind"},
      {"{id: 1, kind: sparse, dim: four}", "dim"},
      {"{id: 1, kind: sparse, dim: 0}", "dim"},
      {"{id: 1, kind: sparse, dim: 4, optimizer: {rule: adam, beta1: 1.5}}", "optimizer.beta1"},
      {"{id: 1, kind: sparse, dim: 4, optimizer: {learning_rat: 1}}", "optimizer.learning_rat"},
      {"{id: 1, kind: sparse, dim: 4, optimizer: {clip_mode: value}}", "optimizer.clip_threshold"},
      {"{id: 1, kind: sparse, dim: 4, initializer: {kind: normal}}", "initializer.kind"},
      {"{id: 1, kind: sparse, dim: 4, ctr: {show_click_decay: 0}}", "ctr.show_click_decay"},
      {"{id: 1, kind: sparse, dim: 4, admission: {min_count: 0}}", "admission.min_count"},
      {"{id: 1, kind: dense, dim: 4, accessor: ctr}", "accessor"},
      {"{id: 1, kind: sparse, dim: 4, shard_num: 0}", "shard_num"},
      {"{id: 1, kind: sparse, dim: 4, local_shard_num: 0}", "local_shard_num"},
      {"{id: 1, kind: sparse, dim: 4, partition: ranges}", "partition"},
      {"{id: 1, kind: dense, dim: 4, partition: range}", "partition"},
  };
  for (const Case& c : cases) {
    Result<TableConfig> r = Parse(c.yaml);
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(c.key)) << c.yaml;
  }
}

TEST(TableConfigTest, IncompatibleCheckpointConfigNamesTheField) {
  TableConfig a = Parse("{id: 1, kind: sparse, dim: 4}").value();
  TableConfig b = a;
  b.dim = 8;
  Status s = CheckCheckpointCompatible(a, b);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), HasSubstr("dim"));
  b = a;
  b.optimizer.rule = OptimizerKind::kAdagrad;
  EXPECT_THAT(CheckCheckpointCompatible(a, b).message(), HasSubstr("optimizer.rule"));
  // The partition decides which shard file holds a key, like shard_num; a
  // manifest written before the key existed reads as hash.
  b = a;
  b.partition = Partition::kRange;
  s = CheckCheckpointCompatible(a, b);
  EXPECT_THAT(s.message(), HasSubstr("partition differs: checkpoint has hash, table has range"));
  EXPECT_TRUE(CheckCheckpointCompatible(b, Parse(TableConfigToYaml(b)).value()).ok());
  b = a;
  b.optimizer.learning_rate = 1;  // may change between runs
  EXPECT_TRUE(CheckCheckpointCompatible(a, b).ok());
}

TEST(PartitionTest, ShardBlocksCoverEveryShardOnce) {
  for (int servers : {1, 2, 3, 7}) {
    uint32_t next = 0;
    for (int r = 0; r < servers; ++r) {
      ShardRange range = AssignShards(1000, servers, r).value();
      EXPECT_EQ(range.begin, next);
      EXPECT_GE(range.size(), 1000u / servers);
      EXPECT_LE(range.size(), 1000u / servers + 1);
      next = range.end;
    }
    EXPECT_EQ(next, 1000u);
  }
  EXPECT_TRUE(AssignShards(2, 3, 0).status().IsInvalidArgument());
  EXPECT_TRUE(AssignShards(10, 2, 2).status().IsInvalidArgument());
  EXPECT_TRUE(SplitDenseRange(10, 0, 0).status().IsInvalidArgument());
  DenseRange d = SplitDenseRange(10, 3, 1).value();
  EXPECT_EQ(d.begin, 3u);
  EXPECT_EQ(d.end, 6u);
}

// KeySharder is ShardOfKey with the division precomputed: it must agree on
// every key, for any shard_num and either partition (it decides where rows
// live and which file of a checkpoint they are in).
TEST(PartitionTest, KeySharderAgreesWithShardOfKey) {
  for (Partition partition : {Partition::kHash, Partition::kRange}) {
    for (uint32_t shard_num :
         {1u, 2u, 3u, 7u, 64u, 1000u, 1024u, 65521u, 4000000007u, UINT32_MAX}) {
      const KeySharder sharder(shard_num, partition);
      EXPECT_EQ(sharder.shard_num(), shard_num);
      uint64_t key = 12345;
      for (int i = 0; i < 20000; ++i) {
        key = key * 6364136223846793005ull + 1442695040888963407ull;
        for (uint64_t k : {key, uint64_t(i), ~uint64_t(i)}) {
          ASSERT_EQ(sharder(k), ShardOfKey(k, shard_num, partition)) << k;
          ASSERT_EQ(sharder.Of(k, Mix64(k)), sharder(k)) << k;
          ASSERT_LT(sharder(k), shard_num) << k;
        }
      }
    }
  }
  EXPECT_EQ(ShardOfKey(77, 1000, Partition::kHash), ShardOfKey(77, 1000));
}

// Under the range partition a shard is the keys [FirstKeyOfShard(s),
// FirstKeyOfShard(s + 1)): workers split sorted requests at these keys, so
// the key below each must be in the shard before, and the order of keys is
// the order of shards.
TEST(PartitionTest, RangeShardsAreConsecutiveKeyRanges) {
  for (uint32_t shard_num : {1u, 2u, 3u, 7u, 16u, 1000u, 1u << 20, 4000000007u, UINT32_MAX}) {
    EXPECT_EQ(FirstKeyOfShard(0, shard_num), 0u);
    EXPECT_EQ(RangeShardOfKey(0, shard_num), 0u);
    EXPECT_EQ(RangeShardOfKey(UINT64_MAX, shard_num), shard_num - 1);
    const uint32_t step = std::max<uint32_t>(1, shard_num / 1000);
    for (uint64_t s = 1; s < shard_num; s += step) {
      const uint64_t first = FirstKeyOfShard(static_cast<uint32_t>(s), shard_num);
      ASSERT_EQ(RangeShardOfKey(first, shard_num), s) << shard_num;
      ASSERT_EQ(RangeShardOfKey(first - 1, shard_num), s - 1) << shard_num;
    }
  }
  // Shards of equal width: 16 shards of 2^60 keys.
  EXPECT_EQ(FirstKeyOfShard(5, 16), uint64_t{5} << 60);
  EXPECT_EQ(RangeShardOfKey((uint64_t{5} << 60) - 1, 16), 4u);
  uint64_t key = 99;
  uint32_t last = 0;
  std::vector<uint64_t> keys;
  for (int i = 0; i < 1000; ++i) keys.push_back(key = key * 6364136223846793005ull + 1);
  std::sort(keys.begin(), keys.end());
  for (uint64_t k : keys) {
    const uint32_t s = RangeShardOfKey(k, 1000);
    ASSERT_GE(s, last) << k;
    last = s;
  }
}

TEST(PartitionTest, HashIsStableAndSpreadsSequentialKeys) {
  // Part of the checkpoint format: these values must never change.
  EXPECT_EQ(Mix64(0), 0u);
  EXPECT_EQ(Mix64(1), 0x5692161d100b05e5ULL);
  std::vector<int> count(1000);
  for (uint64_t k = 0; k < 100000; ++k) ++count[ShardOfKey(k, 1000)];
  for (int c : count) {
    EXPECT_GT(c, 50);
    EXPECT_LT(c, 160);
  }
}

}  // namespace
}  // namespace fleet::ps
