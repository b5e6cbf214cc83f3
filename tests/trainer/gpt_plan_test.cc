// Parameter counts against the published GPT-2 / GPT-3 / FleetX figures, and
// the dry-run plan's memory and FLOPs formulas (nothing is allocated: the
// 175B plan below would not fit in this machine's memory).
#include "trainer/models/gpt_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/trainer/test_util.h"
#include "trainer/models/gpt.h"

namespace fleet::trainer {
namespace {

GptConfig Config(int V, int P, int C, int L, int NH) {
  GptConfig c;
  c.vocab_size = V;
  c.max_position_embeddings = P;
  c.hidden_size = C;
  c.num_layers = L;
  c.num_attention_heads = NH;
  return c;
}

// Hugging Face's gpt2, gpt2-medium, gpt2-large and gpt2-xl (tied wte counted
// once): the figures model.num_parameters() prints. The GPT-2 paper's
// 117M / 345M / 762M / 1542M were counted differently for the same models.
TEST(GptParamCount, PublishedGpt2Figures) {
  EXPECT_EQ(GptParamCount(Config(50257, 1024, 768, 12, 12)), 124439808);
  EXPECT_EQ(GptParamCount(Config(50257, 1024, 1024, 24, 16)), 354823168);
  EXPECT_EQ(GptParamCount(Config(50257, 1024, 1280, 36, 20)), 774030080);
  EXPECT_EQ(GptParamCount(Config(50257, 1024, 1600, 48, 25)), 1557611200);
}

// FleetX's GPT configs pad the vocabulary to 50304; GPT-3's (Brown et al.
// 2020, table 2.1) use 2048 positions. Their names round these counts.
TEST(GptParamCount, FleetXAndGpt3Configs) {
  EXPECT_EQ(GptParamCount(Config(50304, 1024, 1024, 24, 16)), 354871296);        // "345M"
  EXPECT_EQ(GptParamCount(Config(50304, 1024, 2048, 24, 16)), 1313722368);       // "1.3B"
  EXPECT_EQ(GptParamCount(Config(50304, 1024, 4096, 32, 32)), 6654402560);       // "6.7B"
  EXPECT_EQ(GptParamCount(Config(50257, 2048, 2048, 24, 16)), 1315723264);       // GPT-3 XL "1.3B"
  EXPECT_EQ(GptParamCount(Config(50257, 2048, 4096, 32, 32)), 6658404352);       // GPT-3 "6.7B"
  EXPECT_NEAR(GptParamCount(Config(50257, 2048, 12288, 96, 96)), 175e9, 0.5e9);  // GPT-3 "175B"
}

TEST(GptParamCount, EqualsTheTableTheArenaIsBuiltFrom) {
  GptConfig c = Config(101, 17, 24, 3, 4);
  c.ffn_hidden_size = 40;
  int64_t n = 0;
  for (const ParamSpec& spec : GptParamTable(c)) n += spec.shape.numel();
  EXPECT_EQ(GptParamCount(c), n);
  EXPECT_EQ(GptParamTable(c).size(), 2u + 12u * 3u + 2u);
}

// LoRA (Model.lora): the frozen base held once in the compute precision,
// gradients and AdamW state for the adapters alone. GPT-2 124M, rank 8 on
// the four matrices of 12 blocks: 12 x 8 x (768 + 2304 + 768 + 768 + 768 +
// 3072 + 3072 + 768) = 1,179,648 adapter parameters.
TEST(GptPlan, LoraHoldsOptimizerStateForTheAdaptersAlone) {
  GptConfig c = Config(50257, 1024, 768, 12, 12);
  const GptPlanOptions bf16 = {.micro_batch_size = 8, .seq_len = 64,
                               .precision = Precision::kBf16};
  const GptPlan full = PlanGpt(c, bf16).value();
  c.lora = {.rank = 8, .alpha = 16, .targets = {true, true, true, true}};
  const GptPlan lora = PlanGpt(c, bf16).value();
  const int64_t N = 124439808, n = 1179648;
  EXPECT_EQ(lora.trainable_params, n);
  EXPECT_EQ(full.trainable_params, N);
  EXPECT_EQ(full.optimizer_bytes, 12 * N);  // 1.39 GiB
  EXPECT_EQ(lora.optimizer_bytes, 12 * n);  // 13.5 MiB
  EXPECT_LT(lora.optimizer_bytes * 10, full.optimizer_bytes);
  EXPECT_EQ(lora.grad_bytes, 2 * n);
  EXPECT_EQ(lora.param_bytes, 2 * (N + n));
  EXPECT_NE(lora.ToString().find("optimizer states 13.5 MiB"), std::string::npos)
      << lora.ToString();
  EXPECT_NE(lora.ToString().find("LoRA: 1179648 trained"), std::string::npos);
  EXPECT_NE(full.ToString().find("optimizer states 1.39 GiB"), std::string::npos);
  // The adapters' state shards like any (stage 1 over 2 ranks: half).
  GptPlanOptions sharded = bf16;
  sharded.sharding_degree = 2;
  sharded.sharding_stage = 1;
  EXPECT_EQ(PlanGpt(c, sharded).value().optimizer_bytes, 12 * (n / 2));
  // What LoRA does not do is refused by key.
  sharded.sharding_stage = 3;
  EXPECT_NE(PlanGpt(c, sharded).status().ToString().find("Model.lora"), std::string::npos);
  GptPlanOptions mp = bf16;
  mp.mp_degree = 2;
  EXPECT_TRUE(PlanGpt(c, mp).status().IsInvalidArgument());
}

TEST(GptPlan, MemoryPerRankBySharding) {
  const GptConfig c = Config(50257, 1024, 768, 12, 12);
  const int64_t N = 124439808;
  auto plan = [&](Precision p, int degree, int stage, bool cpu = false) {
    auto r = PlanGpt(c, {.micro_batch_size = 4,
                         .seq_len = 256,
                         .sharding_degree = degree,
                         .sharding_stage = stage,
                         .precision = p,
                         .cpu = cpu});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *r;
  };
  const GptPlan fp32 = plan(Precision::kFp32, 1, 0);
  EXPECT_EQ(fp32.num_params, N);
  EXPECT_EQ(fp32.param_bytes, 4 * N);
  EXPECT_EQ(fp32.grad_bytes, 4 * N);
  EXPECT_EQ(fp32.optimizer_bytes, 8 * N);
  const int64_t shard = (N + 7) / 8;
  // Stages 1 and 2 reduce-scatter into a shard buffer beside the full
  // gradients; only CPU ranks release the full ones in stage 2.
  const GptPlan s1 = plan(Precision::kBf16, 8, 1);
  EXPECT_EQ(s1.param_bytes, 2 * N);
  EXPECT_EQ(s1.grad_bytes, 2 * (N + shard));
  EXPECT_EQ(s1.optimizer_bytes, 12 * shard);
  const GptPlan s2 = plan(Precision::kFp16, 8, 2);
  EXPECT_EQ(s2.grad_bytes, 2 * (N + shard));
  EXPECT_EQ(s2.optimizer_bytes, 12 * shard);
  const GptPlan s2_cpu = plan(Precision::kFp32, 8, 2, /*cpu=*/true);
  EXPECT_EQ(s2_cpu.grad_bytes, 4 * shard);
  EXPECT_LT(s2_cpu.total_bytes, plan(Precision::kFp32, 8, 1, /*cpu=*/true).total_bytes);
  // Stage 3: shards of everything, plus the units a pass holds whole: the
  // embeddings (V C + maxT C), ln_f (2 C), two blocks (12 C^2 + 13 C each),
  // and a float32 staging buffer of the largest unit (the embeddings).
  const GptPlan s3 = plan(Precision::kFp16, 8, 3);
  const int64_t embeddings = (50257 + 1024) * 768, block = 12 * 768 * 768 + 13 * 768;
  const int64_t working = embeddings + 2 * 768 + 2 * block;
  EXPECT_EQ(s3.param_bytes, 2 * (shard + working));
  EXPECT_EQ(s3.grad_bytes, 2 * (shard + working));
  EXPECT_EQ(s3.optimizer_bytes, 12 * shard);
  EXPECT_EQ(s3.comm_buffer_bytes, 4 * ((embeddings + 7) / 8) * 8);
  EXPECT_LT(s3.param_bytes, s2.param_bytes);
  EXPECT_EQ(s3.total_bytes, s3.model_state_bytes() + s3.activation_bytes);
  EXPECT_LT(s1.total_bytes, plan(Precision::kBf16, 8, 0).total_bytes);
  EXPECT_EQ(fp32.total_bytes,
            fp32.param_bytes + fp32.grad_bytes + fp32.optimizer_bytes + fp32.activation_bytes);
  // Activations: bf16 halves them; recompute off here, and on is smaller.
  // (Not by L: the [B T, V] logits, 206 MB of the 325 MB here, stay.)
  EXPECT_EQ(s1.activation_bytes * 2, fp32.activation_bytes);
  EXPECT_EQ(fp32.activation_bytes, fp32.activation_bytes_no_recompute);
  EXPECT_LT(fp32.activation_bytes_recompute, fp32.activation_bytes_no_recompute / 2);
}

TEST(GptPlan, FlopsPerToken) {
  GptConfig c = Config(50257, 1024, 768, 12, 12);
  auto plan = PlanGpt(c, {.micro_batch_size = 1, .seq_len = 0});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->seq_len, 1024);  // 0 = max_position_embeddings
  const double matmul = 6.0 * (124439808.0 - 1024.0 * 768.0);
  const double attention = 12.0 * 12 * 1024 * 768;
  EXPECT_DOUBLE_EQ(plan->matmul_flops_per_token, matmul);
  EXPECT_DOUBLE_EQ(plan->attention_flops_per_token, attention);
  EXPECT_DOUBLE_EQ(plan->flops_per_token, matmul + attention);
  EXPECT_EQ(plan->recompute_flops_per_token, 0.0);
  c.use_recompute = true;
  plan = PlanGpt(c, {.micro_batch_size = 1, .seq_len = 1024});
  ASSERT_TRUE(plan.ok());
  EXPECT_DOUBLE_EQ(plan->recompute_flops_per_token,
                   12.0 * (8.0 * 768 * 768 + 2.0 * 768 * 3072 + 4.0 * 1024 * 768));
  EXPECT_EQ(plan->activation_bytes, plan->activation_bytes_recompute);
}

TEST(GptPlan, PlansHugeModelsWithoutAllocating) {
  GptConfig c = Config(50257, 2048, 12288, 96, 96);
  c.use_recompute = true;
  auto plan = PlanGpt(c, {.micro_batch_size = 1,
                          .seq_len = 2048,
                          .sharding_degree = 64,
                          .sharding_stage = 2,
                          .precision = Precision::kBf16});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_GT(plan->param_bytes, int64_t{300} << 30);  // 350 GB of bf16 parameters
  const std::string text = plan->ToString();
  EXPECT_NE(text.find(std::to_string(plan->num_params) + " parameters"), std::string::npos) << text;
  EXPECT_NE(text.find("optimizer states"), std::string::npos) << text;
  EXPECT_NE(text.find("recompute adds"), std::string::npos) << text;
}

// Tensor parallelism splits as Megatron does; offload moves the optimizer
// to the host; the communication per step follows the header's formulas.
TEST(GptPlan, TensorParallelOffloadAndCommunication) {
  const GptConfig c = Config(64, 16, 32, 2, 4);  // V 64, maxT 16, C 32, L 2, 4 heads
  const int64_t N = GptParamCount(c);
  auto one = PlanGpt(c, {.micro_batch_size = 2, .seq_len = 8});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->rank_params, N);
  EXPECT_EQ(one->sharding_comm_bytes + one->dp_comm_bytes + one->mp_comm_bytes, 0);
  // mp 2: wte 64x32/2, wpe 16x32 whole; per block LayerNorms 4x32 and the
  // projections' biases 2x32 whole, qkv (96x32 + 96)/2, proj 32x32/2,
  // fc (128x32 + 128)/2, fc proj 32x128/2; ln_f 2x32.
  const int64_t block =
      4 * 32 + 2 * 32 + (96 * 32 + 96) / 2 + 32 * 32 / 2 + (128 * 32 + 128) / 2 + 32 * 128 / 2;
  const int64_t rank_params = 64 * 32 / 2 + 16 * 32 + 2 * block + 2 * 32;
  auto plan = PlanGpt(c, {.micro_batch_size = 2,
                          .seq_len = 8,
                          .sharding_degree = 4,
                          .sharding_stage = 3,
                          .mp_degree = 2,
                          .dp_degree = 2,
                          .offload = true,
                          .ranks_per_node = 8});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->num_params, N);
  EXPECT_EQ(plan->rank_params, rank_params);
  const int64_t shard = (rank_params + 3) / 4;
  EXPECT_EQ(plan->optimizer_bytes, 0);
  EXPECT_EQ(plan->host_bytes_per_node, 8 * 16 * shard);
  EXPECT_EQ(plan->host_copy_bytes, 2 * 4 * shard);
  // Stage 3: a reduce-scatter and two all-gathers of the rank's parameters
  // over 4; the share all-reduced over dp 2; (2 blocks x 4 + 2) all-reduces
  // of [2 x 8, 32] over mp 2, and the cross-entropy's max and sums (3 x [16]).
  EXPECT_EQ(plan->sharding_comm_bytes, static_cast<int64_t>(3 * 0.75 * rank_params * 4));
  EXPECT_EQ(plan->dp_comm_bytes, static_cast<int64_t>(2 * 0.5 * shard * 4));
  EXPECT_EQ(plan->mp_comm_bytes,
            static_cast<int64_t>(((2 * 4 + 2) * 32 + 3) * 2 * 0.5 * 16 * 4));
  EXPECT_LT(plan->activation_bytes, one->activation_bytes);
  const std::string text = plan->ToString();
  for (const char* part : {"host per node (8 ranks)", "communication per step per rank",
                           "tensor parallel", "optimizer offloaded"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " not in " << text;
  }
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(PlanGpt(c, {.mp_degree = 3}).status(),
                                               "Distributed.mp_degree"));
}

TEST(GptPlan, RejectsBadOptionsNamingTheKey) {
  const GptConfig c = Config(50257, 1024, 768, 12, 12);
  auto expect_key = [&](GptPlanOptions o, const std::string& key, GptConfig cfg) {
    EXPECT_TRUE(testing::IsInvalidArgumentNaming(PlanGpt(cfg, o).status(), key));
  };
  expect_key({.micro_batch_size = 0}, "Global.micro_batch_size", c);
  expect_key({.seq_len = 1025}, "Data.seq_len", c);
  expect_key({.sharding_degree = 0}, "Distributed.sharding.sharding_degree", c);
  expect_key({.sharding_stage = 4}, "Distributed.sharding.sharding_stage", c);
  GptConfig bad = c;
  bad.num_attention_heads = 7;
  expect_key({}, "Model.num_attention_heads", bad);
  EXPECT_TRUE(ParsePrecision("bfloat16").ok());
  EXPECT_EQ(*ParsePrecision("fp16"), Precision::kFp16);
  EXPECT_TRUE(ParsePrecision("int8").status().IsInvalidArgument());
}

}  // namespace
}  // namespace fleet::trainer
