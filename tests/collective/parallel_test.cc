// Hybrid degrees, ZeRO stage 3 and tensor parallelism through GPT
// pretraining: 4 ranks as dp 2 x sharding 2 (stages 1, 2 and 3), 2 ranks at
// stage 3, mp 2 and mp 2 x dp 2 give one process's losses, resume exactly,
// and their checkpoints load under other splits; stage 3's and tensor
// parallelism's measured memory follows the dry-run plan. Ranks are
// threads, every group a Gloo (or shared-memory) group over one in-process
// KV store.
//
// Tolerance: the losses of 4 ranks and of 1 process differ only in the
// order of float32 sums (gradient reductions over ranks; with tensor
// parallelism also the partial sums of the row-parallel GEMMs, the
// embedding and the cross-entropy), which 20 Adam steps amplify to well
// under 1e-4 relative (measured: at most 1.4e-6 on losses of 2 to 6, i.e.
// < 1e-6 relative; tensor parallel: see TensorParallelTest).
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "examples/gpt/generate_app.h"
#include "tests/collective/gpt_run_util.h"
#include "trainer/checkpoint.h"
#include "collective/parallel_groups.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt_plan.h"

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

TEST(HybridLayoutTest, ModelParallelIndexVariesFastest) {
  // Megatron's placement: a tensor-parallel group is consecutive ranks.
  const HybridLayout layout{/*dp_degree=*/2, /*sharding_degree=*/1, /*mp_degree=*/2};
  const int want[4][3] = {{0, 0, 0}, {0, 0, 1}, {1, 0, 0}, {1, 0, 1}};  // -> (dp, sharding, mp)
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(layout.dp_index(rank), want[rank][0]) << "rank " << rank;
    EXPECT_EQ(layout.sharding_index(rank), want[rank][1]) << "rank " << rank;
    EXPECT_EQ(layout.mp_index(rank), want[rank][2]) << "rank " << rank;
    EXPECT_EQ(layout.data_rank(rank), rank / 2) << "rank " << rank;
    EXPECT_EQ(layout.RankOf(want[rank][0], want[rank][1], want[rank][2]), rank);
  }
  EXPECT_EQ((HybridLayout{2, 2, 2}).RankOf(1, 1, 1), 7);
  EXPECT_EQ((HybridLayout{2, 2, 2}).world_size(), 8);
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

// A run resumed from step `from` of an uninterrupted run `whole` on the
// same split goes on bit for bit: the same losses and final parameters on
// every rank.
void ExpectResumesExactly(const std::vector<RankRun>& resumed, const std::vector<RankRun>& whole,
                          int64_t from) {
  ASSERT_EQ(resumed.size(), whole.size());
  ASSERT_EQ(resumed[0].report.start_step, from);
  for (size_t r = 0; r < whole.size(); ++r) {
    const std::vector<float>& all = whole[r].report.step_losses;
    EXPECT_EQ(resumed[r].report.step_losses, std::vector<float>(all.begin() + from, all.end()))
        << "rank " << r;
    EXPECT_EQ(resumed[r].report.params, whole[r].report.params) << "rank " << r;
  }
}

// The first step (1-based, from `from` + 1) at which two runs' losses on
// some rank differ; 0 when every loss and the final parameters agree.
int64_t FirstDifference(const std::vector<RankRun>& a, const std::vector<RankRun>& b,
                        int64_t from) {
  for (size_t r = 0; r < a.size(); ++r) {
    const std::vector<float>& la = a[r].report.step_losses;
    const std::vector<float>& lb = b[r].report.step_losses;
    for (size_t s = 0; s < lb.size(); ++s) {
      if (s + from >= la.size() || la[s + from] != lb[s]) return from + s + 1;
    }
    if (a[r].report.params != b[r].report.params) return from + lb.size() + 1;
  }
  return 0;
}

