// Fine-tuning (Engine.mode finetune, collective/gpt_pretrain.h):
// a tiny GPT starts from a checkpoint (Engine.init_from), trains on
// prompt/response pairs (configs/gpt/finetune_gpt_tiny.yaml's sample) on one
// and two ranks and lowers the loss; the loss is on response tokens only
// (pairs whose prompts are random letters and whose response is constant
// reach a loss no model could if the prompts counted); and the config and
// weight errors name what to fix.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/collective/gpt_run_util.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_hf.h"
#include "trainer/optimizer.h"

namespace fleet::trainer::collective {
namespace {

using namespace testing_gpt;  // NOLINT: the helpers are this test's vocabulary

// A 2-layer, 64-wide byte-level GPT of 64 positions.
const std::vector<std::string> kTinyModel = {
    "Model.num_layers=2",
    "Model.hidden_size=64",
    "Model.num_attention_heads=2",
    "Model.ffn_hidden_size=256",
    "Model.max_position_embeddings=64",
};

// A "pretrained" checkpoint of that shape: its initial weights, saved as
// gpt_convert saves (parameters only).
fs::path InitCheckpoint(const GptJobConfig& config) {
  const fs::path dir = FreshDir("init");
  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  auto model = std::move(GptModel::Create(config.model, &backend, &kernels).value());
  Sgd no_state(&model->arena(), 1.0f);
  EXPECT_TRUE(SaveCheckpoint((dir / kGptCheckpointFile).string(), model->arena(), no_state).ok());
  return dir;
}

Result<GptJobConfig> FinetuneJob(int world, std::vector<std::string> extra) {
  std::vector<std::string> overrides = kTinyModel;
  for (const char* o :
       {"Data.Train.dataset.max_seq_len=64", "Data.Eval.dataset.max_seq_len=64",
        "Global.global_batch_size=8", "Global.micro_batch_size=4", "Engine.max_steps=24",
        "Engine.logging_freq=8", "Engine.eval_freq=12", "Engine.eval_iters=2",
        "Optimizer.lr.decay_steps=24", "Optimizer.lr.max_lr=2.0e-3"}) {
    overrides.push_back(o);
  }
  overrides.push_back("Data.Train.dataset.input_files=" +
                      data::testing::SourcePath("examples/gpt/data/shout_sample.jsonl"));
  overrides.push_back("Data.Eval.dataset.input_files=" +
                      data::testing::SourcePath("examples/gpt/data/shout_sample.jsonl"));
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return config::LoadGptJobConfig(data::testing::SourcePath("configs/gpt/finetune_gpt_tiny.yaml"),
                                  overrides, world);
}

double Mean(const std::vector<float>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

TEST(GptFinetuneTest, ShippedSampleLowersTheLossOnOneAndTwoRanks) {
  Result<GptJobConfig> probe = FinetuneJob(1, {"Engine.init_from=unused"});
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  const fs::path init = InitCheckpoint(*probe);
  for (int world : {1, 2}) {
    SCOPED_TRACE(world);
    Result<GptJobConfig> job = FinetuneJob(
        world, {"Engine.init_from=" + init.string(),
                "Engine.save_load.output_dir=" + FreshDir("out" + std::to_string(world)).string()});
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    std::vector<RankRun> runs = Train(*job, world);
    const std::vector<float>& losses = runs[0].report.step_losses;
    ASSERT_EQ(losses.size(), 24u);
    EXPECT_LT(Mean(losses, 19, 24), 0.8 * Mean(losses, 0, 5)) << runs[0].log;
    ASSERT_EQ(runs[0].report.eval_metric.size(), 2u);
    EXPECT_LT(runs[0].report.eval_metric[1], runs[0].report.eval_metric[0]);
    EXPECT_NE(runs[0].log.find("gpt_pretrain: parameters from " + init.string()), std::string::npos)
        << runs[0].log;
    if (world == 2) {
      EXPECT_EQ(runs[0].report.params, runs[1].report.params) << "ranks differ";
    }
  }
}

// Prompts of 12 random letters, response always "OK": the response (and its
// end-of-text) is learnable, the prompt is not (ln 26 = 3.26 nats a letter).
// With the prompt's 11 next-letter predictions in the loss, its mean could
// not fall below 11 x 3.26 / 14 = 2.6; on the response alone it falls
// toward 0.
TEST(GptFinetuneTest, PromptTokensCarryNoLoss) {
  const fs::path dir = FreshDir("random_prompts");
  const std::string file = (dir / "ok.jsonl").string();
  {
    std::ofstream out(file);
    std::mt19937 rng(5);
    for (int i = 0; i < 64; ++i) {
      std::string prompt;
      for (int j = 0; j < 12; ++j) prompt += static_cast<char>('a' + rng() % 26);
      out << "{\"prompt\": \"" << prompt << "\", \"response\": \"OK\"}\n";
    }
  }
  Result<GptJobConfig> probe = FinetuneJob(1, {"Engine.init_from=unused"});
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  Result<GptJobConfig> job =
      FinetuneJob(1, {"Engine.init_from=" + InitCheckpoint(*probe).string(),
                      "Engine.save_load.output_dir=" + (dir / "out").string(),
                      "Data.Train.dataset.input_files=" + file,
                      "Data.Eval.dataset.input_files=" + file, "Data.Train.dataset.max_seq_len=16",
                      "Data.Eval.dataset.max_seq_len=16", "Optimizer.lr.max_lr=5.0e-3"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  std::vector<RankRun> runs = Train(*job, 1);
  const std::vector<float>& losses = runs[0].report.step_losses;
  EXPECT_GT(losses.front(), 3.0);  // an untrained model over 257 ids
  EXPECT_LT(Mean(losses, 19, 24), 1.0) << runs[0].log;
  EXPECT_LT(runs[0].report.eval_metric.back(), 1.0) << runs[0].log;
}

TEST(GptFinetuneTest, ErrorsNameWhatToFix) {
  Status st = FinetuneJob(1, {}).status();  // the shipped init_from is kept: ok to load
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = FinetuneJob(1, {"Engine.init_from="}).status();
  EXPECT_NE(st.ToString().find("Engine.init_from"), std::string::npos) << st.ToString();
  st = FinetuneJob(1, {"Engine.mode=pretrain"}).status();
  EXPECT_NE(st.ToString().find("PromptResponseDataset needs Engine.mode: finetune"),
            std::string::npos)
      << st.ToString();
  st = FinetuneJob(1, {"Data.Train.dataset.name=TextDataset"}).status();
  EXPECT_NE(st.ToString().find("Data.Train.dataset.name"), std::string::npos) << st.ToString();

  // Weights of another shape, and none at all.
  Result<GptJobConfig> wide = FinetuneJob(1, {"Engine.init_from=unused", "Model.hidden_size=128"});
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  const fs::path init = InitCheckpoint(*wide);
  Result<GptJobConfig> job =
      FinetuneJob(1, {"Engine.init_from=" + init.string(),
                      "Engine.save_load.output_dir=" + FreshDir("out").string()});
  ASSERT_TRUE(job.ok());
  Result<TrainReport> r = RunGptPretrain(*job, nullptr, {}, nullptr);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("Engine.init_from"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("wte"), std::string::npos) << r.status().ToString();
  job = FinetuneJob(1, {"Engine.init_from=" + (init / "none").string(),
                        "Engine.save_load.output_dir=" + FreshDir("out2").string()});
  r = RunGptPretrain(*job, nullptr, {}, nullptr);
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();

  // A malformed line of the data, by file and line.
  const fs::path dir = FreshDir("bad_data");
  std::ofstream((dir / "bad.jsonl").string()) << "{\"prompt\": \"a\", \"response\": \"b\"}\n"
                                              << "{\"prompt\": \"a\"}\n";
  job = FinetuneJob(1, {"Engine.init_from=" + init.string(),
                        "Data.Train.dataset.input_files=" + (dir / "bad.jsonl").string(),
                        "Engine.save_load.output_dir=" + FreshDir("out3").string()});
  r = RunGptPretrain(*job, nullptr, {}, nullptr);
  EXPECT_NE(r.status().ToString().find((dir / "bad.jsonl").string() + ":2"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace fleet::trainer::collective
