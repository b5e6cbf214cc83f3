// LoRA fine-tuning (Model.lora, trainer/models/gpt_lora.h) end to end: the
// shipped configs/gpt/finetune_gpt_tiny_lora.yaml on a tiny GPT lowers the
// loss on one and two ranks while training only the adapters; the output
// holds the adapters alone and their manifest; merged weights give the
// logits of base + adapters; a base of another fingerprint is refused when
// merging and resuming.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "tests/collective/gpt_run_util.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_hf.h"
#include "trainer/models/gpt_lora.h"
#include "trainer/models/gpt_lora_files.h"
#include "trainer/optimizer.h"

namespace fleet::trainer::collective {
namespace {

using namespace testing_gpt;  // NOLINT: the helpers are this test's vocabulary

// The fine-tuning test's tiny model (2 layers, 64 wide, 64 positions).
Result<GptJobConfig> LoraJob(int world, std::vector<std::string> extra) {
  std::vector<std::string> overrides = {
      "Model.num_layers=2", "Model.hidden_size=64", "Model.num_attention_heads=2",
      "Model.ffn_hidden_size=256", "Model.max_position_embeddings=64",
      "Data.Train.dataset.max_seq_len=64", "Data.Eval.dataset.max_seq_len=64",
      "Global.global_batch_size=8", "Global.micro_batch_size=4", "Engine.max_steps=24",
      "Engine.logging_freq=8", "Engine.eval_freq=12", "Engine.eval_iters=2",
      "Engine.save_load.save_steps=24", "Optimizer.lr.decay_steps=24",
      "Optimizer.lr.max_lr=1.0e-2"};
  for (const char* split : {"Train", "Eval"}) {
    overrides.push_back(std::string("Data.") + split + ".dataset.input_files=" +
                        data::testing::SourcePath("examples/gpt/data/shout_sample.jsonl"));
  }
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return config::LoadGptJobConfig(
      data::testing::SourcePath("configs/gpt/finetune_gpt_tiny_lora.yaml"), overrides, world);
}

// A "pretrained" checkpoint of the job's shape (parameters only), from `seed`.
fs::path BaseCheckpoint(const GptConfig& shape, const std::string& name, uint64_t seed) {
  const fs::path dir = FreshDir(name);
  GptConfig plain = shape;
  plain.lora = {};
  plain.seed = seed;
  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  auto model = std::move(GptModel::Create(plain, &backend, &kernels).value());
  Sgd no_state(&model->arena(), 1.0f);
  EXPECT_TRUE(SaveCheckpoint((dir / kGptCheckpointFile).string(), model->arena(), no_state).ok());
  return dir;
}

// A pretrained base for LoRA to adapt: the tiny model after 40 steps of
// pretraining on the fortunes (TinyJob's data, 64 positions). LoRA adapts
// what a base knows; over a random, frozen embedding it learns little.
fs::path PretrainedBase() {
  const fs::path dir = FreshDir("pretrained");
  GptJobConfig job = TinyJob(
      1, dir,
      {"Model.max_position_embeddings=64", "Data.Train.dataset.max_seq_len=64",
       "Data.Eval.dataset.max_seq_len=64", "Engine.max_steps=40", "Engine.save_load.save_steps=40",
       "Optimizer.lr.decay_steps=40"});
  Train(job, 1);
  EXPECT_TRUE(fs::exists(dir / kGptCheckpointFile));
  return dir;
}

double Mean(const std::vector<float>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

// Next-token logits of a few prompts of the shout sample's shape.
std::vector<float> Logits(GptModel& model) {
  const std::string text = "Shout: quick river\nQUICK RI";
  std::vector<int32_t> tokens(text.begin(), text.end());
  const int T = static_cast<int>(tokens.size());
  return model.LastLogits(tokens, 1, T).value();
}

TEST(GptLoraTest, TrainsOnlyTheAdaptersAndLowersTheLossOnOneAndTwoRanks) {
  Result<GptJobConfig> probe = LoraJob(1, {"Engine.init_from=unused"});
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  ASSERT_TRUE(probe->model.lora.enabled());
  EXPECT_EQ(probe->model.lora.rank, 8);
  const fs::path base = PretrainedBase();
  for (int world : {1, 2}) {
    SCOPED_TRACE(world);
    const fs::path out = FreshDir("out" + std::to_string(world));
    Result<GptJobConfig> job = LoraJob(world, {"Engine.init_from=" + base.string(),
                                               "Engine.save_load.output_dir=" + out.string()});
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    std::vector<RankRun> runs = Train(*job, world);
    const std::vector<float>& losses = runs[0].report.step_losses;
    ASSERT_EQ(losses.size(), 24u);
    std::cout << "LoRA on " << world << " rank(s): mean loss of steps 1-5 " << Mean(losses, 0, 5)
              << ", of steps 20-24 " << Mean(losses, 19, 24) << std::endl;
    EXPECT_LT(Mean(losses, 19, 24), 0.85 * Mean(losses, 0, 5)) << runs[0].log;
    ASSERT_EQ(runs[0].report.eval_metric.size(), 2u);
    EXPECT_LT(runs[0].report.eval_metric[1], runs[0].report.eval_metric[0]);
    // The trained parameters are the adapters alone: 2 layers x 8 x
    // (64 + 192 + 64 + 64 + 64 + 256 + 256 + 64).
    EXPECT_EQ(runs[0].report.params.size(), size_t(GptLoraParamCount(job->model)));
    EXPECT_EQ(GptLoraParamCount(job->model), 2 * 8 * (256 + 128 + 320 + 320));
    EXPECT_NE(runs[0].log.find("LoRA rank 8"), std::string::npos) << runs[0].log;
    EXPECT_TRUE(fs::exists(out / kGptLoraCheckpointFile));
    EXPECT_TRUE(fs::exists(out / kGptLoraManifestFile));
    EXPECT_FALSE(fs::exists(out / kGptCheckpointFile)) << "the frozen base is not saved again";
    if (world == 2) {
      EXPECT_EQ(runs[0].report.params, runs[1].report.params) << "ranks differ";
    }
  }
}

TEST(GptLoraTest, MergedWeightsGiveTheLogitsOfBasePlusAdapters) {
  const fs::path base = PretrainedBase();
  const fs::path out = FreshDir("out");
  Result<GptJobConfig> job = LoraJob(1, {"Engine.init_from=" + base.string(),
                                         "Engine.save_load.output_dir=" + out.string()});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  Train(*job, 1);

  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  // Base + adapters, as training computed them.
  auto adapted = std::move(GptModel::Create(job->model, &backend, &kernels).value());
  ASSERT_TRUE(LoadPretrainedGpt(base.string(), job->model, &adapted->arena()).ok());
  ASSERT_TRUE(
      LoadCheckpointParams((out / kGptLoraCheckpointFile).string(), &adapted->lora()->arena())
          .ok());
  const std::vector<float> want = Logits(*adapted);

  const fs::path merged_dir = FreshDir("merged");
  Status st = MergeGptLoraCheckpoint(out.string(), job->model, base.string(), merged_dir.string());
  ASSERT_TRUE(st.ok()) << st.ToString();
  GptConfig plain = job->model;
  plain.lora = {};
  auto merged = std::move(GptModel::Create(plain, &backend, &kernels).value());
  ASSERT_TRUE(LoadPretrainedGpt(merged_dir.string(), plain, &merged->arena()).ok());
  const std::vector<float> got = Logits(*merged);
  auto plain_base = std::move(GptModel::Create(plain, &backend, &kernels).value());
  ASSERT_TRUE(LoadPretrainedGpt(base.string(), plain, &plain_base->arena()).ok());
  const std::vector<float> before = Logits(*plain_base);

  ASSERT_EQ(got.size(), want.size());
  double worst = 0, moved = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1.0 + std::abs(want[i])));
    moved = std::max(moved, std::abs(double(want[i]) - before[i]));
  }
  EXPECT_LT(worst, 2e-5) << "merged logits differ from base + adapters";
  EXPECT_GT(moved, 0.1) << "the adapters changed nothing: the comparison proves nothing";
}