// Trains `ranks` ranks with `overrides` for 10 steps into a fresh
// directory, resumes them there, and expects the uninterrupted run `whole`.
// When they differ, a second uninterrupted run says which of the two went
// astray (the test fails either way): this failed twice under load in
// session 33 and was not reproduced since.
void ExpectCutAtTenResumesExactly(int ranks, const std::vector<std::string>& overrides,
                                  const std::vector<RankRun>& whole) {
  const fs::path dir = FreshDir("cut");
  std::vector<std::string> first = overrides;
  first.push_back("Engine.max_steps=10");
  Train(TinyJob(ranks, dir, first), ranks);
  const std::vector<RankRun> resumed = Train(TinyJob(ranks, dir, overrides), ranks);
  if (const int64_t step = FirstDifference(whole, resumed, 10); step != 0) {
    const std::vector<RankRun> again = Train(TinyJob(ranks, FreshDir("again"), overrides), ranks);
    ADD_FAILURE() << "the resumed run differs from the uninterrupted one from step " << step
                  << "; a second uninterrupted run differs from the first from step "
                  << FirstDifference(whole, again, 0) << " and from the resumed run from step "
                  << FirstDifference(again, resumed, 10)
                  << " (0: never; one past the last step: only the final parameters)";
  }
  ExpectResumesExactly(resumed, whole, 10);
}

