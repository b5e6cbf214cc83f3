// Pipeline parallelism (collective/gpt_pipeline.h): the 1F1B schedule's
// invariants for every small pipeline (each micro-batch forward then
// backward once per stage, in order; activations in flight bounded by the
// stage's slots; neighbours listing the same exchanges, so the blocking
// links cannot wait in a cycle; Megatron's warmup), the link over shared
// memory and Gloo, the hybrid layout's stage index, and GPT pretraining
// through the stages: pp 2 (also with dropout and recompute), pp 2 x mp 2, pp 2 x dp 2,
// pp 2 x sharding 2 (stage 1) and pp 4 give one process's losses to the
// tolerance of parallel_test, pp 2 resumes exactly and its checkpoint loads
// in one process, and Engine.init_from gives each stage its part.
//
// Tolerance: the stages run the same kernels on the same micro-batches as
// one process with gradient accumulation; what differs is the order of
// float32 sums (wte's gradient summed between the first and last stage, and
// with dp or mp the reductions of parallel_test), so kLossRel is
// parallel_test's 1e-4 and parameters use its tensor-parallel bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "collective/gpt_pipeline.h"
#include "collective/parallel_groups.h"
#include "tests/collective/gpt_run_util.h"

namespace fleet::trainer::collective {
namespace {

using namespace testing_gpt;  // NOLINT: the helpers are this test's vocabulary

constexpr double kLossRel = 1e-4;
constexpr double kParamAbs = 1e-4;

// ---- the schedule ---------------------------------------------------------------------------

// Each micro-batch forward once and backward once, both in order, the
// backward after the forward; at most PipelineSlots in flight, so the slot
// a % slots of a forward is free; receives right before their use.
TEST(OneFOneBTest, EveryStageRunsEachMicroBatchOnceInOrder) {
  for (int P = 1; P <= 5; ++P) {
    for (int m = 1; m <= 8; ++m) {
      for (int s = 0; s < P; ++s) {
        const std::string where =
            "stage " + std::to_string(s) + " of " + std::to_string(P) + ", m " + std::to_string(m);
        const std::vector<PipeStep> steps = OneFOneB(P, s, m);
        const int slots = PipelineSlots(P, s, m);
        int forwards = 0, backwards = 0, most = 0;
        for (size_t i = 0; i < steps.size(); ++i) {
          const PipeStep& step = steps[i];
          if (step.op == PipeOp::kForward) {
            ASSERT_EQ(step.act, forwards) << where;
            ++forwards;
            most = std::max(most, forwards - backwards);
            ASSERT_LE(forwards - backwards, slots) << where;
          } else if (step.op == PipeOp::kBackward) {
            ASSERT_EQ(step.grad, backwards) << where;
            ASSERT_LT(backwards, forwards) << where;
            ++backwards;
          }
          // A received activation is the next forward's, a received
          // gradient the next backward's.
          if (step.op == PipeOp::kRecvAct || step.op == PipeOp::kSendGradRecvAct) {
            ASSERT_EQ(step.act, forwards) << where;
            ASSERT_FALSE(s == 0) << where;
          }
          if (step.op == PipeOp::kRecvGrad || step.op == PipeOp::kSendActRecvGrad) {
            ASSERT_LT(i + 1, steps.size());
            ASSERT_EQ(steps[i + 1], (PipeStep{PipeOp::kBackward, -1, step.grad})) << where;
            ASSERT_FALSE(s == P - 1) << where;
          }
        }
        EXPECT_EQ(forwards, m) << where;
        EXPECT_EQ(backwards, m) << where;
        EXPECT_EQ(most, slots) << where;
      }
    }
  }
}

// What a stage exchanges over its link with the next stage (`up` true) or
// the previous one: per exchange, the activation's and the gradient's
// micro-batch (-1: none).
std::vector<std::pair<int, int>> LinkExchanges(int P, int s, int m, bool up) {
  std::vector<std::pair<int, int>> out;
  for (const PipeStep& step : OneFOneB(P, s, m)) {
    switch (step.op) {
      case PipeOp::kSendAct:
      case PipeOp::kSendActRecvGrad:
      case PipeOp::kRecvGrad:
        if (up) out.emplace_back(step.act, step.grad);
        break;
      case PipeOp::kRecvAct:
      case PipeOp::kSendGradRecvAct:
      case PipeOp::kSendGrad:
        if (!up) out.emplace_back(step.act, step.grad);
        break;
      default:
        break;
    }
  }
  return out;
}

TEST(OneFOneBTest, NeighboursListTheSameExchanges) {
  for (int P = 2; P <= 6; ++P) {
    for (int m = 1; m <= 9; ++m) {
      for (int s = 0; s + 1 < P; ++s) {
        EXPECT_EQ(LinkExchanges(P, s, m, true), LinkExchanges(P, s + 1, m, false))
            << "link " << s << " of " << P << " stages, " << m << " micro-batches";
      }
    }
  }
}

// Megatron's example: 4 stages, 8 micro-batches. Stage 0 runs 3 warmup
// forwards; the last stage alternates from the start; the bubble is 3/11.
TEST(OneFOneBTest, MegatronsWarmupSlotsAndBubble) {
  using Op = PipeOp;
  const std::vector<PipeStep> first = OneFOneB(4, 0, 8);
  const std::vector<PipeStep> head(first.begin(), first.begin() + 9);
  EXPECT_EQ(head, (std::vector<PipeStep>{{Op::kForward, 0},
                                         {Op::kSendAct, 0},
                                         {Op::kForward, 1},
                                         {Op::kSendAct, 1},
                                         {Op::kForward, 2},
                                         {Op::kSendAct, 2},
                                         {Op::kForward, 3},
                                         {Op::kSendActRecvGrad, 3, 0},
                                         {Op::kBackward, -1, 0}}));
  const std::vector<PipeStep> last = OneFOneB(4, 3, 8);
  EXPECT_EQ(std::vector<PipeStep>(last.begin(), last.begin() + 4),
            (std::vector<PipeStep>{{Op::kRecvAct, 0},
                                   {Op::kForward, 0},
                                   {Op::kBackward, -1, 0},
                                   {Op::kSendGradRecvAct, 1, 0}}));
  EXPECT_EQ(PipelineSlots(4, 0, 8), 4);
  EXPECT_EQ(PipelineSlots(4, 3, 8), 1);
  EXPECT_EQ(PipelineSlots(4, 0, 2), 2);
  EXPECT_DOUBLE_EQ(PipelineBubble(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(PipelineBubble(1, 8), 0.0);
}

// ---- the link and the layout ----------------------------------------------------------------

TEST(PipeLinkTest, MovesBothWaysOverSharedMemoryAndGloo) {
  for (const std::string kind : {"shm", "gloo"}) {
    fleet::testing::RunRanksOver(kind, 2, milliseconds(30000), [&](int rank, Collective& group) {
      PipeLink link(&group);
      std::vector<float> up = rank == 0 ? std::vector<float>{1, 2, 3} : std::vector<float>(3);
      std::vector<float> down = rank == 1 ? std::vector<float>{4, 5} : std::vector<float>(2);
      fleet::testing::ThrowIfError(link.Exchange(up.data(), 3, down.data(), 2, "a test"), kind);
      float one = rank == 1 ? 6.0f : 0.0f;
      fleet::testing::ThrowIfError(link.Exchange(nullptr, 0, &one, 1, "a test"), kind);
      if (up != std::vector<float>{1, 2, 3} || down != std::vector<float>{4, 5} || one != 6.0f) {
        throw std::runtime_error(kind + ": rank " + std::to_string(rank) + " got other values");
      }
      // Rank 0 sent 3 floats up, rank 1 2 + 1 down.
      const int64_t sent = 3 * sizeof(float);
      if (link.bytes_sent() != sent || link.lower() != (rank == 0)) {
        throw std::runtime_error(kind + ": rank " + std::to_string(rank) + " counted " +
                                 std::to_string(link.bytes_sent()) + " bytes");
      }
    });
  }
}

// FleetX's order [data, pipe, sharding, model]: the stage varies slower than
// the tensor-parallel and sharding indices, faster than the dp index.
TEST(PipeLinkTest, TheStageIndexVariesBetweenShardingAndDp) {
  const HybridLayout layout{/*dp_degree=*/2, /*sharding_degree=*/1, /*mp_degree=*/2,
                            /*pp_degree=*/2};
  EXPECT_EQ(layout.world_size(), 8);
  // rank -> (dp, stage, mp)
  const int want[8][3] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                          {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(layout.dp_index(rank), want[rank][0]) << rank;
    EXPECT_EQ(layout.pp_index(rank), want[rank][1]) << rank;
    EXPECT_EQ(layout.mp_index(rank), want[rank][2]) << rank;
    EXPECT_EQ(layout.data_rank(rank), want[rank][0]) << rank;
    EXPECT_EQ(layout.RankOf(want[rank][0], 0, want[rank][2], want[rank][1]), rank);
  }
}

// ---- training through the stages ------------------------------------------------------------

std::vector<std::string> Pp2(std::vector<std::string> extra = {}) {
  extra.push_back("Distributed.pp_degree=2");
  return extra;
}

// Every stage of a replica reports the same losses (the last stage's).
void ExpectStagesAgree(const std::vector<RankRun>& runs, int stride, const std::string& name) {
  for (size_t r = 0; r < runs.size(); ++r) {
    const size_t first = r / (2 * stride) * (2 * stride) + r % stride;
    EXPECT_EQ(runs[r].report.step_losses, runs[first].report.step_losses)
        << name << ": rank " << r << " vs " << first;
    EXPECT_EQ(runs[r].report.params, runs[0].report.params) << name << ": rank " << r;
  }
}

TEST(PipelineTrainingTest, Pp2WithMpDpAndShardingMatchesOneProcess) {
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one")), 1);
  const std::vector<double> want = AsDouble(one[0].report.step_losses);
  ASSERT_EQ(want.size(), 20u);
  struct Split {
    std::string name;
    int ranks;
    int stride;  // ranks between a rank and its next stage: sharding x mp
    std::vector<std::string> overrides;
  };
  for (const Split& split :
       {Split{"pp2", 2, 1, Pp2()}, Split{"pp2 x mp2", 4, 2, Pp2({"Distributed.mp_degree=2"})},
        Split{"pp2 x dp2", 4, 1, Pp2({"Distributed.dp_degree=2"})},
        Split{"pp2 x sharding2 stage 1", 4, 2,
              Pp2({"Distributed.sharding.sharding_degree=2",
                   "Distributed.sharding.sharding_stage=1"})}}) {
    std::vector<RankRun> runs =
        Train(TinyJob(split.ranks, FreshDir("pp"), split.overrides), split.ranks,
              {.collective = split.name == "pp2" ? "shm" : "gloo"});
    ExpectClose(MeanLosses(runs), want, kLossRel, split.name);
    ExpectParamsClose(runs[0].report.params, one[0].report.params, split.name, kParamAbs);
    ExpectStagesAgree(runs, split.stride, split.name);
    // Only the first stage's first rank prints.
    EXPECT_NE(runs[0].log.find("[train]"), std::string::npos) << split.name;
    EXPECT_EQ(runs[split.stride].log.find("[train]"), std::string::npos) << split.name;
    std::cout << split.name << ": step 20 loss " << MeanLosses(runs).back() << " vs one process "
              << want.back() << std::endl;
  }
}

// Dropout's masks follow the sample, not the stage or micro-batch: pp 2
// with dropout gives one process's losses with the same dropout, and
// recompute (each stage's backward replays its blocks' forward, masks
// included) changes nothing.
TEST(PipelineTrainingTest, Pp2WithDropoutAndRecomputeMatchesOneProcess) {
  const std::vector<std::string> dropout = {"Model.hidden_dropout_prob=0.1",
                                            "Model.attention_probs_dropout_prob=0.1",
                                            "Model.use_recompute=True"};
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one"), dropout), 1);
  std::vector<RankRun> runs = Train(TinyJob(2, FreshDir("pp"), Pp2(dropout)), 2);
  ExpectClose(MeanLosses(runs), AsDouble(one[0].report.step_losses), kLossRel, "pp2 dropout");
  ExpectParamsClose(runs[0].report.params, one[0].report.params, "pp2 dropout", kParamAbs);
}

// Four stages of one block each: middle stages (both links), and the first
// and last stage's own "embed" group for wte.
TEST(PipelineTrainingTest, Pp4MatchesOneProcess) {
  const std::vector<std::string> four_layers = {"Model.num_layers=4"};
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one"), four_layers), 1);
  std::vector<std::string> pp4 = four_layers;
  pp4.push_back("Distributed.pp_degree=4");
  std::vector<RankRun> runs = Train(TinyJob(4, FreshDir("pp"), pp4), 4);
  ExpectClose(MeanLosses(runs), AsDouble(one[0].report.step_losses), kLossRel, "pp4");
  ExpectParamsClose(runs[0].report.params, one[0].report.params, "pp4", kParamAbs);
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(runs[r].report.step_losses, runs[0].report.step_losses) << "stage " << r;
  }
}

// A pp 2 run cut at step 10 resumes bit for bit; its checkpoint is the
// whole model's, so one process continues it within the tolerance.
TEST(PipelineTrainingTest, ResumesExactlyAndTheCheckpointLoadsInOneProcess) {
  std::vector<RankRun> whole = Train(TinyJob(2, FreshDir("whole"), Pp2()), 2);
  const fs::path dir = FreshDir("cut");
  std::vector<std::string> first = Pp2();
  first.push_back("Engine.max_steps=10");
  Train(TinyJob(2, dir, first), 2);
  const fs::path same = FreshDir("same");
  fs::copy(dir, same, fs::copy_options::recursive);
  std::vector<RankRun> resumed = Train(TinyJob(2, same, Pp2()), 2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(resumed[r].report.start_step, 10);
    const std::vector<float>& all = whole[r].report.step_losses;
    EXPECT_EQ(resumed[r].report.step_losses, std::vector<float>(all.begin() + 10, all.end()))
        << "stage " << r;
    EXPECT_EQ(resumed[r].report.params, whole[r].report.params) << "stage " << r;
  }
  std::vector<RankRun> one = Train(TinyJob(1, dir), 1);
  EXPECT_EQ(one[0].report.start_step, 10);
  const std::vector<double> want = MeanLosses(whole);
  ExpectClose(AsDouble(one[0].report.step_losses),
              std::vector<double>(want.begin() + 10, want.end()), kLossRel, "one process");
}

// Engine.init_from's whole-model weights: each stage (and tensor-parallel
// rank) takes its part, so pp 2 x mp 2 starts where one process does.
TEST(PipelineTrainingTest, InitFromGivesEachStageItsPart) {
  const fs::path pretrained = FreshDir("pretrained");
  Train(TinyJob(1, pretrained, {"Engine.max_steps=5"}), 1);
  const std::vector<std::string> from = {"Engine.init_from=" + pretrained.string(),
                                         "Engine.max_steps=3"};
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one"), from), 1);
  std::vector<std::string> split = from;
  split.push_back("Distributed.pp_degree=2");
  split.push_back("Distributed.mp_degree=2");
  std::vector<RankRun> runs = Train(TinyJob(4, FreshDir("pp"), split), 4);
  EXPECT_EQ(runs[0].report.start_step, 0);
  ExpectClose(MeanLosses(runs), AsDouble(one[0].report.step_losses), kLossRel, "from pretrained");
}

}  // namespace
}  // namespace fleet::trainer::collective
