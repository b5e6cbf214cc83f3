// GptModel: the whole model against float64 NumPy (loss and every gradient,
// then three AdamW steps with warmup, cosine decay and clipping) on every
// twin, with and without recompute; recompute's bit-identical gradients and
// smaller activations; gradient accumulation; generation logits; the
// initialisation; pipeline stages chained by hand; and the errors a user
// can cause.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/gpt_ref_kernels.h"
#include "trainer/models/adamw.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_plan.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::Golden;
using testing::IsInvalidArgumentNaming;

std::vector<int32_t> Ints(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A model on one twin: the reference kernels (-1) or the CPU twin with a pool
// of that many threads.
struct Rig {
  std::unique_ptr<ThreadPool> pool;
  CpuBackend backend;
  std::unique_ptr<GptKernels> kernels;
  std::unique_ptr<GptModel> model;
};

std::unique_ptr<Rig> MakeRig(const GptConfig& config, int pool_threads) {
  auto rig = std::make_unique<Rig>();
  if (pool_threads < 0) {
    rig->kernels = std::make_unique<RefGptKernels>();
  } else {
    if (pool_threads > 0) rig->pool = std::make_unique<ThreadPool>(pool_threads);
    rig->kernels = std::make_unique<CpuGptKernels>(rig->pool.get());
  }
  auto model = GptModel::Create(config, &rig->backend, rig->kernels.get());
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (model.ok()) rig->model = std::move(*model);
  return rig;
}

// ---- golden -------------------------------------------------------------------------------

struct GoldenCase {
  int pool_threads;  // -1: reference kernels
  bool recompute;
};

class GptModelGolden : public ::testing::TestWithParam<GoldenCase> {
 protected:
  void SetUp() override {
    g_ = testing::ReadGolden(testing::GoldenDir() + "/gpt_model.golden");
    const auto& c = testing::GoldenData(g_, "config");
    ASSERT_EQ(c.size(), 8u);
    config_.vocab_size = c[0];
    config_.max_position_embeddings = c[1];
    config_.hidden_size = c[2];
    config_.num_attention_heads = c[3];
    config_.num_layers = c[4];
    config_.ffn_hidden_size = c[5];
    config_.use_recompute = GetParam().recompute;
    B_ = c[6];
    T_ = c[7];
    rig_ = MakeRig(config_, GetParam().pool_threads);
    ASSERT_NE(rig_->model, nullptr);
    testing::LoadGoldenParams(g_, &rig_->model->arena());
  }

  void ExpectArena(const std::vector<float>& host, const std::string& prefix, double abs_tol,
                   double rel_tol) {
    testing::ExpectArenaGolden(g_, rig_->model->arena(), host, prefix, abs_tol, rel_tol);
  }

  Golden g_;
  GptConfig config_;
  int B_ = 0, T_ = 0;
  std::unique_ptr<Rig> rig_;
};

TEST_P(GptModelGolden, LossAndEveryGradient) {
  GptModel& model = *rig_->model;
  model.arena().ZeroGrad();
  auto loss = model.Forward(Ints(testing::GoldenData(g_, "tokens")),
                            Ints(testing::GoldenData(g_, "targets")), B_, T_);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_NEAR(*loss, testing::GoldenData(g_, "loss")[0], 1e-5);
  model.Backward();
  ExpectArena(model.arena().GradsToHost(), "grad.", 1e-5, 1e-4);
}

TEST_P(GptModelGolden, ThreeAdamWSteps) {
  GptModel& model = *rig_->model;
  const auto& h = testing::GoldenData(g_, "adamw.hparams");
  AdamWConfig ac{
      .beta1 = h[0], .beta2 = h[1], .eps = h[2], .weight_decay = h[3], .clip_norm = h[4]};
  LrScheduleConfig lc{.max_lr = h[5],
                      .min_lr = h[6],
                      .warmup_steps = static_cast<int64_t>(h[7]),
                      .decay_steps = static_cast<int64_t>(h[8])};
  ASSERT_TRUE(ac.Validate().ok());
  ASSERT_TRUE(lc.Validate().ok());
  LrSchedule schedule(lc);
  AdamW adamw(&model.arena(), model.kernels(), ac, schedule.At(0));
  for (int t = 1; t <= 3; ++t) {
    const std::string step = "adamw.step" + std::to_string(t) + ".";
    model.arena().ZeroGrad();
    auto loss = model.Forward(Ints(testing::GoldenData(g_, "tokens")),
                              Ints(testing::GoldenData(g_, "targets")), B_, T_);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    EXPECT_NEAR(*loss, testing::GoldenData(g_, step + "loss")[0], 2e-5) << "step " << t;
    model.Backward();
    adamw.set_learning_rate(schedule.At(adamw.step()));
    adamw.Step();
    EXPECT_NEAR(adamw.last_grad_norm(), testing::GoldenData(g_, step + "norm")[0],
                1e-4 * testing::GoldenData(g_, step + "norm")[0])
        << "step " << t;
    ExpectArena(model.arena().ParamsToHost(), step, 2e-5, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Twins, GptModelGolden,
                         ::testing::Values(GoldenCase{-1, false}, GoldenCase{0, false},
                                           GoldenCase{1, false}, GoldenCase{1, true},
                                           GoldenCase{3, true}),
                         [](const ::testing::TestParamInfo<GoldenCase>& info) {
                           return std::string(info.param.pool_threads < 0
                                                  ? "Reference"
                                                  : "CpuPool" +
                                                        std::to_string(info.param.pool_threads)) +
                                  (info.param.recompute ? "Recompute" : "");
                         });

// ---- model properties on a small random config ---------------------------------------

GptConfig SmallConfig() {
  GptConfig c;
  c.vocab_size = 97;
  c.max_position_embeddings = 80;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_layers = 3;
  c.seed = 7;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch MakeBatch(int B, int T, int V, uint32_t seed) {
  Batch b;
  for (float f : testing::RandomVector(size_t(B) * T + 1, seed, 0.0f, 1.0f)) {
    b.tokens.push_back(std::min(V - 1, static_cast<int>(f * V)));
  }
  b.targets.assign(b.tokens.begin() + 1, b.tokens.end());  // next-token prediction
  b.tokens.pop_back();
  return b;
}

// Sequences [first, first + count) of `batch` (sequences of T tokens).
Batch Rows(const Batch& batch, int first, int count, int T) {
  const size_t begin = size_t(first) * T, end = size_t(first + count) * T;
  return Batch{{batch.tokens.begin() + begin, batch.tokens.begin() + end},
               {batch.targets.begin() + begin, batch.targets.begin() + end}};
}

// Loss and gradients of one forward + backward of `batch`.
std::pair<float, std::vector<float>> LossAndGrads(GptModel* model, const Batch& batch, int B, int T,
                                                  const GptForwardOptions& options = {}) {
  model->arena().ZeroGrad();
  auto loss = model->Forward(batch.tokens, batch.targets, B, T, options);
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  model->Backward();
  return {loss.ok() ? *loss : NAN, model->arena().GradsToHost()};
}

// Recompute changes which buffers hold a block's activations, not a single
// bit of the result; and the layout holds one block instead of L.
TEST(GptModel, RecomputeGivesIdenticalGradientsWithLessMemory) {
  GptConfig config = SmallConfig();
  const int B = 2, T = 70;  // two attention row blocks of the CPU twin
  const Batch batch = MakeBatch(B, T, config.vocab_size, 1);
  auto plain = MakeRig(config, 1);
  config.use_recompute = true;
  auto recompute = MakeRig(config, 1);
  const auto [loss_a, grads_a] = LossAndGrads(plain->model.get(), batch, B, T);
  const auto [loss_b, grads_b] = LossAndGrads(recompute->model.get(), batch, B, T);
  EXPECT_EQ(loss_a, loss_b);
  ASSERT_EQ(grads_a.size(), grads_b.size());
  EXPECT_EQ(std::memcmp(grads_a.data(), grads_b.data(), grads_a.size() * sizeof(float)), 0)
      << "gradients with recompute differ from those without";

  const size_t without = plain->model->activation_bytes(),
               with = recompute->model->activation_bytes();
  EXPECT_LT(with, without);
  // Only the per-block buffers shrink, from L copies to 1.
  const GptActivationLayout& lo = plain->model->layout();
  size_t block = 0;
  for (GptAct a : {GptAct::kLn1, GptAct::kLn1Mean, GptAct::kLn1Rstd, GptAct::kQkv, GptAct::kAtt,
                   GptAct::kAtty, GptAct::kResidual2, GptAct::kLn2, GptAct::kLn2Mean,
                   GptAct::kLn2Rstd, GptAct::kFch, GptAct::kFchGelu}) {
    block += lo.floats(a);
  }
  EXPECT_EQ(without - with, (config.num_layers - 1) * block * sizeof(float));

  // The dry-run plan predicts exactly what the model allocated.
  GptPlanOptions opts{.micro_batch_size = B, .seq_len = T};
  auto plan_on = PlanGpt(config, opts, recompute->kernels.get());
  ASSERT_TRUE(plan_on.ok()) << plan_on.status().ToString();
  EXPECT_EQ(plan_on->activation_bytes, static_cast<int64_t>(with));
  EXPECT_EQ(plan_on->activation_bytes_no_recompute, static_cast<int64_t>(without));
}

// k micro-batches with grad_scale 1/k add up to the gradient of the mean
// loss over the whole batch (equal target counts per micro-batch).
TEST(GptModel, GradientAccumulationMatchesOneBatch) {
  const GptConfig config = SmallConfig();
  const int T = 16;
  const Batch whole = MakeBatch(4, T, config.vocab_size, 2);
  auto rig = MakeRig(config, 1);
  GptModel& model = *rig->model;
  const auto [loss, grads] = LossAndGrads(&model, whole, 4, T);

  model.arena().ZeroGrad();
  double loss_sum = 0.0;
  for (int part = 0; part < 2; ++part) {
    const Batch micro = Rows(whole, part * 2, 2, T);
    auto l = model.Forward(micro.tokens, micro.targets, 2, T, {.grad_scale = 0.5f});
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    loss_sum += *l;
    model.Backward();
  }
  EXPECT_NEAR(loss_sum / 2, loss, 1e-5);
  EXPECT_TRUE(AllClose("accumulated grads", model.arena().GradsToHost(), grads, 1e-6, 1e-4));
}

TEST(GptModel, CpuTwinMatchesReferenceTwin) {
  const GptConfig config = SmallConfig();
  const int B = 2, T = 67;
  const Batch batch = MakeBatch(B, T, config.vocab_size, 3);
  auto cpu = MakeRig(config, 3);
  auto ref = MakeRig(config, -1);
  const auto [la, ga] = LossAndGrads(cpu->model.get(), batch, B, T);
  const auto [lb, gb] = LossAndGrads(ref->model.get(), batch, B, T);
  EXPECT_NEAR(la, lb, 1e-5);
  EXPECT_TRUE(AllClose("grads", ga, gb, 1e-6, 1e-3));
}

// Backward reports every tensor once, in whole ranges from the end of the
// table to its start, so DataParallel can reduce buckets while it runs.
TEST(GptModel, ReportsGradientRangesLastFirst) {
  const GptConfig config = SmallConfig();
  auto rig = MakeRig(config, 0);
  const Batch batch = MakeBatch(1, 8, config.vocab_size, 4);
  ASSERT_TRUE(rig->model->Forward(batch.tokens, batch.targets, 1, 8).ok());
  std::vector<std::pair<size_t, size_t>> ranges;
  rig->model->Backward([&](size_t first, size_t end) { ranges.emplace_back(first, end); });
  size_t expect_end = rig->model->arena().num_tensors();
  for (auto [first, end] : ranges) {
    EXPECT_EQ(end, expect_end);
    EXPECT_LT(first, end);
    expect_end = first;
  }
  EXPECT_EQ(expect_end, 0u);
  EXPECT_EQ(ranges.size(), size_t(config.num_layers) + 2);
}

// Hooks that keep each unit's parameters aside while it is released and
// poison the arena's copy with NaN, so any read outside Acquire .. Release
// shows in the loss or the gradients; they log the calls.
class PoisoningHooks final : public ParamUseHooks {
 public:
  explicit PoisoningHooks(ParamArena* arena) : arena_(arena), saved_(arena->ParamsToHost()) {}
  void Acquire(TensorRange unit, TensorRange next) override {
    log_.push_back("+" + Name(unit) + (next.empty() ? "" : ">" + Name(next)));
    float* params = arena_->params().data();
    for (size_t i = arena_->offset(unit.first); i < arena_->offset(unit.end); ++i) {
      params[i] = saved_[i];
    }
  }
  void Release(TensorRange unit) override {
    log_.push_back("-" + Name(unit));
    float* params = arena_->params().data();
    for (size_t i = arena_->offset(unit.first); i < arena_->offset(unit.end); ++i) {
      params[i] = NAN;
    }
  }
  void ReleaseAll(const std::vector<TensorRange>& units) {
    for (const TensorRange& u : units) Release(u);
    log_.clear();
  }
  const std::vector<std::string>& log() const { return log_; }

 private:
  std::string Name(TensorRange unit) const { return std::to_string(unit.first); }
  ParamArena* const arena_;
  const std::vector<float> saved_;
  std::vector<std::string> log_;
};

// The model reads a unit's parameters only between its Acquire and Release
// (ZeRO stage 3's contract), in the order the header gives, and the result
// is bit for bit that of a model whose parameters never leave (with and
// without recompute, and for an evaluation forward).
TEST(GptModel, ParamHooksCoverEveryReadOfTheParameters) {
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    GptConfig config = SmallConfig();
    config.num_layers = 2;
    config.use_recompute = recompute;
    const int B = 2, T = 9;
    const Batch batch = MakeBatch(B, T, config.vocab_size, 5);
    auto plain = MakeRig(config, 1);
    auto hooked = MakeRig(config, 1);
    const std::vector<TensorRange> units = hooked->model->ParamUnits();
    ASSERT_EQ(units.size(), 4u);  // embeddings, 2 blocks, ln_f
    PoisoningHooks hooks(&hooked->model->arena());
    hooks.ReleaseAll(units);
    hooked->model->set_param_hooks(&hooks);

    const auto [loss_a, grads_a] = LossAndGrads(plain->model.get(), batch, B, T);
    const auto [loss_b, grads_b] = LossAndGrads(hooked->model.get(), batch, B, T);
    EXPECT_EQ(loss_a, loss_b);
    EXPECT_EQ(std::memcmp(grads_a.data(), grads_b.data(), grads_a.size() * sizeof(float)), 0);
    // Units start at tensors 0 (embeddings), 2 and 14 (blocks), 26 (ln_f).
    EXPECT_EQ(hooks.log(),
              (std::vector<std::string>{"+0>2", "+2>14", "-2", "+14>26", "-14", "+26>14", "-26",
                                        "+14>2", "-14", "+2", "-2", "-0"}));
    hooks.ReleaseAll(units);
    auto eval = hooked->model->Forward(batch.tokens, batch.targets, B, T, {.for_backward = false});
    ASSERT_TRUE(eval.ok());
    EXPECT_EQ(*eval, loss_a);
    EXPECT_EQ(hooks.log(), (std::vector<std::string>{"+0>2", "+2>14", "-2", "+14>26", "-14", "+26",
                                                     "-26", "-0"}));
  }
}

// The next-token scores at the last position are those the loss sees.
TEST(GptModel, LastLogitsAreTheLastPositionsScores) {
  const GptConfig config = SmallConfig();
  auto rig = MakeRig(config, 1);
  const int B = 3, T = 11, V = config.vocab_size;
  Batch batch = MakeBatch(B, T, V, 5);
  auto logits = rig->model->LastLogits(batch.tokens, B, T);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ASSERT_EQ(logits->size(), size_t(B) * V);
  double expect = 0.0;
  for (int b = 0; b < B; ++b) {
    const float* z = logits->data() + size_t(b) * V;
    double maxv = z[0], sum = 0.0;
    for (int c = 0; c < V; ++c) maxv = std::max(maxv, double{z[c]});
    for (int c = 0; c < V; ++c) sum += std::exp(z[c] - maxv);
    expect += std::log(sum) + maxv - z[batch.targets[size_t(b) * T + T - 1]];
    for (int t = 0; t < T - 1; ++t) batch.targets[size_t(b) * T + t] = -1;
  }
  auto loss = rig->model->Forward(batch.tokens, batch.targets, B, T, {.for_backward = false});
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_NEAR(*loss, expect / B, 1e-5);
}

TEST(GptModel, InitialisesLikeGpt2) {
  GptConfig config = SmallConfig();
  config.hidden_size = 64;
  config.num_layers = 4;
  auto rig = MakeRig(config, 0);
  const ParamArena& arena = rig->model->arena();
  const auto params = arena.ParamsToHost();
  auto stats = [&](const std::string& name) {
    const size_t i = *arena.Find(name);
    double s = 0.0, s2 = 0.0;
    const int64_t n = arena.table()[i].shape.numel();
    for (int64_t j = 0; j < n; ++j) {
      const double x = params[arena.offset(i) + j];
      s += x;
      s2 += x * x;
    }
    return std::pair{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  EXPECT_NEAR(stats("wte").second, 0.02, 0.001);
  EXPECT_NEAR(stats("wte").first, 0.0, 0.001);
  EXPECT_NEAR(stats("h.1.attn.qkv.weight").second, 0.02, 0.001);
  EXPECT_NEAR(stats("h.2.mlp.proj.weight").second, 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(stats("h.0.ln_1.weight"), (std::pair{1.0, 0.0}));
  EXPECT_EQ(stats("h.3.mlp.fc.bias"), (std::pair{0.0, 0.0}));
  // Same seed, same bits; another seed, other values.
  auto again = MakeRig(config, 0);
  EXPECT_EQ(again->model->arena().ParamsToHost(), params);
  config.seed += 1;
  auto other = MakeRig(config, 0);
  EXPECT_NE(other->model->arena().ParamsToHost(), params);
}

TEST(GptModel, RejectsBadInputsAndKeepsItsState) {
  const GptConfig config = SmallConfig();
  auto rig = MakeRig(config, 0);
  GptModel& model = *rig->model;
  const Batch good = MakeBatch(2, 8, config.vocab_size, 6);
  // A good step to compare against after the bad calls.
  const auto [loss, grads] = LossAndGrads(&model, good, 2, 8);

  model.arena().ZeroGrad();
  ASSERT_TRUE(model.Forward(good.tokens, good.targets, 2, 8).ok());
  auto expect_error = [&](const Result<float>& r, const std::string& needle) {
    EXPECT_TRUE(IsInvalidArgumentNaming(r.status(), needle));
  };
  Batch bad = good;
  bad.tokens[5] = config.vocab_size;
  expect_error(model.Forward(bad.tokens, bad.targets, 2, 8), "token id 97 at position 5");
  bad = good;
  bad.targets[3] = -2;
  expect_error(model.Forward(bad.tokens, bad.targets, 2, 8), "target id -2 at position 3");
  expect_error(model.Forward(good.tokens, good.targets, 2, 0), "sequence length");
  expect_error(model.Forward(good.tokens, good.targets, 3, 8), "tokens for B x T");
  bad = MakeBatch(1, 81, config.vocab_size, 7);
  expect_error(model.Forward(bad.tokens, bad.targets, 1, 81), "Model.max_position_embeddings");
  bad = good;
  std::fill(bad.targets.begin(), bad.targets.end(), -1);
  expect_error(model.Forward(bad.tokens, bad.targets, 2, 8), "no position has a target");
  expect_error(model.Forward({}, {}, 0, 8), "batch size");
  EXPECT_FALSE(model.LastLogits(std::vector<int32_t>(8, -1), 1, 8).ok());
  // The Forward before the bad calls is still the one Backward sees.
  model.Backward();
  EXPECT_EQ(model.arena().GradsToHost(), grads);
}

// ---- dropout ----------------------------------------------------------------------------

GptConfig DropoutConfig() {
  GptConfig c = SmallConfig();
  c.hidden_dropout_prob = 0.1f;
  c.attention_probs_dropout_prob = 0.1f;
  return c;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A step's masks are a function of (seed, step, sample): the same pass twice
// and a recomputed pass give the same bits; another step or another sample
// gives another loss; evaluation never drops.
TEST(GptModel, DropoutIsReproducibleAndRecomputedExactly) {
  GptConfig config = DropoutConfig();
  const int B = 2, T = 70;
  const Batch batch = MakeBatch(B, T, config.vocab_size, 11);
  const std::vector<uint32_t> streams = {5, 6};
  GptForwardOptions step3{.dropout_seed = GptDropoutStepSeed(1, 3), .dropout_streams = streams};
  auto plain = MakeRig(config, 1);
  const auto [loss_a, grads_a] = LossAndGrads(plain->model.get(), batch, B, T, step3);
  const auto [loss_again, grads_again] = LossAndGrads(plain->model.get(), batch, B, T, step3);
  EXPECT_EQ(loss_a, loss_again);
  EXPECT_TRUE(SameBits(grads_a, grads_again));
  config.use_recompute = true;
  auto recompute = MakeRig(config, 1);
  const auto [loss_b, grads_b] = LossAndGrads(recompute->model.get(), batch, B, T, step3);
  EXPECT_EQ(loss_a, loss_b);
  EXPECT_TRUE(SameBits(grads_a, grads_b)) << "recompute drew other masks";

  GptForwardOptions step4 = step3;
  step4.dropout_seed = GptDropoutStepSeed(1, 4);
  EXPECT_NE(LossAndGrads(plain->model.get(), batch, B, T, step4).first, loss_a);
  const std::vector<uint32_t> other = {5, 7};
  GptForwardOptions other_sample = step3;
  other_sample.dropout_streams = other;
  EXPECT_NE(LossAndGrads(plain->model.get(), batch, B, T, other_sample).first, loss_a);

  // Evaluation: the model without dropout's loss exactly.
  auto no_dropout = MakeRig(SmallConfig(), 1);
  auto eval_a = plain->model->Forward(batch.tokens, batch.targets, B, T, {.for_backward = false});
  auto eval_b =
      no_dropout->model->Forward(batch.tokens, batch.targets, B, T, {.for_backward = false});
  ASSERT_TRUE(eval_a.ok() && eval_b.ok());
  EXPECT_EQ(*eval_a, *eval_b);
  // A training pass without streams is refused.
  EXPECT_TRUE(
      IsInvalidArgumentNaming(plain->model->Forward(batch.tokens, batch.targets, B, T).status(),
                              "Model.hidden_dropout_prob"));
}

// A sample's mask does not depend on which micro-batch carries it: two
// micro-batches give the whole batch's gradient (what makes data, tensor
// and pipeline parallel runs with dropout equal one process's).
TEST(GptModel, DropoutMasksFollowTheSampleAcrossMicroBatches) {
  const GptConfig config = DropoutConfig();
  const int T = 16;
  const Batch whole = MakeBatch(4, T, config.vocab_size, 12);
  const std::vector<uint32_t> streams = {40, 41, 42, 43};
  const uint64_t seed = GptDropoutStepSeed(9, 0);
  auto rig = MakeRig(config, 1);
  GptModel& model = *rig->model;
  const auto [loss, grads] =
      LossAndGrads(&model, whole, 4, T, {.dropout_seed = seed, .dropout_streams = streams});
  model.arena().ZeroGrad();
  double loss_sum = 0.0;
  for (int part = 0; part < 2; ++part) {
    const Batch micro = Rows(whole, part * 2, 2, T);
    auto l = model.Forward(micro.tokens, micro.targets, 2, T,
                           {.grad_scale = 0.5f,
                            .dropout_seed = seed,
                            .dropout_streams = std::span(streams).subspan(part * 2, 2)});
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    loss_sum += *l;
    model.Backward();
  }
  EXPECT_NEAR(loss_sum / 2, loss, 1e-5);
  EXPECT_TRUE(AllClose("accumulated grads", model.arena().GradsToHost(), grads, 1e-6, 1e-4));
}

// The CPU twin and the oracle draw the same masks.
TEST(GptModel, DropoutCpuTwinMatchesReferenceTwin) {
  const GptConfig config = DropoutConfig();
  const int B = 2, T = 67;
  const Batch batch = MakeBatch(B, T, config.vocab_size, 13);
  const std::vector<uint32_t> streams = {1, 2};
  const GptForwardOptions options{.dropout_seed = 77, .dropout_streams = streams};
  auto cpu = MakeRig(config, 3);
  auto ref = MakeRig(config, -1);
  const auto [la, ga] = LossAndGrads(cpu->model.get(), batch, B, T, options);
  const auto [lb, gb] = LossAndGrads(ref->model.get(), batch, B, T, options);
  EXPECT_NEAR(la, lb, 1e-5);
  EXPECT_TRUE(AllClose("grads", ga, gb, 1e-6, 1e-3));
}

// ---- pipeline stages ------------------------------------------------------------------------

// The three one-block stages of SmallConfig, chained by hand as
// collective/gpt_pipeline.h chains them over links: two micro-batches in
// flight (both forwards, then both backwards, each stage keeping two
// activation slots), with dropout. Every stage starts from the whole
// model's values (the head's wte copy from wte); the mean loss is the
// whole model's and each stage's gradients are the whole model's at the
// same places, wte's being the sum of the first stage's and the head's copy.
TEST(GptModel, ChainedStagesMatchTheWholeModel) {
  const GptConfig config = DropoutConfig();
  const int B = 4, T = 16, micro = 2, P = 3;
  const Batch batch = MakeBatch(B, T, config.vocab_size, 21);
  const std::vector<uint32_t> streams = {3, 4, 5, 6};
  const GptForwardOptions whole_options{.dropout_seed = 99, .dropout_streams = streams};
  auto whole = MakeRig(config, 1);
  const auto [whole_loss, whole_grads] =
      LossAndGrads(whole->model.get(), batch, B, T, whole_options);
  const std::vector<float> whole_params = whole->model->arena().ParamsToHost();

  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  std::vector<std::unique_ptr<GptModel>> stages;
  for (int s = 0; s < P; ++s) {
    auto stage = GptPipelineStage(config, P, s);
    ASSERT_TRUE(stage.ok()) << stage.status().ToString();
    auto model = GptModel::Create(config, &backend, &kernels, nullptr, &*stage);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    (*model)->set_activation_slots(2);
    (*model)->PrepareActivations(micro, T);
    const std::vector<float> params = (*model)->arena().ParamsToHost();
    size_t local = 0;
    ForEachStageTensor(config, *stage,
                       [&](GptTensor, int, int64_t rows, int64_t cols, size_t, size_t at) {
                         const size_t n = size_t(rows) * (cols ? cols : 1);
                         EXPECT_TRUE(std::equal(params.begin() + local, params.begin() + local + n,
                                                whole_params.begin() + at))
                             << "stage " << s << " tensor at " << at;
                         local += n;
                       });
    EXPECT_EQ(local, params.size());
    stages.push_back(std::move(*model));
  }
  const size_t ids = size_t(micro) * T, floats = ids * config.hidden_size;
  double loss = 0.0;
  for (int mb = 0; mb < 2; ++mb) {
    for (int s = 0; s < P; ++s) {
      if (s > 0) {
        std::copy_n(stages[s - 1]->StageOutput(mb), floats, stages[s]->StageInput(mb));
      }
      const GptForwardOptions options{
          .grad_scale = 0.5f,
          .slot = mb,
          .dropout_seed = 99,
          .dropout_streams = std::span(streams).subspan(mb * micro, micro)};
      auto l =
          stages[s]->Forward(std::span(batch.tokens).subspan(mb * ids, ids),
                             std::span(batch.targets).subspan(mb * ids, ids), micro, T, options);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      if (s == P - 1) loss += *l / 2;
    }
  }
  for (int mb = 0; mb < 2; ++mb) {
    for (int s = P - 1; s >= 0; --s) {
      if (s < P - 1) std::copy_n(stages[s + 1]->InputGrad(), floats, stages[s]->OutputGrad());
      stages[s]->Backward({}, mb);
    }
  }
  EXPECT_NEAR(loss, whole_loss, 1e-5);
  std::vector<float> got(whole_grads.size(), 0.0f);
  for (int s = 0; s < P; ++s) {
    const std::vector<float> grads = stages[s]->arena().GradsToHost();
    size_t local = 0;
    ForEachStageTensor(config, stages[s]->stage(),
                       [&](GptTensor, int, int64_t rows, int64_t cols, size_t, size_t at) {
                         const size_t n = size_t(rows) * (cols ? cols : 1);
                         for (size_t i = 0; i < n; ++i) got[at + i] += grads[local + i];
                         local += n;
                       });
  }
  EXPECT_TRUE(AllClose("stage grads", got, whole_grads, 1e-6, 1e-4));
  EXPECT_GE(stages[0]->wte_index(), 0);
  EXPECT_EQ(stages[1]->wte_index(), -1);
  EXPECT_GE(stages[2]->wte_index(), 0);
  // A stage cannot give next-token logits, and LoRA is not split in stages.
  EXPECT_FALSE(stages[0]->LastLogits(std::span(batch.tokens).subspan(0, T), 1, T).ok());
  EXPECT_TRUE(
      IsInvalidArgumentNaming(GptPipelineStage(config, 2, 0).status(), "Distributed.pp_degree"));
}

// The dry-run plan of each stage is what the stage's model allocates: its
// parameters, and the activations of its micro-batches in flight (1F1B:
// min(P - s, m) of them, each stage keeping that many slots).
TEST(GptModel, PlanOfEachStageIsWhatItsModelAllocates) {
  const GptConfig config = SmallConfig();
  const int P = 3, m = 2, B = 2, T = 24;
  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  auto plan =
      PlanGpt(config, {.micro_batch_size = B, .seq_len = T, .accumulate_steps = m, .pp_degree = P},
              &kernels);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->stages.size(), size_t{P});
  EXPECT_DOUBLE_EQ(plan->bubble_fraction, 2.0 / 4.0);
  for (int s = 0; s < P; ++s) {
    const GptPlan::Stage& planned = plan->stages[s];
    EXPECT_EQ(planned.in_flight, std::min(P - s, m));
    auto stage = GptPipelineStage(config, P, s);
    ASSERT_TRUE(stage.ok());
    auto model = GptModel::Create(config, &backend, &kernels, nullptr, &*stage);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    (*model)->set_activation_slots(planned.in_flight);
    (*model)->PrepareActivations(B, T);
    EXPECT_EQ(planned.rank_params, static_cast<int64_t>((*model)->arena().size())) << "stage " << s;
    EXPECT_EQ(planned.activation_bytes, static_cast<int64_t>((*model)->activation_bytes()))
        << "stage " << s;
  }
  // The plan is the stage holding the most: the first (two in flight).
  EXPECT_EQ(plan->planned_stage, 0);
  EXPECT_NE(plan->ToString().find("pipeline bubble: 50.0%"), std::string::npos) << plan->ToString();
}

TEST(GptModel, RejectsBadConfigsNamingTheKey) {
  CpuBackend backend;
  RefGptKernels kernels;
  auto expect_key = [&](GptConfig c, const std::string& key) {
    EXPECT_TRUE(IsInvalidArgumentNaming(GptModel::Create(c, &backend, &kernels).status(), key));
  };
  GptConfig c = SmallConfig();
  c.num_attention_heads = 5;
  expect_key(c, "Model.num_attention_heads");
  c = SmallConfig();
  c.hidden_size = 0;
  expect_key(c, "Model.hidden_size");
  c = SmallConfig();
  c.vocab_size = -3;
  expect_key(c, "Model.vocab_size");
  c = SmallConfig();
  c.ffn_hidden_size = -1;
  expect_key(c, "Model.ffn_hidden_size");
  c = SmallConfig();
  c.initializer_range = 0.0f;
  expect_key(c, "Model.initializer_range");
  c = SmallConfig();
  c.hidden_dropout_prob = 1.0f;
  expect_key(c, "Model.hidden_dropout_prob");
  c = SmallConfig();
  c.attention_probs_dropout_prob = -0.1f;
  expect_key(c, "Model.attention_probs_dropout_prob");
}

}  // namespace
}  // namespace fleet::trainer
