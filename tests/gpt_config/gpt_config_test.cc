#include "collective/config/gpt_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "collective/config/gpt_data.h"
#include "data/megatron_data.h"
#include "tests/data/test_util.h"

namespace fleet::trainer::config {
namespace {

using data::testing::TempDir;
using data::testing::WritePlain;
using ::testing::HasSubstr;

std::string ConfigDir() { return data::testing::SourcePath("configs/gpt"); }

std::string Config(const std::string& name) { return ConfigDir() + "/" + name; }

Status LoadError(const std::string& name, const std::vector<std::string>& overrides,
                 int64_t world = 0) {
  auto c = LoadGptJobConfig(Config(name), overrides, world);
  return c.ok() ? Status::OK() : c.status();
}

TEST(GptConfigTest, EveryShippedConfigLoads) {
  int count = 0;
  for (const auto& e : std::filesystem::directory_iterator(ConfigDir())) {
    if (e.path().extension() != ".yaml") continue;
    ++count;
    auto c = LoadGptJobConfig(e.path().string(), {});
    EXPECT_TRUE(c.ok()) << e.path() << ": " << c.status().ToString();
  }
  EXPECT_GE(count, 6);
}

TEST(GptConfigTest, ShippedConfigsResolveAsFleetXDoes) {
  auto c345 = LoadGptJobConfig(Config("pretrain_gpt_345M_single_card.yaml"), {});
  ASSERT_TRUE(c345.ok()) << c345.status().ToString();
  EXPECT_EQ(c345->model.hidden_size, 1024);
  EXPECT_EQ(c345->model.num_layers, 24);
  EXPECT_EQ(c345->global.global_batch_size, 8);
  EXPECT_EQ(c345->engine.accumulate_steps, 1);
  EXPECT_EQ(c345->data.train.dataset.kind, DatasetKind::kFleetX);
  EXPECT_EQ(c345->data.eval.dataset.input_dir, "./data/");
  EXPECT_TRUE(c345->data.eval.present);
  EXPECT_FALSE(c345->data.test.present);
  EXPECT_EQ(c345->engine.save_load.save_steps, 1000);
  EXPECT_EQ(c345->engine.test_iters, 100);  // eval_iters x 10

  auto c13 = LoadGptJobConfig(Config("pretrain_gpt_1.3B_dp8.yaml"), {}, 8);
  ASSERT_TRUE(c13.ok()) << c13.status().ToString();
  EXPECT_EQ(c13->distributed.dp_degree, 8);
  EXPECT_EQ(c13->global.global_batch_size, 64);
  EXPECT_EQ(c13->global.local_batch_size, 8);
  EXPECT_EQ(c13->model.ffn(), 8192);
  EXPECT_TRUE(c13->model.use_recompute);
  // FleetX's way of shrinking it: the global batch is derived.
  auto c13_small = LoadGptJobConfig(Config("pretrain_gpt_1.3B_dp8.yaml"),
                                    {"Global.local_batch_size=2", "Global.micro_batch_size=2"}, 8);
  ASSERT_TRUE(c13_small.ok()) << c13_small.status().ToString();
  EXPECT_EQ(c13_small->global.global_batch_size, 16);

  auto c67 = LoadGptJobConfig(Config("pretrain_gpt_6.7B_sharding16.yaml"), {});
  ASSERT_TRUE(c67.ok()) << c67.status().ToString();
  EXPECT_EQ(c67->distributed.dp_degree, 1);
  EXPECT_EQ(c67->distributed.sharding_degree, 16);
  EXPECT_EQ(c67->distributed.sharding_stage, 2);
  EXPECT_EQ(c67->global.global_batch_size, 128);  // 8 x dp 1 x sharding 16
  EXPECT_EQ(c67->model.ffn(), 4 * 4096);
  // On 32 ranks the derived dp_degree doubles the global batch.
  auto c67x32 = LoadGptJobConfig(Config("pretrain_gpt_6.7B_sharding16.yaml"), {}, 32);
  ASSERT_TRUE(c67x32.ok());
  EXPECT_EQ(c67x32->distributed.dp_degree, 2);
  EXPECT_EQ(c67x32->global.global_batch_size, 256);

  auto c124 = LoadGptJobConfig(Config("pretrain_gpt2_124M.yaml"), {}, 8);
  ASSERT_TRUE(c124.ok()) << c124.status().ToString();
  EXPECT_EQ(c124->global.local_batch_size, 64);
  EXPECT_EQ(c124->engine.accumulate_steps, 4);
  EXPECT_EQ(c124->engine.mix_precision.precision, Precision::kBf16);
  EXPECT_EQ(c124->model.seed, 1024u);  // Global.seed
  EXPECT_EQ(c124->optimizer.beta2, 0.95f);
  EXPECT_EQ(c124->optimizer.weight_decay, 0.1f);
  EXPECT_EQ(c124->lr.max_lr, 6e-4f);
  EXPECT_EQ(c124->lr.decay_steps, 18865);
  EXPECT_EQ(c124->lr.warmup_steps, 755);  // round(0.04 x 18865)

  auto tiny = LoadGptJobConfig(Config("pretrain_gpt_tiny.yaml"), {}, 2);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_EQ(tiny->global.device, Device::kCpu);
  EXPECT_EQ(tiny->model.num_layers, 4);
  EXPECT_EQ(tiny->model.hidden_size, 256);
  EXPECT_EQ(tiny->model.vocab_size, 257);
  EXPECT_EQ(tiny->global.local_batch_size, 8);
  EXPECT_EQ(tiny->engine.accumulate_steps, 1);
  EXPECT_EQ(tiny->data.train.dataset.kind, DatasetKind::kText);
  EXPECT_EQ(tiny->data.train.dataset.tokenizer, "byte");
  EXPECT_EQ(tiny->data.train.dataset.text_format, "percent");
  EXPECT_TRUE(tiny->data.train.dataset.input_dir.empty());
  EXPECT_EQ(tiny->data.train.dataset.max_seq_len, 128);
  EXPECT_EQ(tiny->data.eval.dataset.split, (std::vector<double>{95, 5, 0}));
  EXPECT_EQ(tiny->engine.mix_precision.precision, Precision::kFp32);
  EXPECT_EQ(tiny->model.seed, 1234u);
}

TEST(GptConfigTest, OverridesChangeAnyKey) {
  auto c = LoadGptJobConfig(
      Config("pretrain_gpt_345M_single_card.yaml"),
      {"Model.hidden_size=2048", "Model.num_attention_heads=32", "Data.Train.dataset.split=[1, 0]",
       "Global.device=cpu", "Engine.mix_precision.use_pure_fp16=True",
       "Engine.mix_precision.enable=False"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.hidden_size, 2048);
  EXPECT_EQ(c->model.ffn_hidden_size, 4096);  // given in the file, not derived
  EXPECT_EQ(c->data.train.dataset.split, (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(c->global.device, Device::kCpu);
  EXPECT_EQ(c->engine.mix_precision.precision, Precision::kFp16);
}

TEST(GptConfigTest, BadKeysAndValuesNameTheKeyAndTheirFile) {
  const std::string file = "pretrain_gpt_345M_single_card.yaml";
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  } cases[] = {
      {{"Model.hiden_size=3"}, "Model.hiden_size: unknown key"},
      {{"Bogus.x=1"}, "Bogus: unknown key"},
      {{"Model.num_layers=abc"}, "Model.num_layers: must be an integer, got 'abc'"},
      {{"Model.num_layers=0"}, "Model.num_layers: must be in [1, 65536], got 0"},
      {{"Model.hidden_size=1000"}, "1000 is not a multiple of num_attention_heads 16"},
      {{"Model.hidden_dropout_prob=1.5"}, "Model.hidden_dropout_prob: must be in [0"},
      {{"Model.attention_probs_dropout_prob=1"},
       "Model.attention_probs_dropout_prob: must be below 1 (1 drops every element)"},
      {{"Engine.mix_precision.decr_every_n_nan_or_inf=0"},
       "Engine.mix_precision.decr_every_n_nan_or_inf: must be >= 1"},
      {{"Engine.mix_precision.min_loss_scale=65536"}, "65536 is above scale_loss 32768"},
      {{"Optimizer.lr.use_increments=maybe"}, "Optimizer.lr.use_increments"},
      {{"Model.vocab_size_divisible_unit=0"}, "Model.vocab_size_divisible_unit: must be in [1"},
      {{"Global.device=tpu"}, "Global.device: must be one of cpu, gpu"},
      {{"Global.micro_batch_size=3"}, "Global.micro_batch_size: 3 does not divide local_batch"},
      {{"Global.global_batch_size=100"},
       "100 must equal local_batch_size 8 x dp_degree 1 x sharding_degree 1 = 8"},
      {{"Global.local_batch_size=null"}, "neither global_batch_size nor local_batch_size"},
      {{"Engine.accumulate_steps=2"}, "Engine.accumulate_steps: 2 must equal"},
      {{"Distributed.mp_degree=0"}, "Distributed.mp_degree"},
      {{"Distributed.sharding.sharding_stage=4"}, "Distributed.sharding.sharding_stage"},
      {{"Distributed.sharding.sharding_offload=maybe"}, "Distributed.sharding.sharding_offload"},
      {{"Model.sequence_parallel=True"}, "Model.sequence_parallel: must be false"},
      {{"Model.recompute_granularity=core_attn"}, "recompute_granularity: must be one of full"},
      {{"Optimizer.lr.min_lr=1"}, "Optimizer.lr.min_lr: 1 is above max_lr"},
      {{"Optimizer.lr.name=Linear"}, "Optimizer.lr.name: must be one of"},
      {{"Data.Train.dataset.max_seq_len=2048"}, "2048 exceeds Model.max_position_embeddings"},
      {{"Data.Train.dataset.name=Foo"}, "Data.Train.dataset.name: must be one of"},
      {{"Data.Train.dataset.input_files=a.bin"}, "give input_dir or input_files, not both"},
      {{"Data.Train.dataset.split=[0, 0, 0]"}, "the weights must not all be 0"},
      {{"Data.Train.dataset.split=[1, 2, 3, 4]"}, "must have 1..3 entries"},
      {{"Model.vocab_size=1000"}, "1024 is below the 50257 ids of the gpt2 tokenizer"},
      {{"Data=null"}, "Data.Train: missing"},
      {{"Engine.save_load.save_steps=0"}, "must be >= 1, or -1"},
      {{"Generation.max_dec_len=1", "Generation.min_dec_len=5"}, "is below min_dec_len 5"},
      {{"Profiler.enable=True"}, "Profiler.enable: must be false"},
      {{"Data.Eval.sampler.drop_last=False"}, "Data.Eval.sampler.drop_last: must be true"},
      {{"Engine.mix_precision.use_pure_fp16=True", "Engine.mix_precision.dtype=bfloat16"},
       "true asks for float16 while enable/dtype ask for bfloat16"},
  };
  for (const auto& c : cases) {
    Status st = LoadError(file, c.overrides);
    ASSERT_TRUE(st.IsInvalidArgument()) << c.overrides[0] << " -> " << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr(c.message)) << c.overrides[0];
    // The source named: the override for a key it set.
    if (c.message.starts_with(c.overrides.back().substr(0, c.overrides.back().find('=')))) {
      EXPECT_THAT(st.message(), HasSubstr("-o " + c.overrides.back()));
    }
  }
}

TEST(GptConfigTest, LoraIsReadFromModelLora) {
  auto c = LoadGptJobConfig(Config("finetune_gpt_tiny_lora.yaml"), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const GptLoraConfig& lora = c->model.lora;
  EXPECT_TRUE(lora.enabled());
  EXPECT_EQ(lora.rank, 8);
  EXPECT_EQ(lora.alpha, 16.0f);
  EXPECT_EQ(lora.scale(), 2.0f);
  EXPECT_EQ(lora.targets, (std::array<bool, kLoraTargets>{true, true, true, true}));
  // alpha defaults to the rank, targets to all four; a subset is a subset.
  c = LoadGptJobConfig(Config("finetune_gpt_tiny_lora.yaml"),
                       {"Model.lora={rank: 4, targets: [fc_proj, qkv]}"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.lora.alpha, 4.0f);
  EXPECT_EQ(c->model.lora.targets, (std::array<bool, kLoraTargets>{true, false, false, true}));
  // Without the section nothing is adapted.
  c = LoadGptJobConfig(Config("finetune_gpt_tiny.yaml"), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->model.lora.enabled());
}

TEST(GptConfigTest, BadLoraSettingsSayWhatToChange) {
  const std::string file = "finetune_gpt_tiny_lora.yaml";
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  } cases[] = {
      {{"Model.lora.rank=null"}, "Model.lora.rank: is required with Model.lora"},
      {{"Model.lora.rank=0"}, "Model.lora.rank: must be in [1,"},
      {{"Model.lora.rank=500"}, "Model.lora.rank: 500 exceeds Model.hidden_size 256"},
      {{"Model.lora.alpha=0"}, "Model.lora.alpha: must be in"},
      {{"Model.lora.dropout=0.1"}, "Model.lora.dropout: must be 0: FleetPS's LoRA has no dropout"},
      {{"Model.lora.targets=[qkv, mlp]"},
       "Model.lora.targets: entry 1 must be one of qkv, proj, fc, fc_proj; got 'mlp'"},
      {{"Model.lora.targets=[qkv, qkv]"}, "Model.lora.targets: entry 1 'qkv' is listed twice"},
      {{"Model.lora.targets=[]"}, "Model.lora.targets: must be a non-empty list"},
      {{"Model.lora.bias=all"}, "Model.lora.bias: unknown key"},
      {{"Engine.init_from="}, "Engine.init_from"},
      {{"Distributed.mp_degree=2"},
       "Distributed.mp_degree: 2 with Model.lora: LoRA trains with data parallelism"},
      {{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3"},
       "Distributed.sharding.sharding_stage: 3 with Model.lora"},
      {{"Distributed.sharding.sharding_offload=True"},
       "Distributed.sharding.sharding_offload: true with Model.lora"},
  };
  for (const auto& c : cases) {
    Status st = LoadError(file, c.overrides, 0);
    ASSERT_TRUE(st.IsInvalidArgument()) << c.overrides[0] << " -> " << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr(c.message)) << c.overrides[0];
  }
  // Model.lora without Engine.init_from: the message says what to set.
  Status st = LoadError(file, {"Engine.init_from=", "Engine.mode=pretrain",
                               "Data.Train.dataset.name=TextDataset",
                               "Data.Eval.dataset.name=TextDataset"});
  EXPECT_THAT(st.message(), HasSubstr("Model.lora: LoRA adapts a pretrained model"));
}

TEST(GptConfigTest, ErrorsInFilesNameTheFileThatSetTheKey) {
  TempDir dir;
  WritePlain(dir.File("base.yaml"),
             "Global: {local_batch_size: 6, micro_batch_size: 4}\n"
             "Data: {Train: {dataset: {input_dir: ./d}}}\n");
  WritePlain(dir.File("child.yaml"), "_base_: base.yaml\nModel: {num_layers: 2, hidden: 3}\n");
  auto unknown = LoadGptJobConfig(dir.File("child.yaml"), {});
  EXPECT_THAT(unknown.status().message(), HasSubstr("Model.hidden: unknown key"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("child.yaml"));

  WritePlain(dir.File("child.yaml"), "_base_: base.yaml\nModel: {num_layers: 2}\n");
  auto micro = LoadGptJobConfig(dir.File("child.yaml"), {});
  EXPECT_THAT(micro.status().message(), HasSubstr("Global.micro_batch_size: 4 does not divide"));
  EXPECT_THAT(micro.status().message(), HasSubstr("base.yaml"));
  EXPECT_TRUE(LoadGptJobConfig(dir.File("child.yaml"), {"Global.micro_batch_size=3"}).ok());
}

TEST(GptConfigTest, WorldSizeMustFitTheDegrees) {
  // More ranks than the file's dp_degree: one message with every override.
  Status st = LoadError("pretrain_gpt_1.3B_dp8.yaml", {}, 16);
  EXPECT_THAT(st.message(), HasSubstr("Distributed.dp_degree: 8 x sharding_degree 1 = 8 ranks, "
                                      "but the job has 16; to run on 16 ranks give "
                                      "-o Distributed.dp_degree=16 (or leave dp_degree empty"));
  EXPECT_THAT(st.message(), HasSubstr("pretrain_gpt_1.3B_dp8.yaml"));
  st = LoadError("pretrain_gpt_6.7B_sharding16.yaml", {}, 24);
  EXPECT_THAT(st.message(), HasSubstr("16 does not divide the job's 24 ranks"));
  // A global batch written with dp 8 and a derived dp of 4 no longer fits.
  st = LoadError("pretrain_gpt_1.3B_dp8.yaml",
                 {"Distributed.dp_degree=null", "Global.global_batch_size=64"}, 4);
  EXPECT_THAT(st.message(), HasSubstr("64 must equal local_batch_size 8 x dp_degree 4"));
  // With the global batch derived (FleetX's file), a derived dp just works.
  auto derived =
      LoadGptJobConfig(Config("pretrain_gpt_1.3B_dp8.yaml"), {"Distributed.dp_degree=null"}, 4);
  ASSERT_TRUE(derived.ok()) << derived.status().ToString();
  EXPECT_EQ(derived->global.global_batch_size, 32);
}

// Distributed.pp_degree: its stages are ranks of each replica (the data
// world stays dp x sharding), with sharding stage 1 at most, no offload, no
// LoRA, and a degree dividing the layers.
TEST(GptConfigTest, PipelineStagesAreRanksOfEachReplica) {
  auto c = LoadGptJobConfig(Config("pretrain_gpt_tiny.yaml"),
                            {"Distributed.pp_degree=2", "Distributed.mp_degree=2"}, 8);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->distributed.pp_degree, 2);
  EXPECT_EQ(c->distributed.dp_degree, 2);
  EXPECT_EQ(c->data_world_size(), 2);
  EXPECT_EQ(c->global.local_batch_size, 8);
  EXPECT_EQ(c->engine.accumulate_steps, 1);
  Status st = LoadError("pretrain_gpt_tiny.yaml", {"Distributed.pp_degree=3"});
  EXPECT_THAT(st.message(),
              HasSubstr("Distributed.pp_degree: 3 does not divide Model.num_layers 4"));
  st = LoadError("pretrain_gpt_tiny.yaml", {"Distributed.pp_degree=2"}, 3);
  EXPECT_THAT(st.message(),
              HasSubstr("pp_degree 2 x sharding_degree 1 does not divide the job's 3"));
  st = LoadError("pretrain_gpt_tiny.yaml",
                 {"Distributed.pp_degree=2", "Distributed.sharding.sharding_degree=2",
                  "Distributed.sharding.sharding_stage=2"});
  EXPECT_THAT(st.message(), HasSubstr("Distributed.sharding.sharding_stage: 2 with pp_degree > 1"));
  st = LoadError("pretrain_gpt_tiny.yaml",
                 {"Distributed.pp_degree=2", "Distributed.sharding.sharding_offload=True"});
  EXPECT_THAT(st.message(), HasSubstr("sharding_offload: true with pp_degree > 1"));
  st = LoadError("finetune_gpt_tiny_lora.yaml", {"Distributed.pp_degree=2"});
  EXPECT_THAT(st.message(), HasSubstr("Distributed.pp_degree: 2 with Model.lora"));
}

TEST(GptConfigTest, ADp8FileOnFewerRanksKeepsItsGlobalBatchByAccumulation) {
  for (int64_t world : {1, 2, 4}) {
    auto c = LoadGptJobConfig(Config("pretrain_gpt_1.3B_dp8.yaml"), {}, world);
    ASSERT_TRUE(c.ok()) << world << ": " << c.status().ToString();
    EXPECT_EQ(c->distributed.dp_degree, world);
    EXPECT_EQ(c->global.global_batch_size, 64);
    EXPECT_EQ(c->global.local_batch_size, 64 / world);
    EXPECT_EQ(c->global.micro_batch_size, 8);
    EXPECT_EQ(c->engine.accumulate_steps, 8 / world);
    ASSERT_EQ(c->notes.size(), 1u);
    EXPECT_THAT(c->notes[0], HasSubstr(absl::StrCat("written for 8 ranks (dp_degree 8, from ")));
    EXPECT_THAT(c->notes[0],
                HasSubstr(absl::StrCat("the job has ", world, ": running dp_degree ", world,
                                       " with the global batch 64 kept by gradient accumulation "
                                       "(local_batch_size ",
                                       64 / world, " = ", 8 / world, " micro-batches of 8)")));
  }
  // As written: nothing adjusted, nothing noted.
  auto as_written = LoadGptJobConfig(Config("pretrain_gpt_1.3B_dp8.yaml"), {}, 8);
  ASSERT_TRUE(as_written.ok()) << as_written.status().ToString();
  EXPECT_TRUE(as_written->notes.empty());
  EXPECT_EQ(as_written->engine.accumulate_steps, 1);
}

TEST(GptConfigTest, WhatTheCommandLineSaysIsNeverAdjusted) {
  // dp_degree from -o on fewer ranks: one message listing every override.
  Status st = LoadError("pretrain_gpt_1.3B_dp8.yaml", {"Distributed.dp_degree=8"}, 2);
  EXPECT_THAT(st.message(),
              HasSubstr("8 x sharding_degree 1 = 8 ranks, but the job has 2; to run on 2 ranks "
                        "give -o Distributed.dp_degree=2 -o Global.local_batch_size=32"));
  EXPECT_THAT(st.message(), HasSubstr("(from -o Distributed.dp_degree=8)"));
  // A global batch that the fewer ranks cannot split.
  st = LoadError("pretrain_gpt_1.3B_dp8.yaml",
                 {"Global.global_batch_size=8", "Global.local_batch_size=1",
                  "Global.micro_batch_size=1"},
                 3);
  EXPECT_THAT(st.message(), HasSubstr("the global batch 8 cannot be kept on them; give "
                                      "-o Distributed.dp_degree=3 -o Global.global_batch_size=3"));
  // An explicit accumulate_steps on fewer ranks contradicts the adjustment.
  st = LoadError("pretrain_gpt_1.3B_dp8.yaml", {"Engine.accumulate_steps=1"}, 1);
  EXPECT_THAT(st.message(),
              HasSubstr("give -o Distributed.dp_degree=1 -o Global.local_batch_size=64 "
                        "-o Engine.accumulate_steps=null"));
}

std::string FleetXFile(const std::string& name) {
  return data::testing::SourcePath("tests/gpt_config/fleetx/" + name);
}

// FleetX's four files as FleetX ships them (tests/gpt_config/fleetx/,
// verbatim): each loads on the ranks it is written for, with FleetX's
// dropout, float16 and derived batches; and FleetPS's copies in configs/gpt
// resolve to the same model, batches, precision, schedule and degrees.
TEST(GptConfigTest, FleetXFilesLoadAsFleetXShipsThem) {
  struct Case {
    std::string file;
    int64_t world;
    int64_t global_batch;
  };
  for (const Case& c :
       {Case{"pretrain_gpt_345M_single_card.yaml", 1, 8}, Case{"pretrain_gpt_1.3B_dp8.yaml", 8, 64},
        Case{"pretrain_gpt_6.7B_sharding16.yaml", 16, 128}}) {
    SCOPED_TRACE(c.file);
    auto fleetx = LoadGptJobConfig(FleetXFile(c.file), {}, c.world);
    ASSERT_TRUE(fleetx.ok()) << fleetx.status().ToString();
    EXPECT_EQ(fleetx->model.hidden_dropout_prob, 0.1f);
    EXPECT_EQ(fleetx->model.attention_probs_dropout_prob, 0.1f);
    EXPECT_EQ(fleetx->engine.mix_precision.precision, Precision::kFp16);
    EXPECT_EQ(fleetx->engine.mix_precision.scale_loss, 32768.0);
    EXPECT_EQ(fleetx->engine.mix_precision.decr_every_n_nan_or_inf, 2);  // Paddle's GradScaler
    EXPECT_EQ(fleetx->global.global_batch_size, c.global_batch);
    EXPECT_EQ(fleetx->model.vocab_size, 50304);  // a multiple of 128 already
    EXPECT_EQ(fleetx->data.train.dataset.split, (std::vector<double>{969, 30, 1}));
    // use_increments: the schedule advances by the global batch.
    EXPECT_EQ(fleetx->lr.step_increment, c.global_batch);
    EXPECT_EQ(fleetx->lr.decay_steps, 360000);
    EXPECT_EQ(fleetx->lr.warmup_steps, 3600);

    auto ours = LoadGptJobConfig(Config(c.file), {}, c.world);
    ASSERT_TRUE(ours.ok()) << ours.status().ToString();
    const GptConfig& a = ours->model;
    const GptConfig& b = fleetx->model;
    EXPECT_EQ(std::tie(a.vocab_size, a.hidden_size, a.num_layers, a.num_attention_heads,
                       a.max_position_embeddings, a.use_recompute, a.hidden_dropout_prob,
                       a.attention_probs_dropout_prob, a.initializer_range, a.seed),
              std::tie(b.vocab_size, b.hidden_size, b.num_layers, b.num_attention_heads,
                       b.max_position_embeddings, b.use_recompute, b.hidden_dropout_prob,
                       b.attention_probs_dropout_prob, b.initializer_range, b.seed));
    EXPECT_EQ(a.ffn(), b.ffn());
    EXPECT_EQ(ours->engine.mix_precision.precision, fleetx->engine.mix_precision.precision);
    EXPECT_EQ(std::tie(ours->global.global_batch_size, ours->global.local_batch_size,
                       ours->global.micro_batch_size, ours->engine.accumulate_steps),
              std::tie(fleetx->global.global_batch_size, fleetx->global.local_batch_size,
                       fleetx->global.micro_batch_size, fleetx->engine.accumulate_steps));
    EXPECT_EQ(std::tie(ours->lr.max_lr, ours->lr.min_lr, ours->lr.warmup_steps,
                       ours->lr.decay_steps, ours->lr.step_increment),
              std::tie(fleetx->lr.max_lr, fleetx->lr.min_lr, fleetx->lr.warmup_steps,
                       fleetx->lr.decay_steps, fleetx->lr.step_increment));
    EXPECT_EQ(std::tie(ours->distributed.dp_degree, ours->distributed.sharding_degree,
                       ours->distributed.sharding_stage, ours->distributed.mp_degree),
              std::tie(fleetx->distributed.dp_degree, fleetx->distributed.sharding_degree,
                       fleetx->distributed.sharding_stage, fleetx->distributed.mp_degree));
    EXPECT_EQ(ours->data.train.dataset.split, fleetx->data.train.dataset.split);
    EXPECT_EQ(ours->engine.logging_freq, fleetx->engine.logging_freq);
  }
  // FleetX's way of shrinking the dp8 config for a smaller machine.
  auto small = LoadGptJobConfig(FleetXFile("pretrain_gpt_1.3B_dp8.yaml"),
                                {"Global.local_batch_size=2", "Global.micro_batch_size=2"}, 8);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_EQ(small->global.global_batch_size, 16);
  EXPECT_EQ(small->lr.step_increment, 16);
  // Tensor parallel: FleetX pads the vocabulary to 128 x mp_degree.
  auto mp8 = LoadGptJobConfig(FleetXFile("pretrain_gpt_345M_single_card.yaml"),
                              {"Distributed.mp_degree=8", "Model.num_attention_heads=16"}, 8);
  ASSERT_TRUE(mp8.ok()) << mp8.status().ToString();
  EXPECT_EQ(mp8->model.vocab_size, 51200);
  ASSERT_EQ(mp8->notes.size(), 1u);
  EXPECT_THAT(mp8->notes[0], HasSubstr("50304 padded to 51200"));
}

// use_pure_fp16 (FleetX before 2023): it decides, as in FleetX; enable /
// dtype asking for another precision is refused, naming both.
TEST(GptConfigTest, UsePureFp16MeansWhatItMeansInFleetX) {
  const std::string file = FleetXFile("pretrain_gpt_345M_single_card.yaml");
  auto pure = LoadGptJobConfig(
      file, {"Engine.mix_precision.use_pure_fp16=True", "Engine.mix_precision.enable=null",
             "Engine.mix_precision.dtype=null"});
  ASSERT_TRUE(pure.ok()) << pure.status().ToString();
  EXPECT_EQ(pure->engine.mix_precision.precision, Precision::kFp16);
  auto off = LoadGptJobConfig(
      file, {"Engine.mix_precision.use_pure_fp16=False", "Engine.mix_precision.enable=null"});
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->engine.mix_precision.precision, Precision::kFp32);
  auto both = LoadGptJobConfig(file, {"Engine.mix_precision.use_pure_fp16=False"});
  EXPECT_THAT(both.status().message(),
              HasSubstr("Engine.mix_precision.use_pure_fp16: false asks for float32 while "
                        "enable/dtype ask for float16; set only one"));
}

// Data.*.dataset.name MegatronGPTDataset: input_files names the prefix (or
// either file), input_dir its one index; Megatron's sample counts follow the
// run (max_steps x global batch for Train).
TEST(GptConfigTest, MegatronDatasetsAreNamedByPrefix) {
  TempDir dir;
  std::vector<int32_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 250);
  const std::vector<int64_t> lens(30, 100);
  ASSERT_TRUE(data::WriteMegatronIndexed(dir.File("db_text_document"), tokens, lens, 257).ok());
  auto samples_of = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> o = {"Global.device=cpu",
                                  "Model.vocab_size=257",
                                  "Model.vocab_size_divisible_unit=1",
                                  "Model.max_position_embeddings=64",
                                  "Data.Train.dataset.name=MegatronGPTDataset",
                                  "Data.Train.dataset.max_seq_len=32",
                                  "Data.Train.dataset.tokenizer=byte",
                                  "Data.Train.dataset.input_dir=null",
                                  "Data.Eval=null",
                                  "Engine.max_steps=10"};
    o.insert(o.end(), extra.begin(), extra.end());
    auto c = LoadGptJobConfig(Config("pretrain_gpt_345M_single_card.yaml"), o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return data::OpenConfiguredSamples(*c, data::DataPart::kTrain);
  };
  for (const std::string name : {"db_text_document", "db_text_document.idx"}) {
    auto s = samples_of({"Data.Train.dataset.input_files=" + dir.File(name)});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_GE((*s)->num_samples(), 10 * 8);  // max_steps x global batch
    EXPECT_EQ((*s)->seq_len(), 32);
  }
  auto from_dir = samples_of(
      {"Data.Train.dataset.input_dir=" + dir.path(), "Data.Train.dataset.input_files=null"});
  ASSERT_TRUE(from_dir.ok()) << from_dir.status().ToString();
  EXPECT_THAT(samples_of({"Data.Train.dataset.input_files=a,b"}).status().message(),
              HasSubstr("names several prefixes"));
  ASSERT_TRUE(data::WriteMegatronIndexed(dir.File("other"), tokens, lens, 257).ok());
  EXPECT_THAT(samples_of({"Data.Train.dataset.input_dir=" + dir.path(),
                          "Data.Train.dataset.input_files=null"})
                  .status()
                  .message(),
              HasSubstr("holds 2 Megatron indexes"));
}

}  // namespace
}  // namespace fleet::trainer::config
