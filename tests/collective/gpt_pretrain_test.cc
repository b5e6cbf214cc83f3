// GPT pretraining through the collective loop (collective/
// gpt_pretrain.h), ranks as threads over Gloo: 2-rank data parallel and
// ZeRO stage 1 and 2 against one rank with the same global batch, exact
// resume, a sharded checkpoint loaded with another degree, the memory each
// stage holds, and the errors of bad configs and checkpoints.
#include "collective/gpt_pretrain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/collective/gpt_run_util.h"
#include "collective/config/gpt_config.h"

namespace fleet::trainer::collective {
namespace {

using namespace testing_gpt;  // NOLINT: the helpers are this test's vocabulary

TEST(GptPretrainTest, TwoRanksDataParallelAndShardedMatchOneRank) {
  const fs::path dir = FreshDir("ref");
  std::vector<RankRun> one = Train(TinyJob(1, dir), 1);
  const std::vector<double> want = AsDouble(one[0].report.step_losses);
  ASSERT_EQ(want.size(), 20u);
  EXPECT_LT(want.back(), want.front()) << "the tiny model should learn something in 20 steps";

  const std::map<std::string, std::vector<std::string>> cases = {
      {"data parallel", {}},
      {"sharding stage 1",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1"}},
      {"sharding stage 2",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2"}},
      // Micro-batches of 4: one per step, no accumulation.
      {"sharding stage 2, no accumulation",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2",
        "Global.micro_batch_size=4"}},
  };
  for (const auto& [name, extra] : cases) {
    SCOPED_TRACE(name);
    std::vector<RankRun> two = Train(TinyJob(2, FreshDir("two"), extra), 2);
    ExpectClose(MeanLosses(two), want, 1e-4, name);
    ExpectParamsClose(two[0].report.params, one[0].report.params, name + ", rank 0");
    EXPECT_EQ(two[0].report.params, two[1].report.params) << name << ": ranks differ";
  }
}

TEST(GptPretrainTest, ShardingHoldsAShareOfTheState) {
  std::vector<RankRun> dp = Train(TinyJob(2, FreshDir("dp")), 2);
  std::vector<RankRun> s1 = Train(
      TinyJob(2, FreshDir("s1"),
              {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1"}),
      2);
  std::vector<RankRun> s2 = Train(
      TinyJob(2, FreshDir("s2"),
              {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2"}),
      2);
  const size_t full = dp[0].report.params.size() * sizeof(float);
  EXPECT_EQ(dp[0].report.memory.optimizer_bytes, 2 * full);
  EXPECT_EQ(dp[0].report.memory.gradient_bytes, full);
  for (const auto* run : {&s1, &s2}) {
    // Half of the moments, give or take a float per bucket of padding.
    EXPECT_LE((*run)[0].report.memory.optimizer_bytes, full + 64 * sizeof(float));
    EXPECT_GE((*run)[0].report.memory.optimizer_bytes, full);
  }
  // The stages differ in what they keep, not in what they compute.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(s1[r].report.step_losses, s2[r].report.step_losses) << "rank " << r;
    EXPECT_EQ(s1[r].report.params, s2[r].report.params) << "rank " << r;
  }
  // Stage 1 keeps the full gradients (and the reduced shard); stage 2 only
  // the shard.
  EXPECT_GT(s1[0].report.memory.gradient_bytes, full);
  EXPECT_LE(s2[0].report.memory.gradient_bytes, full / 2 + 32 * sizeof(float));
  // The dry run's gradient figures are these, within the buckets' padding.
  const EnvLookup no_env = [](const std::string&) { return std::optional<std::string>(); };
  const std::pair<int, const std::vector<RankRun>*> stages[] = {{0, &dp}, {1, &s1}, {2, &s2}};
  for (const auto& [stage, run] : stages) {
    GptJobConfig config = TinyJob(2, FreshDir("plan"));
    config.distributed.sharding_degree = stage > 0 ? 2 : 1;
    config.distributed.sharding_stage = stage > 0 ? stage : 1;
    auto plan = PlanGptJob(config, no_env);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_NEAR(static_cast<double>(plan->grad_bytes),
                static_cast<double>((*run)[0].report.memory.gradient_bytes),
                64.0 * sizeof(float))
        << "stage " << stage;
  }
}

TEST(GptPretrainTest, ResumeReproducesTheUninterruptedRunExactly) {
  const std::vector<std::string> sharded = {"Distributed.sharding.sharding_degree=2",
                                            "Distributed.sharding.sharding_stage=2"};
  std::vector<RankRun> whole = Train(TinyJob(2, FreshDir("whole"), sharded), 2);

  const fs::path dir = FreshDir("cut");
  std::vector<std::string> first = sharded;
  first.push_back("Engine.max_steps=10");
  Train(TinyJob(2, dir, first), 2);
  EXPECT_TRUE(fs::exists(dir / "gpt.ckpt"));
  EXPECT_TRUE(fs::exists(dir / "gpt.adamw.s10.0-of-2"));
  EXPECT_TRUE(fs::exists(dir / "gpt.adamw.s10.1-of-2"));
  EXPECT_TRUE(fs::exists(dir / "data_position"));

  std::vector<RankRun> resumed = Train(TinyJob(2, dir, sharded), 2);
  EXPECT_EQ(resumed[0].report.start_step, 10);
  for (int r = 0; r < 2; ++r) {
    const std::vector<float>& all = whole[r].report.step_losses;
    EXPECT_EQ(resumed[r].report.step_losses, std::vector<float>(all.begin() + 10, all.end()))
        << "rank " << r;
    EXPECT_EQ(resumed[r].report.params, whole[r].report.params) << "rank " << r;
  }
  // The final save replaced step 10's state files with step 20's.
  EXPECT_TRUE(fs::exists(dir / "gpt.adamw.s20.0-of-2"));
  EXPECT_FALSE(fs::exists(dir / "gpt.adamw.s10.0-of-2"));
}

TEST(GptPretrainTest, ShardedCheckpointLoadsWithAnotherDegree) {
  const std::vector<std::string> sharded = {"Distributed.sharding.sharding_degree=2",
                                            "Distributed.sharding.sharding_stage=1"};
  std::vector<RankRun> whole = Train(TinyJob(2, FreshDir("whole"), sharded), 2);
  const std::vector<double> want = MeanLosses(whole);

  // Degree 2 saves at step 10; one rank (degree 1) continues.
  const fs::path dir = FreshDir("cut");
  std::vector<std::string> first = sharded;
  first.push_back("Engine.max_steps=10");
  Train(TinyJob(2, dir, first), 2);
  std::vector<RankRun> one = Train(TinyJob(1, dir), 1);
  EXPECT_EQ(one[0].report.start_step, 10);
  ExpectClose(AsDouble(one[0].report.step_losses),
              std::vector<double>(want.begin() + 10, want.end()), 1e-4, "degree 2 -> 1");
  ExpectParamsClose(one[0].report.params, whole[0].report.params, "degree 2 -> 1");

  // And back: the degree-1 checkpoint (step 20) under degree 2 for 5 more.
  std::vector<std::string> more = sharded;
  more.push_back("Engine.max_steps=25");
  more.push_back("Optimizer.lr.decay_steps=25");
  std::vector<RankRun> again = Train(TinyJob(2, dir, more), 2);
  EXPECT_EQ(again[0].report.start_step, 20);
  EXPECT_EQ(again[0].report.step_losses.size(), 5u);
}

// FleetX's format string (ppfleetx LanguageModule.training_step_end), field
// for field, then the reader cost: a FleetX log parser reads our lines.
TEST(GptPretrainTest, TrainLineIsFleetXsLine) {
  ProgressWindow w;
  w.epoch = 0;
  w.step = 10;
  w.batch = 9;
  w.loss = 5.25;
  w.steps = 10;
  w.seconds = 2.0;
  w.global_batch = 16;
  w.learning_rate = 1e-3f;
  w.reader_seconds = 0.5;
  w.data_world_size = 2;
  EXPECT_EQ(GptTrainLine(w, 128),
            "[train] epoch: 0, batch: 9, loss: 5.250000000, avg_batch_cost: 0.20000 sec, speed: "
            "5.00 step/s, ips_total: 10240 tokens/s, ips: 5120 tokens/s, learning rate: 1.00000e-03, avg_reader_cost: 0.05000 sec");
}

// bf16 asked for on a CPU: one line says the run is fp32, and it is (the
// losses equal an fp32 run's).
TEST(GptPretrainTest, Bf16OnCpuSaysItRunsFp32) {
  const std::vector<std::string> short_run = {"Engine.max_steps=5", "Engine.eval_freq=0",
                                              "Engine.save_load.save_steps=-1"};
  std::vector<std::string> bf16 = short_run;
  bf16.push_back("Engine.mix_precision.enable=True");
  bf16.push_back("Engine.mix_precision.dtype=bfloat16");
  std::vector<RankRun> asked = Train(TinyJob(1, FreshDir("bf16"), bf16), 1);
  EXPECT_NE(asked[0].log.find("note: Engine.mix_precision asks for bf16, but the CPU kernels "
                              "compute in fp32: this run is fp32 (bf16 runs on GPUs)\n"),
            std::string::npos)
      << asked[0].log;
  std::vector<RankRun> fp32 = Train(TinyJob(1, FreshDir("fp32"), short_run), 1);
  EXPECT_EQ(fp32[0].log.find("mix_precision"), std::string::npos) << fp32[0].log;
  EXPECT_EQ(asked[0].report.step_losses, fp32[0].report.step_losses);
}

TEST(GptPretrainTest, DryRunOnCpuPlansWhatACpuRuns) {
  const EnvLookup no_env = [](const std::string&) { return std::optional<std::string>(); };
  GptJobConfig config = TinyJob(1, FreshDir("plan"), {"Engine.mix_precision.enable=True",
                                                      "Engine.mix_precision.dtype=bfloat16"});
  ASSERT_EQ(config.global.device, config::Device::kCpu);
  auto cpu = PlanGptJob(config, no_env);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  // fp32 storage (the CPU runs fp32 whatever mix_precision asks) ...
  EXPECT_EQ(cpu->param_bytes, 4 * cpu->rank_params);
  // ... and every layer's attention probabilities, as the CPU twin keeps them.
  const int64_t B = config.global.micro_batch_size, T = 32, NH = 2, L = 2;
  const auto& m = config.model;
  GptPlanOptions flash_options = GptPlanOptionsFor(config, no_env);
  flash_options.precision = Precision::kFp32;
  auto flash = PlanGpt(m, flash_options);
  ASSERT_TRUE(flash.ok());
  EXPECT_GE(cpu->activation_bytes - flash->activation_bytes, 4 * L * B * NH * (T * T - T));
  // On a GPU the plan is the flash kernels' in the precision asked for.
  config.global.device = config::Device::kGpu;
  auto gpu = PlanGptJob(config, no_env);
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->param_bytes, 2 * gpu->rank_params);
}

TEST(GptPretrainTest, LogLinesAreFleetXs) {
  std::vector<RankRun> runs = Train(TinyJob(1, FreshDir("log")), 1);
  const std::string& log = runs[0].log;
  for (const char* field :
       {"[train] epoch: 0, batch: 4, loss: ", "[train] epoch: 0, batch: 9, loss: ",
        "avg_reader_cost: ", "avg_batch_cost: ", "speed: ", "ips_total: ", "ips: ",
        "learning rate: ", "[eval] epoch: 0, step: 10, loss: ", "ppl: ",
        "[eval] epoch: 0, step: 20, loss: "}) {
    EXPECT_NE(log.find(field), std::string::npos) << "no '" << field << "' in\n" << log;
  }
  EXPECT_EQ(runs[0].report.eval_steps, (std::vector<int64_t>{10, 20}));
  // The held-out loss falls with training (byte vocabulary: ln 257 = 5.55 at start).
  EXPECT_LT(runs[0].report.eval_metric.back(), 5.0);
  EXPECT_FALSE(runs[0].report.test_metric.has_value()) << "the tiny config has no Data.Test";
}

TEST(GptPretrainTest, TestPartIsEvaluatedAfterTraining) {
  const std::string cache = (fs::path(::testing::TempDir()) / "gpt_pretrain_test_tokens").string();
  std::vector<RankRun> runs =
      Train(TinyJob(1, FreshDir("test"),
                    {"Data.Test.dataset.name=TextDataset", "Data.Test.dataset.tokenizer=byte",
                     "Data.Test.dataset.text_format=percent", "Data.Test.dataset.max_seq_len=32",
                     "Data.Test.dataset.split=[90, 5, 5]", "Data.Test.dataset.cache_dir=" + cache,
                     "Engine.test_iters=3"}),
            1);
  ASSERT_TRUE(runs[0].report.test_metric.has_value()) << runs[0].log;
  EXPECT_GT(*runs[0].report.test_metric, 0.5);
  EXPECT_LT(*runs[0].report.test_metric, 5.0);
  EXPECT_NE(runs[0].log.find("[test] step: 20, loss: "), std::string::npos) << runs[0].log;
}

TEST(GptPretrainTest, CheckpointOfAnotherShapeIsRefusedAndKept) {
  const fs::path dir = FreshDir("shape");
  Train(TinyJob(1, dir, {"Engine.max_steps=2"}), 1);
  const auto size_before = fs::file_size(dir / "gpt.ckpt");
  const auto time_before = fs::last_write_time(dir / "gpt.ckpt");
  auto report =
      RunGptPretrain(TinyJob(1, dir, {"Model.ffn_hidden_size=128"}), nullptr, {}, nullptr);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kFailedPrecondition) << report.status().ToString();
  EXPECT_NE(report.status().ToString().find("mlp.fc.weight"), std::string::npos)
      << report.status().ToString();
  EXPECT_EQ(fs::file_size(dir / "gpt.ckpt"), size_before);
  EXPECT_EQ(fs::last_write_time(dir / "gpt.ckpt"), time_before);
}

TEST(GptPretrainTest, BadConfigsAreClearErrors) {
  // The group has 1 rank, the config 2.
  GptJobConfig two = TinyJob(2, FreshDir("bad"));
  auto report = RunGptPretrain(two, nullptr, {}, nullptr);
  ASSERT_FALSE(report.ok());
  EXPECT_TRUE(report.status().IsInvalidArgument());
  EXPECT_NE(report.status().ToString().find("2"), std::string::npos);

  // A vocabulary too small for the tokenizer's ids is refused when the
  // config loads, naming the key.
  try {
    TinyJob(1, FreshDir("vocab"), {"Model.vocab_size=200"});
    ADD_FAILURE() << "a vocabulary of 200 for the byte tokenizer's 257 ids was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("Model.vocab_size"), std::string::npos) << e.what();
  }

  // A missing data file names it.
  auto missing = RunGptPretrain(
      TinyJob(1, FreshDir("missing"), {"Data.Train.dataset.input_files=/nonexistent/text.txt"}),
      nullptr, {}, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("/nonexistent/text.txt"), std::string::npos)
      << missing.status().ToString();
}

}  // namespace
}  // namespace fleet::trainer::collective