TEST(GptLoraTest, AnotherBaseIsRefusedWhenMergingAndResuming) {
  Result<GptJobConfig> probe = LoraJob(1, {"Engine.init_from=unused"});
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  const fs::path base = BaseCheckpoint(probe->model, "base", probe->model.seed);
  const fs::path other = BaseCheckpoint(probe->model, "other", probe->model.seed + 1);
  const fs::path out = FreshDir("out");
  Result<GptJobConfig> job =
      LoraJob(1, {"Engine.init_from=" + base.string(),
                  "Engine.save_load.output_dir=" + out.string(), "Engine.max_steps=4"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  Train(*job, 1);

  Status st = MergeGptLoraCheckpoint(out.string(), job->model, other.string(),
                                     FreshDir("merged").string());
  EXPECT_TRUE((st.code() == StatusCode::kFailedPrecondition)) << st.ToString();
  EXPECT_NE(st.ToString().find("another base model"), std::string::npos) << st.ToString();
  EXPECT_NE(st.ToString().find(base.string()), std::string::npos) << st.ToString();

  GptConfig rank4 = job->model;
  rank4.lora.rank = 4;
  st = MergeGptLoraCheckpoint(out.string(), rank4, base.string(), FreshDir("merged4").string());
  EXPECT_TRUE((st.code() == StatusCode::kFailedPrecondition)) << st.ToString();
  EXPECT_NE(st.ToString().find("rank 8"), std::string::npos) << st.ToString();

  // Resuming the run over another base.
  Result<GptJobConfig> resumed =
      LoraJob(1, {"Engine.init_from=" + other.string(),
                  "Engine.save_load.output_dir=" + out.string(), "Engine.max_steps=8"});
  ASSERT_TRUE(resumed.ok());
  Result<TrainReport> r = RunGptPretrain(*resumed, nullptr, {}, nullptr);
  EXPECT_TRUE((r.status().code() == StatusCode::kFailedPrecondition)) << r.status().ToString();
  EXPECT_NE(r.status().ToString().find("resuming LoRA adapters"), std::string::npos)
      << r.status().ToString();
}

// The dry run of the shipped 124M configs (bfloat16 on a GPU): LoRA's
// optimizer states are under a hundredth of full fine-tuning's.
TEST(GptLoraTest, DryRunOfTheShipped124MConfigs) {
  const EnvLookup env = EnvFromMap({});
  auto plan = [&](const std::string& name) {
    Result<GptJobConfig> job =
        config::LoadGptJobConfig(data::testing::SourcePath("configs/gpt/" + name), {});
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return PlanGptJob(*job, env).value();
  };
  const GptPlan lora = plan("finetune_gpt2_124M_lora.yaml");
  const GptPlan full = plan("finetune_gpt2_124M.yaml");
  std::cout << "LoRA rank 8 optimizer states " << lora.optimizer_bytes << " bytes, full "
            << full.optimizer_bytes << std::endl;
  EXPECT_EQ(lora.optimizer_bytes, 12 * 1179648);
  EXPECT_EQ(full.optimizer_bytes, 12 * int64_t{124439808});
  EXPECT_LT(lora.optimizer_bytes * 10, full.optimizer_bytes);
}

// A tiny LoRA model: what its training changes and what it leaves alone.
GptConfig TinyLoraModel() {
  GptConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 8;
  c.lora.rank = 2;
  c.lora.alpha = 4;
  c.lora.targets = {true, true, true, true};
  return c;
}

TEST(GptLoraModelTest, BaseWeightsStayBitIdenticalAndHaveNoGradients) {
  const GptConfig c = TinyLoraModel();
  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  auto model = std::move(GptModel::Create(c, &backend, &kernels).value());
  EXPECT_FALSE(model->arena().has_grads());
  ASSERT_NE(model->lora(), nullptr);
  EXPECT_EQ(&model->trainable_arena(), &model->lora()->arena());
  const std::vector<float> base = model->arena().ParamsToHost();
  const std::vector<float> adapters = model->lora()->arena().ParamsToHost();
  AdamWConfig adamw;
  AdamW opt(&model->trainable_arena(), &kernels, adamw, 1e-2f);
  std::vector<int32_t> tokens = {1, 5, 9, 3, 7, 2, 8, 4}, targets = {5, 9, 3, 7, 2, 8, 4, 1};
  std::vector<float> losses;
  for (int step = 0; step < 10; ++step) {
    model->trainable_arena().ZeroGrad();
    losses.push_back(model->Forward(tokens, targets, 1, 8).value());
    model->Backward();
    opt.Step();
  }
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_EQ(model->arena().ParamsToHost(), base) << "a frozen weight moved";
  EXPECT_NE(model->lora()->arena().ParamsToHost(), adapters);
}

// The adapters' analytic gradients against central differences of the
// loss (B set away from its zero start, so that A has a gradient too).
TEST(GptLoraModelTest, AdapterGradientsMatchFiniteDifferences) {
  const GptConfig c = TinyLoraModel();
  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  auto model = std::move(GptModel::Create(c, &backend, &kernels).value());
  ParamArena& lora = model->lora()->arena();
  std::vector<float> p = lora.ParamsToHost();
  for (size_t i = 0; i < p.size(); ++i) p[i] = 0.3f * std::sin(0.7f * static_cast<float>(i));
  ASSERT_TRUE(lora.ParamsFromHost(p).ok());
  std::vector<int32_t> tokens = {1, 5, 9, 3, 7, 2}, targets = {5, 9, 3, 7, 2, 8};
  lora.ZeroGrad();
  ASSERT_TRUE(model->Forward(tokens, targets, 1, 6).ok());
  model->Backward();
  const std::vector<float> grads = lora.GradsToHost();
  GptForwardOptions eval;
  eval.for_backward = false;
  auto loss_at = [&](size_t i, float value) {
    std::vector<float> q = p;
    q[i] = value;
    EXPECT_TRUE(lora.ParamsFromHost(q).ok());
    return static_cast<double>(model->Forward(tokens, targets, 1, 6, eval).value());
  };
  int checked = 0;
  for (size_t i = 0; i < p.size(); i += 37) {
    const float h = 2e-3f;
    const double numeric = (loss_at(i, p[i] + h) - loss_at(i, p[i] - h)) / (2.0 * h);
    EXPECT_NEAR(grads[i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << "adapter float " << i;
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace fleet::trainer::collective