TEST(HybridParallelTest, DpTimesShardingMatchesOneProcess) {
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one")), 1);
  const std::vector<double> want = AsDouble(one[0].report.step_losses);
  ASSERT_EQ(want.size(), 20u);
  for (int stage : {1, 2, 3}) {
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
  ExpectResumesExactly(resumed, whole, 10);

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

std::vector<std::string> Stage3(int degree) {
  return {"Distributed.sharding.sharding_degree=" + std::to_string(degree),
          "Distributed.sharding.sharding_stage=3"};
}

TEST(ZeroStage3Test, TwoRanksMatchOneProcessResumeAndLoadElsewhere) {
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one")), 1);
  const std::vector<double> want = AsDouble(one[0].report.step_losses);
  std::vector<RankRun> whole = Train(TinyJob(2, FreshDir("whole"), Stage3(2)), 2);
  ExpectClose(MeanLosses(whole), want, kLossRel, "stage 3 on 2 ranks");
  ExpectParamsClose(whole[0].report.params, one[0].report.params, "stage 3 on 2 ranks");
  EXPECT_EQ(whole[0].report.params, whole[1].report.params);
  // Between steps a rank keeps half the parameters.
  const size_t full = one[0].report.params.size() * sizeof(float);
  EXPECT_LE(whole[0].report.memory.param_bytes, full / 2 + 64 * sizeof(float));

  const fs::path dir = FreshDir("cut");
  std::vector<std::string> first = Stage3(2);
  first.push_back("Engine.max_steps=10");
  Train(TinyJob(2, dir, first), 2);
  const fs::path same = FreshDir("same");
  fs::copy(dir, same, fs::copy_options::recursive);
  std::vector<RankRun> resumed = Train(TinyJob(2, same, Stage3(2)), 2);
  ExpectResumesExactly(resumed, whole, 10);
  // Stage 3's checkpoint under one process.
  std::vector<RankRun> single = Train(TinyJob(1, dir), 1);
  ASSERT_EQ(single[0].report.start_step, 10);
  const std::vector<double> whole_losses = MeanLosses(whole);
  ExpectClose(AsDouble(single[0].report.step_losses),
              std::vector<double>(whole_losses.begin() + 10, whole_losses.end()), kLossRel,
              "stage 3 checkpoint on one process");
}

// Offload (sharding_offload): master weights and moments on the host
// arena, updated by the CPU twin's own threads; same losses, exact resume.
TEST(ZeroStage3Test, OffloadMatchesOneProcessAndResumes) {
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one")), 1);
  std::vector<std::string> offload = Stage3(2);
  offload.push_back("Distributed.sharding.sharding_offload=True");
  std::vector<RankRun> whole = Train(TinyJob(2, FreshDir("whole"), offload), 2);
  ExpectClose(MeanLosses(whole), AsDouble(one[0].report.step_losses), kLossRel,
              "stage 3 + offload");
  ExpectParamsClose(whole[0].report.params, one[0].report.params, "stage 3 + offload");
  // Nothing of AdamW's on the device; master, m, v and gradients of half the
  // parameters on the host.
  const UpdaterMemory& m = whole[0].report.memory;
  EXPECT_EQ(m.optimizer_bytes, 0u);
  EXPECT_EQ(m.host_bytes, 4 * m.gradient_bytes);

  ExpectCutAtTenResumesExactly(2, offload, whole);
}

// Offload with clipping off: each piece is updated as soon as its bucket is
// reduced, during backward (sharded_adamw.h; ShardedAdamWTest checks that
// it happens). Stages 1 and 3 on 2 ranks give one process's losses and
// resume bit for bit.
TEST(ZeroStage3Test, OffloadWithoutClippingMatchesOneProcessAndResumes) {
  const std::string no_clip = "Optimizer.grad_clip.clip_norm=0";
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one"), {no_clip}), 1);
  for (int stage : {1, 3}) {
    const std::string name = "stage " + std::to_string(stage) + " + offload, no clipping";
    std::vector<std::string> offload = {
        "Distributed.sharding.sharding_degree=2",
        "Distributed.sharding.sharding_stage=" + std::to_string(stage),
        "Distributed.sharding.sharding_offload=True", no_clip};
    std::vector<RankRun> whole = Train(TinyJob(2, FreshDir("whole"), offload), 2);
    ExpectClose(MeanLosses(whole), AsDouble(one[0].report.step_losses), kLossRel, name);
    ExpectParamsClose(whole[0].report.params, one[0].report.params, name);
    EXPECT_EQ(whole[0].report.params, whole[1].report.params) << name;

    ExpectCutAtTenResumesExactly(2, offload, whole);
  }
}

// An 8-block model, 128 wide, so that the units held whole during a pass
// and the pages straddling unit boundaries are a small part of the state.
// The plan counts one block of gradients in flight that a shared-memory
// group, reducing on the caller's thread, never holds, so the measurement
// is below the plan by about that block (~7% here).
TEST(ZeroStage3Test, MeasuredMemoryFollowsThePlan) {
  const std::vector<std::string> model = {"Model.num_layers=8", "Model.hidden_size=128",
                                          "Model.ffn_hidden_size=512", "Engine.max_steps=6",
                                          "Engine.eval_freq=0"};
  TrainOptions measured{.collective = "shm", .measure_memory = true};
  std::vector<std::string> stage3 = Stage3(4);
  stage3.insert(stage3.end(), model.begin(), model.end());
  const GptJobConfig config = TinyJob(4, FreshDir("s3"), stage3);
  std::vector<RankRun> s3 = Train(config, 4, measured);
  std::vector<RankRun> s0 = Train(TinyJob(4, FreshDir("s0"), model), 4, measured);

  GptPlanOptions plan_options;
  plan_options.micro_batch_size = static_cast<int>(config.global.micro_batch_size);
  plan_options.seq_len = static_cast<int>(config.data.train.dataset.max_seq_len);
  plan_options.sharding_degree = 4;
  plan_options.sharding_stage = 3;
  auto plan = PlanGpt(config.model, plan_options);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const double planned = static_cast<double>(plan->model_state_bytes());
  for (int r = 0; r < 4; ++r) {
    const UpdaterMemory& m = s3[r].report.memory;
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_GT(m.measured_peak_bytes, 0u);
    EXPECT_LE(m.measured_peak_bytes, planned * 1.01);  // pages straddling the ends
    EXPECT_GE(m.measured_peak_bytes, planned * 0.90);
    // Between steps: a quarter of stage 0's parameters, gradients and moments
    // (plus the staging buffer).
    const size_t stage0 = s0[r].report.memory.measured_between_steps_bytes;
    ASSERT_GT(stage0, 0u);
    EXPECT_LE(m.measured_between_steps_bytes, 0.3 * stage0)
        << m.measured_between_steps_bytes << " vs stage 0's " << stage0;
    std::cout << "rank " << r << ": stage 3 peak " << m.measured_peak_bytes << " B (plan "
              << plan->model_state_bytes() << "), between steps " << m.measured_between_steps_bytes
              << " B; stage 0 between steps " << stage0 << " B" << std::endl;
  }
}

// Tensor parallelism (Distributed.mp_degree 2; 2 heads, so one per rank, and
// the 257-token vocabulary split 129 + 128). The two ranks of a
// model-parallel group read the same batches and compute the same loss.
// The split reorders float32 sums inside every forward and backward, not
// only in the gradient reduction (one step's gradients agree within 1e-4
// relative: collective_tensor_parallel_test), so after 20 Adam steps
// parameters with near-zero gradients differ by more: measured at most
// 3.2e-5 (lr 3e-3), bounded by kTensorParallelParamAbs.
constexpr double kTensorParallelParamAbs = 1e-4;
std::vector<std::string> Mp2(std::vector<std::string> extra = {}) {
  extra.push_back("Distributed.mp_degree=2");
  return extra;
}

TEST(TensorParallelTest, Mp2AndMp2TimesDp2MatchOneProcess) {
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one")), 1);
  const std::vector<double> want = AsDouble(one[0].report.step_losses);
  ASSERT_EQ(want.size(), 20u);
  const size_t full = one[0].report.params.size() * sizeof(float);
  struct Split {
    std::string name;
    int ranks;
    std::vector<std::string> overrides;
  };
  for (const Split& split : {Split{"mp2", 2, Mp2()}, Split{"mp2 x dp2", 4, Mp2()},
                             Split{"mp2 x sharding2 stage 3", 4,
                                   Mp2({"Distributed.sharding.sharding_degree=2",
                                        "Distributed.sharding.sharding_stage=3"})}}) {
    const std::string& name = split.name;
    const int ranks = split.ranks;
    std::vector<RankRun> runs = Train(TinyJob(ranks, FreshDir("tp"), split.overrides), ranks);
    ExpectClose(MeanLosses(runs), want, kLossRel, name);
    // The report gathers the whole model on every rank.
    ExpectParamsClose(runs[0].report.params, one[0].report.params, name, kTensorParallelParamAbs);
    for (int r = 1; r < ranks; ++r) {
      EXPECT_EQ(runs[r].report.params, runs[0].report.params) << name << ": rank " << r;
    }
    for (int r = 0; r < ranks; r += 2) {
      EXPECT_EQ(runs[r + 1].report.step_losses, runs[r].report.step_losses)
          << name << ": the model-parallel pair of rank " << r;
    }
    // Each rank holds its half of the split tensors and the small replicated
    // ones (at stage 3 half of that between steps).
    const double part = split.overrides.size() > 1 ? 0.25 : 0.5;
    EXPECT_LT(runs[0].report.memory.param_bytes, (part + 0.05) * full) << name;
    EXPECT_GT(runs[0].report.memory.param_bytes, (part - 0.05) * full) << name;
    std::cout << name << ": step 20 loss " << MeanLosses(runs).back() << " vs one process "
              << want.back() << std::endl;
  }
}

// Tensor parallelism with the offloaded update running as each bucket is
// reduced (clipping off): the model-parallel split changes only the norm and
// the checkpoint layout, neither used here, so the same tolerances hold.
TEST(TensorParallelTest, Mp2TimesSharding2OffloadWithoutClippingMatchesOneProcess) {
  const std::string no_clip = "Optimizer.grad_clip.clip_norm=0";
  std::vector<RankRun> one = Train(TinyJob(1, FreshDir("one"), {no_clip}), 1);
  const std::string name = "mp2 x sharding2 stage 3 + offload, no clipping";
  std::vector<RankRun> runs = Train(
      TinyJob(
          4, FreshDir("tp"),
          Mp2({"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3",
               "Distributed.sharding.sharding_offload=True", no_clip})),
      4);
  ExpectClose(MeanLosses(runs), AsDouble(one[0].report.step_losses), kLossRel, name);
  ExpectParamsClose(runs[0].report.params, one[0].report.params, name, kTensorParallelParamAbs);
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(runs[r].report.params, runs[0].report.params) << name << ": rank " << r;
  }
}

// gpt_generate's library on one process reads the checkpoint of a
// tensor-parallel run in `dir`: the whole model it loads is the one the run
// trained (`trained`, gathered), and it generates from it.
void ExpectGenerationLoads(const fs::path& dir, const std::vector<float>& trained) {
  const GptJobConfig config =
      TinyJob(1, dir, {"Generation.decode_strategy=greedy_search", "Generation.max_dec_len=8"});
  auto compute = CreateGptCompute("cpu", Precision::kFp32, 1);
  ASSERT_TRUE(compute.ok()) << compute.status().ToString();
  auto model = GptModel::Create(config.model, compute->backend.get(), compute->kernels.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::string ckpt = (dir / examples::gpt::kGptCheckpointFile).string();
  ASSERT_TRUE(LoadCheckpointParams(ckpt, &(*model)->arena()).ok());
  EXPECT_EQ((*model)->arena().ParamsToHost(), trained);
  auto text = examples::gpt::GenerateText(config, dir.string(), "Hi", 1, &*compute);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  ASSERT_EQ(text->texts.size(), 1u);
  EXPECT_EQ(text->texts[0].rfind("Hi", 0), 0u) << text->texts[0];
  EXPECT_GT(text->texts[0].size(), 2u) << "nothing generated";
}

TEST(TensorParallelTest, ResumesExactlyAndTheCheckpointLoadsUnderOtherSplits) {
  std::vector<RankRun> whole = Train(TinyJob(2, FreshDir("whole"), Mp2()), 2);
  const std::vector<double> want = MeanLosses(whole);
  const std::vector<double> rest(want.begin() + 10, want.end());

  const fs::path dir = FreshDir("cut");
  std::vector<RankRun> cut = Train(TinyJob(2, dir, Mp2({"Engine.max_steps=10"})), 2);
  // One state file per model part, in the whole model's layout.
  EXPECT_TRUE(fs::exists(dir / "gpt.adamw.s10.0-of-2"));
  EXPECT_TRUE(fs::exists(dir / "gpt.adamw.s10.1-of-2"));
  ExpectGenerationLoads(dir, cut[0].report.params);

  const fs::path same = FreshDir("same");
  fs::copy(dir, same, fs::copy_options::recursive);
  ExpectResumesExactly(Train(TinyJob(2, same, Mp2()), 2), whole, 10);

  // mp 2's checkpoint continues under dp 2 (no tensor parallelism).
  const fs::path dp2 = FreshDir("dp2");
  fs::copy(dir, dp2, fs::copy_options::recursive);
  std::vector<RankRun> runs = Train(TinyJob(2, dp2), 2);
  ASSERT_EQ(runs[0].report.start_step, 10);
  ExpectClose(MeanLosses(runs), rest, kLossRel, "dp2 from mp2");
  ExpectParamsClose(runs[0].report.params, whole[0].report.params, "dp2 from mp2",
                    kTensorParallelParamAbs);

  // And the other way: one process's checkpoint continues under mp 2 x dp 2.
  const fs::path single = FreshDir("single");
  Train(TinyJob(1, single, {"Engine.max_steps=10"}), 1);
  runs = Train(TinyJob(4, single, Mp2()), 4);
  ASSERT_EQ(runs[0].report.start_step, 10);
  ExpectClose(MeanLosses(runs), rest, kLossRel, "mp2 x dp2 from one process");
  ExpectParamsClose(runs[0].report.params, whole[0].report.params, "mp2 x dp2 from one process",
                    kTensorParallelParamAbs);
}

// Parameters, gradients and moments a tensor-parallel rank holds (measured
// like stage 3's, the arena's resident pages plus the moments) are the
// dry-run plan's within 10%.
TEST(TensorParallelTest, MeasuredMemoryFollowsThePlan) {
  const EnvLookup no_env = [](const std::string&) { return std::optional<std::string>(); };
  TrainOptions measured{.collective = "shm", .measure_memory = true};
  for (int ranks : {2, 4}) {
    const std::string name = ranks == 2 ? "mp2" : "mp2 x dp2";
    const GptJobConfig config =
        TinyJob(ranks, FreshDir("tp"), Mp2({"Engine.max_steps=3", "Engine.eval_freq=0"}));
    std::vector<RankRun> runs = Train(config, ranks, measured);
    auto plan = PlanGpt(config.model, GptPlanOptionsFor(config, no_env));
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const double planned = static_cast<double>(plan->model_state_bytes());
    for (int r = 0; r < ranks; ++r) {
      SCOPED_TRACE(name + ", rank " + std::to_string(r));
      const size_t peak = runs[r].report.memory.measured_peak_bytes;
      EXPECT_GE(peak, 0.9 * planned);
      EXPECT_LE(peak, 1.1 * planned);
      std::cout << name << " rank " << r << ": peak " << peak << " B, plan "
                << plan->model_state_bytes() << " B" << std::endl;
    }
  }
}

// The shipped plans of the seed setups: 10B on 8 GPUs (ZeRO-3 + offload)
// and 100B on 8 x 8 (mp 8, ZeRO-3 + offload) fit a 32 GiB V100 per rank,
// with the host memory and traffic the dry run prints.
TEST(SeedPlansTest, TenAndHundredBillionFitTheirGpus) {
  const EnvLookup no_env = [](const std::string&) { return std::optional<std::string>(); };
  struct Want {
    const char* file;
    int ranks, mp;
    double params_billions;
  };
  for (const Want& want :
       {Want{"configs/gpt/pretrain_gpt_10B_zero3_offload.yaml", 8, 1, 10.28},
        Want{"configs/gpt/pretrain_gpt_100B_mp8_zero3_offload.yaml", 64, 8, 96.87}}) {
    SCOPED_TRACE(want.file);
    auto config = config::LoadGptJobConfig(data::testing::SourcePath(want.file), {}, 0);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    const config::DistributedConfig& d = config->distributed;
    EXPECT_EQ(d.dp_degree * d.sharding_degree * d.mp_degree, want.ranks);
    const GptPlanOptions options = GptPlanOptionsFor(*config, no_env);
    EXPECT_EQ(options.ranks_per_node, 8);
    EXPECT_EQ(options.sharding_stage, 3);
    EXPECT_TRUE(options.offload);
    auto plan = PlanGpt(config->model, options);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_NEAR(plan->num_params / 1e9, want.params_billions, 0.01);
    EXPECT_NEAR(double(plan->rank_params) / plan->num_params, 1.0 / want.mp, 0.01);
    EXPECT_EQ(plan->optimizer_bytes, 0);
    EXPECT_LT(plan->total_bytes, int64_t{32} << 30) << plan->ToString();
    EXPECT_GT(plan->host_bytes_per_node, int64_t{100} << 30);
    EXPECT_GT(plan->sharding_comm_bytes, 0);
    EXPECT_EQ(plan->mp_comm_bytes > 0, want.mp > 1);
    std::cout << plan->ToString() << std::endl;
  }
}

}  // namespace
}  // namespace fleet::trainer::collective
