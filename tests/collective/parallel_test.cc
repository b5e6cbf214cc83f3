// Hybrid degrees through GPT pretraining (parallel_groups.h): 4 ranks as
// dp 2 x sharding 2 (stages 1 and 2) give one process's losses, resume
// exactly, and their checkpoint loads under other splits. Ranks are threads,
// every group a Gloo group over one in-process KV store.
//
// Tolerance: the losses of 4 ranks and of 1 process differ only in the
// order of float32 sums (gradient reductions over ranks), which 20 Adam
// steps amplify to well under 1e-4 relative (measured: at most 1.4e-6 on
// losses of 2 to 6, i.e. < 1e-6 relative).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/collective/gpt_run_util.h"
#include "trainer/collective/parallel_groups.h"

namespace fleet::trainer::collective {
namespace {

using namespace testing_gpt;  // NOLINT: the helpers are this test's vocabulary

constexpr double kLossRel = 1e-4;

std::vector<std::string> Hybrid(int stage) {
  return {"Distributed.dp_degree=2", "Distributed.sharding.sharding_degree=2",
          "Distributed.sharding.sharding_stage=" + std::to_string(stage)};
}

TEST(HybridLayoutTest, ShardingIndexVariesFastest) {
  const HybridLayout layout{/*dp_degree=*/2, /*sharding_degree=*/2};
  const int want[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};  // rank -> (dp, sharding)
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(layout.dp_index(rank), want[rank][0]) << "rank " << rank;
    EXPECT_EQ(layout.sharding_index(rank), want[rank][1]) << "rank " << rank;
    EXPECT_EQ(layout.RankOf(want[rank][0], want[rank][1]), rank);
  }
  EXPECT_EQ((HybridLayout{3, 4}).RankOf(2, 1), 9);
}

TEST(HybridLayoutTest, BadLayoutsAreRefused) {
  // One process: only 1 x 1 fits.
  auto groups = HybridGroups::Create(HybridLayout{1, 2}, nullptr, {});
  ASSERT_FALSE(groups.ok());
  EXPECT_TRUE(groups.status().IsInvalidArgument()) << groups.status().ToString();
  ASSERT_TRUE(HybridGroups::Create(HybridLayout{1, 1}, nullptr, {}).ok());
  // 2 x 2 on 4 ranks with no way to join the subgroups.
  testing::RunGlooRanks(4, milliseconds(30000), [](int, Collective& world) {
    auto hybrid = HybridGroups::Create(HybridLayout{2, 2}, &world, {});
    if (hybrid.ok() || !hybrid.status().IsInvalidArgument()) {
      throw std::runtime_error("2 x 2 without a GroupFactory: " + hybrid.status().ToString());
    }
  });
}

TEST(HybridParallelTest, DpTimesShardingMatchesOneProcess) {
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one")), 1);
  const std::vector<double> want = AsDouble(one[0].report.step_losses);
  ASSERT_EQ(want.size(), 20u);
  for (int stage : {1, 2}) {
    const std::string name = "dp2 x sharding2 stage " + std::to_string(stage);
    std::vector<RankRun> four = Train(TinyJob(4, FreshDir("four"), Hybrid(stage)), 4);
    ExpectClose(MeanLosses(four), want, kLossRel, name);
    ExpectParamsClose(four[0].report.params, one[0].report.params, name);
    for (int r = 1; r < 4; ++r) {
      EXPECT_EQ(four[r].report.params, four[0].report.params) << name << ": rank " << r;
    }
    // Each rank holds half the moments (the sharding group splits them).
    const size_t full = one[0].report.params.size() * sizeof(float);
    EXPECT_LE(four[0].report.memory.optimizer_bytes, full + 64 * sizeof(float)) << name;
  }
}

TEST(HybridParallelTest, ResumeIsExactAndTheCheckpointLoadsUnderOtherSplits) {
  std::vector<RankRun> whole = Train(TinyJob(4, FreshDir("whole"), Hybrid(2)), 4);
  const std::vector<double> want = MeanLosses(whole);

  const fs::path dir = FreshDir("cut");
  std::vector<std::string> first = Hybrid(2);
  first.push_back("Engine.max_steps=10");
  Train(TinyJob(4, dir, first), 4);
  // One state file per shard, written by dp index 0 of each.
  EXPECT_TRUE(fs::exists(dir / "gpt.adamw.s10.0-of-2"));
  EXPECT_TRUE(fs::exists(dir / "gpt.adamw.s10.1-of-2"));
  EXPECT_FALSE(fs::exists(dir / "gpt.adamw.s10.2-of-2"));

  // The same split resumes bit for bit.
  const fs::path same = FreshDir("same");
  fs::copy(dir, same, fs::copy_options::recursive);
  std::vector<RankRun> resumed = Train(TinyJob(4, same, Hybrid(2)), 4);
  EXPECT_EQ(resumed[0].report.start_step, 10);
  for (int r = 0; r < 4; ++r) {
    const std::vector<float>& all = whole[r].report.step_losses;
    EXPECT_EQ(resumed[r].report.step_losses, std::vector<float>(all.begin() + 10, all.end()))
        << "rank " << r;
    EXPECT_EQ(resumed[r].report.params, whole[r].report.params) << "rank " << r;
  }

  // Other splits of 4 ranks, and one process, continue within the tolerance.
  const std::vector<std::pair<std::string, std::vector<std::string>>> splits = {
      {"sharding 4, stage 2",
       {"Distributed.sharding.sharding_degree=4", "Distributed.sharding.sharding_stage=2"}},
      {"dp 4", {}},
  };
  for (const auto& [name, extra] : splits) {
    const fs::path other = FreshDir("other");
    fs::copy(dir, other, fs::copy_options::recursive);
    std::vector<RankRun> runs = Train(TinyJob(4, other, extra), 4);
    EXPECT_EQ(runs[0].report.start_step, 10) << name;
    ExpectClose(MeanLosses(runs), std::vector<double>(want.begin() + 10, want.end()), kLossRel,
                name);
    ExpectParamsClose(runs[0].report.params, whole[0].report.params, name);
  }
  std::vector<RankRun> one = Train(TinyJob(1, dir), 1);
  EXPECT_EQ(one[0].report.start_step, 10);
  ExpectClose(AsDouble(one[0].report.step_losses),
              std::vector<double>(want.begin() + 10, want.end()), kLossRel, "one process");
}

}  // namespace
}  // namespace fleet::trainer::collective
