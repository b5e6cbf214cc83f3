// Megatron-LM's command line and DeepSpeed's JSON as a GPT job
// (collective/config/megatron_args.h): the seeds' flags land in the keys
// they mean, with Megatron's and DeepSpeed's defaults; DeepSpeed's batch
// arithmetic, optimizer, scheduler, fp16 and ZeRO sections; notes for what
// is accepted with another effect, a warning per unknown key; refusals that
// name the flag or key.
#include "collective/config/megatron_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/data/test_util.h"

namespace fleet::trainer::config {
namespace {

using data::testing::TempDir;
using data::testing::WritePlain;
using ::testing::HasSubstr;

// The issue's command line (the 100B run's flags), its sizes shrunk.
std::vector<std::string> SeedFlags(const std::string& save) {
  // A flag and its value a line, as the seed's script has them.
  // clang-format off
  return {"--model-parallel-size", "2",
          "--num-layers", "2",
          "--hidden-size", "64",
          "--num-attention-heads", "4",
          "--batch-size", "2",
          "--seq-length", "64",
          "--max-position-embeddings", "64",
          "--train-iters", "20",
          "--save", save,
          "--data-path", "db_text_document",
          "--vocab-file", "gpt2-vocab.json",
          "--merge-file", "gpt2-merges.txt",
          "--tokenizer-type", "GPT2BPETokenizer",
          "--split", "949,50,1",
          "--distributed-backend", "nccl",
          "--lr", "0.00015",
          "--lr-decay-style", "cosine",
          "--weight-decay", "1e-2",
          "--clip-grad", "1.0",
          "--warmup", ".01",
          "--log-interval", "1",
          "--save-interval", "10000",
          "--eval-interval", "1000",
          "--eval-iters", "10",
          "--fp16",
          "--checkpoint-activations"};
  // clang-format on
}

bool HasNote(const MegatronCommand& c, const std::string& part) {
  for (const std::string& n : c.notes) {
    if (n.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(MegatronArgs, TheSeedsFlagsMeanWhatMegatronMeans) {
  std::vector<std::string> args = SeedFlags("/tmp/ckpt");
  args.push_back("--cpu_threads=1");  // the program's own flags pass through
  ASSERT_TRUE(IsMegatronCommandLine(args));
  EXPECT_FALSE(IsMegatronCommandLine({"-c", "x.yaml", "--cpu_threads=1"}));
  auto c = ParseMegatronCommandLine(args, {.world_size = 4, .gpu = false});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const GptJobConfig& j = c->config;
  EXPECT_EQ(c->rest, (std::vector<std::string>{"--cpu_threads=1"}));
  EXPECT_EQ(j.global.device, Device::kCpu);
  EXPECT_EQ(j.model.num_layers, 2);
  EXPECT_EQ(j.model.hidden_size, 64);
  EXPECT_EQ(j.model.num_attention_heads, 4);
  EXPECT_EQ(j.model.max_position_embeddings, 64);
  EXPECT_EQ(j.model.vocab_size, 50432);          // 50257 padded to 128 x mp 2, as Megatron pads
  EXPECT_EQ(j.model.hidden_dropout_prob, 0.1f);  // Megatron's default
  EXPECT_TRUE(j.model.use_recompute);
  EXPECT_EQ(j.model.seed, 1234u);
  EXPECT_EQ(j.distributed.mp_degree, 2);
  EXPECT_EQ(j.distributed.dp_degree, 2);
  EXPECT_EQ(j.global.micro_batch_size, 2);
  EXPECT_EQ(j.global.global_batch_size, 4);
  EXPECT_EQ(j.engine.max_steps, 20);
  EXPECT_EQ(j.engine.logging_freq, 1);
  EXPECT_EQ(j.engine.eval_freq, 1000);
  EXPECT_EQ(j.engine.eval_iters, 10);
  EXPECT_EQ(j.engine.test_iters, 10);
  EXPECT_EQ(j.engine.save_load.output_dir, "/tmp/ckpt");
  EXPECT_EQ(j.engine.save_load.save_steps, 10000);
  EXPECT_EQ(j.engine.mix_precision.precision, Precision::kFp16);
  EXPECT_EQ(j.engine.mix_precision.scale_loss, 4294967296.0);
  EXPECT_EQ(j.engine.mix_precision.decr_every_n_nan_or_inf, 2);
  EXPECT_EQ(j.lr.max_lr, 0.00015f);
  EXPECT_EQ(j.lr.min_lr, 0.0f);
  EXPECT_EQ(j.lr.decay, LrDecay::kCosine);
  EXPECT_EQ(j.lr.decay_steps, 20);
  EXPECT_EQ(j.optimizer.weight_decay, 0.01f);
  EXPECT_EQ(j.optimizer.clip_norm, 1.0f);
  const DatasetConfig& d = j.data.train.dataset;
  EXPECT_EQ(d.kind, DatasetKind::kMegatron);
  EXPECT_EQ(d.input_files, "db_text_document");
  EXPECT_EQ(d.split, (std::vector<double>{949, 50, 1}));
  EXPECT_EQ(d.max_seq_len, 64);
  EXPECT_EQ(d.vocab_file, "gpt2-vocab.json");
  EXPECT_EQ(j.data.test.dataset.kind, DatasetKind::kMegatron);
  EXPECT_TRUE(HasNote(*c, "--distributed-backend nccl: accepted"));
  EXPECT_TRUE(HasNote(*c, "no GPU for this job"));
}

// DeepSpeed's JSON: the batch arithmetic, Adam as AdamW, WarmupDecayLR,
// dynamic fp16 from initial_scale_power, ZeRO-2 with the optimizer offloaded
// over the data-parallel ranks, and a warning per unknown key.
TEST(MegatronArgs, DeepSpeedJsonKeys) {
  TempDir dir;
  WritePlain(dir.File("ds.json"), R"({
    "train_batch_size": 16,
    "gradient_accumulation_steps": 2,
    "steps_per_print": 5,
    "gradient_clipping": 0.5,
    "optimizer": {"type": "Adam", "params": {"lr": 0.0003, "betas": [0.9, 0.95], "eps": 1e-6,
                                             "weight_decay": 0.1, "max_grad_norm": 1.0}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.0003,
                             "warmup_num_steps": 5, "total_num_steps": 40}},
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 3, "min_loss_scale": 2},
    "zero_optimization": {"stage": 2, "cpu_offload": true, "reduce_bucket_size": 50000000,
                          "allgather_bucket_size": 50000000, "overlap_comm": true,
                          "contiguous_gradients": true},
    "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true},
    "wall_clock_breakdown": true,
    "zero_allow_untested_optimizer": false
  })");
  std::vector<std::string> args = SeedFlags("/tmp/ckpt");
  args[1] = "1";  // --model-parallel-size 1: 4 data-parallel ranks
  args.erase(args.begin() + 8, args.begin() + 10);  // no --batch-size: DeepSpeed's arithmetic
  for (const std::string& a : {std::string("--deepspeed"), std::string("--deepspeed_config"),
                               dir.File("ds.json"), std::string("--cpu-optimizer")}) {
    args.push_back(a);
  }
  auto c = ParseMegatronCommandLine(args, {.world_size = 4, .gpu = true});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const GptJobConfig& j = c->config;
  EXPECT_EQ(j.global.device, Device::kGpu);
  EXPECT_EQ(j.global.micro_batch_size, 2);  // 16 / (2 x 4)
  EXPECT_EQ(j.engine.accumulate_steps, 2);
  EXPECT_EQ(j.global.global_batch_size, 16);
  EXPECT_EQ(j.distributed.sharding_degree, 4);
  EXPECT_EQ(j.distributed.dp_degree, 1);
  EXPECT_EQ(j.distributed.sharding_stage, 2);
  EXPECT_TRUE(j.distributed.sharding_offload);
  EXPECT_EQ(j.distributed.reduce_bucket_size, 50000000);
  EXPECT_EQ(j.optimizer.clip_norm, 0.5f);
  EXPECT_EQ(j.optimizer.beta2, 0.95f);
  EXPECT_EQ(j.optimizer.eps, 1e-6f);
  EXPECT_EQ(j.optimizer.weight_decay, 0.1f);
  EXPECT_EQ(j.lr.decay, LrDecay::kLinear);
  EXPECT_EQ(j.lr.warmup, LrWarmup::kLog);
  EXPECT_EQ(j.lr.warmup_steps, 5);
  EXPECT_EQ(j.lr.decay_steps, 40);
  EXPECT_EQ(j.lr.max_lr, 0.0003f);
  EXPECT_EQ(j.engine.mix_precision.precision, Precision::kFp16);
  EXPECT_EQ(j.engine.mix_precision.scale_loss, 4096.0);
  EXPECT_EQ(j.engine.mix_precision.incr_every_n_steps, 500);
  EXPECT_EQ(j.engine.mix_precision.decr_every_n_nan_or_inf, 3);
  EXPECT_EQ(j.engine.mix_precision.min_loss_scale, 2.0);
  EXPECT_EQ(j.engine.logging_freq, 1);  // --log-interval wins over steps_per_print
  EXPECT_TRUE(j.engine.wall_clock_breakdown);
  EXPECT_TRUE(HasNote(*c, "DeepSpeed's gradient_clipping 0.5 wins over --clip-grad 1"));
  EXPECT_TRUE(HasNote(*c,
                      "zero_optimization.allgather_bucket_size, overlap_comm, "
                      "contiguous_gradients: accepted"));
  EXPECT_TRUE(HasNote(*c, "activation_checkpointing: accepted"));
  EXPECT_TRUE(HasNote(*c, "warning: DeepSpeed key 'optimizer.params.max_grad_norm'"));
  EXPECT_TRUE(HasNote(*c, "warning: DeepSpeed key 'zero_allow_untested_optimizer'"));
}

TEST(MegatronArgs, RefusalsNameTheFlagOrKey) {
  TempDir dir;
  auto error_of = [&](std::vector<std::string> args, const std::string& json = "") {
    if (!json.empty()) {
      WritePlain(dir.File("ds.json"), json);
      for (const std::string& a :
           {std::string("--deepspeed"), std::string("--deepspeed_config"), dir.File("ds.json")}) {
        args.push_back(a);
      }
    }
    auto c = ParseMegatronCommandLine(args, {.world_size = 2, .gpu = true});
    return c.ok() ? std::string("(accepted)") : c.status().ToString();
  };
  auto with = [&](const std::string& flag, const std::string& value) {
    std::vector<std::string> a = SeedFlags("/tmp/x");
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == flag) {
        a[i + 1] = value;
        return a;
      }
    }
    a.push_back(flag);
    if (!value.empty()) a.push_back(value);
    return a;
  };
  auto without = [&](const std::string& flag) {
    std::vector<std::string> a = SeedFlags("/tmp/x");
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == flag) a.erase(a.begin() + i, a.begin() + i + 2);
    }
    return a;
  };
  EXPECT_THAT(error_of(without("--num-layers")),
              HasSubstr("missing: Megatron requires it: --num-layers"));
  EXPECT_THAT(error_of(with("--num-layers", "x")), HasSubstr("'x' is not an integer"));
  EXPECT_THAT(error_of(with("--lr-decay-style", "exponential")),
              HasSubstr("FleetPS's schedules are linear, cosine and constant"));
  EXPECT_THAT(error_of(with("--tokenizer-type", "BertWordPieceLowerCase")),
              HasSubstr("GPT-2's BPE"));
  EXPECT_THAT(error_of(with("--model-parallel-size", "3")), HasSubstr("does not divide"));
  EXPECT_THAT(error_of(with("--num-attention-heads", "5")),  // the config's check, by flag
              HasSubstr("64 is not a multiple of num_attention_heads 5 (from --hidden-size)"));
  EXPECT_THAT(error_of(with("--cpu-optimizer", "")), HasSubstr("runs with ZeRO"));
  EXPECT_THAT(error_of(SeedFlags("/tmp/x"), R"({"optimizer": {"type": "Lamb"}})"),
              HasSubstr("FleetPS's optimizer is AdamW"));
  EXPECT_THAT(
      error_of(SeedFlags("/tmp/x"),
               R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})"),
      HasSubstr("keeps parameters on the device"));
  EXPECT_THAT(error_of(SeedFlags("/tmp/x"), R"({"train_batch_size": 7})"),
              HasSubstr("train_batch_size: 7 is not a multiple"));
  EXPECT_THAT(error_of(SeedFlags("/tmp/x"), "[1]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(error_of(SeedFlags("/tmp/x"), R"({"scheduler": {"type": "OneCycle"}})"),
              HasSubstr("WarmupLR and WarmupDecayLR"));
  EXPECT_THAT(error_of(with("--deepspeed", "")), HasSubstr("go together"));
}

}  // namespace
}  // namespace fleet::trainer::config
