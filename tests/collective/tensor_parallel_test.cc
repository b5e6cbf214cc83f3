// GptModel split over a tensor-parallel group (GptTensorParallel) against
// the whole model in one process: the shards start as the whole model's
// rows and columns, one forward and backward gives the same loss and the
// same gradients (gathered into the whole layout), with and without
// recompute and dropout (each rank draws the whole model's masks for its
// heads), and degrees that do not split the model are refused. Ranks are
// threads over one in-process KV store (shared memory and Gloo groups).
//
// Tolerance: the split changes only the order of float32 sums (the
// row-parallel GEMMs' partial products, the cross-entropy's sums over the
// vocabulary shards): loss within 1e-6 relative, gradients within 1e-6 +
// 1e-4 |want| (measured: < 1e-7 relative on the loss).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "tests/comm/collective_test_util.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_tensor_parallel.h"
#include "trainer/param_split.h"

namespace fleet::trainer {
namespace {

using std::chrono::milliseconds;

// 4 heads (2 per rank), an uneven vocabulary split (129 + 128 rows).
GptConfig SmallConfig(bool recompute, float dropout = 0.0f) {
  GptConfig c;
  c.hidden_dropout_prob = dropout;
  c.attention_probs_dropout_prob = dropout;
  c.vocab_size = 257;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 128;
  c.max_position_embeddings = 16;
  c.use_recompute = recompute;
  return c;
}

constexpr int kB = 2, kT = 16;

// Tokens from both vocabulary shards, and a few positions without a target.
void MakeBatch(std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  tokens->resize(kB * kT);
  targets->resize(kB * kT);
  for (int i = 0; i < kB * kT; ++i) {
    (*tokens)[i] = (i * 37 + 11) % 257;
    (*targets)[i] = i % 7 == 3 ? -1 : (i * 53 + 5) % 257;
  }
}

struct StepResult {
  float loss = 0;
  float eval_loss = 0;
  std::vector<float> params, grads;  // the whole model's layout
};

// One forward (evaluation), then one forward and backward, of `config` on
// the batch; `group` null: the whole model.
StepResult TrainStepOf(const GptConfig& config, Collective* group) {
  auto compute = CreateGptCompute("cpu", Precision::kFp32, 1);
  testing::ThrowIfError(compute.status(), "compute");
  std::unique_ptr<GptTensorParallel> tp;
  if (group != nullptr) {
    auto created = GptTensorParallel::Create(config, group);
    testing::ThrowIfError(created.status(), "tensor parallel");
    tp = std::move(created).value();
  }
  auto model = GptModel::Create(config, compute->backend.get(), compute->kernels.get(), tp.get());
  testing::ThrowIfError(model.status(), "model");
  GptModel& m = **model;
  std::vector<int32_t> tokens, targets;
  MakeBatch(&tokens, &targets);
  StepResult out;
  auto eval = m.Forward(tokens, targets, kB, kT, {.for_backward = false});
  testing::ThrowIfError(eval.status(), "eval forward");
  out.eval_loss = *eval;
  m.arena().ZeroGrad();
  const std::vector<uint32_t> streams = {17, 18};
  auto loss = m.Forward(tokens, targets, kB, kT,
                        {.dropout_seed = GptDropoutStepSeed(3, 1), .dropout_streams = streams});
  testing::ThrowIfError(loss.status(), "forward");
  out.loss = *loss;
  m.Backward();
  testing::ThrowIfError(m.comm_status(), "backward");
  if (tp == nullptr) {
    out.params = m.arena().ParamsToHost();
    out.grads = m.arena().GradsToHost();
    return out;
  }
  Backend* backend = compute->backend.get();
  testing::ThrowIfError(
      GatherWholeParams(tp->split(), m.arena().params().data(), backend, &out.params), "params");
  testing::ThrowIfError(
      GatherWholeParams(tp->split(), m.arena().grads().data(), backend, &out.grads), "grads");
  return out;
}

void ExpectGradsClose(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > 1e-6 + 1e-4 * std::abs(want[i])) {
      if (bad++ < 5)
        ADD_FAILURE() << what << ": gradient " << i << " " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

class TensorParallelModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelModelTest, TwoRanksGiveTheWholeModelsLossAndGradients) {
  for (auto [recompute, dropout] :
       {std::pair{false, 0.0f}, {true, 0.0f}, {false, 0.1f}, {true, 0.1f}}) {
    const GptConfig config = SmallConfig(recompute, dropout);
    const std::string what =
        GetParam() + (recompute ? ", recompute" : "") + (dropout > 0 ? ", dropout" : "");
    const StepResult whole = TrainStepOf(config, nullptr);
    std::vector<StepResult> ranks(2);
    testing::RunRanksOver(GetParam(), 2, milliseconds(30000), [&](int rank, Collective& group) {
      ranks[rank] = TrainStepOf(config, &group);
    });
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(what + ", rank " + std::to_string(r));
      // The shards are the whole model's values, exactly.
      EXPECT_EQ(ranks[r].params, whole.params);
      EXPECT_NEAR(ranks[r].loss, whole.loss, 1e-6 * whole.loss);
      EXPECT_NEAR(ranks[r].eval_loss, whole.eval_loss, 1e-6 * whole.loss);
      ExpectGradsClose(ranks[r].grads, whole.grads, what);
    }
    // Replicated parameters get the same gradient bits on both ranks.
    EXPECT_EQ(ranks[0].grads, ranks[1].grads) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, TensorParallelModelTest, ::testing::Values("shm", "gloo"));

TEST(TensorParallelSplitTest, DegreesThatDoNotSplitTheModelAreRefused) {
  GptConfig config = SmallConfig(false);
  testing::RunRanksOver("shm", 3, milliseconds(30000), [&](int, Collective& group) {
    auto tp = GptTensorParallel::Create(config, &group);  // 4 heads over 3 ranks
    if (tp.ok() || !tp.status().IsInvalidArgument() ||
        tp.status().ToString().find("Distributed.mp_degree") == std::string::npos) {
      throw std::runtime_error("3 ranks for 4 heads: " + tp.status().ToString());
    }
  });
}

TEST(TensorParallelSplitTest, NextTokenLogitsNeedTheWholeVocabulary) {
  const GptConfig config = SmallConfig(false);
  testing::RunRanksOver("shm", 2, milliseconds(30000), [&](int, Collective& group) {
    auto compute = CreateGptCompute("cpu", Precision::kFp32, 1);
    testing::ThrowIfError(compute.status(), "compute");
    auto tp = GptTensorParallel::Create(config, &group);
    testing::ThrowIfError(tp.status(), "tensor parallel");
    auto model =
        GptModel::Create(config, compute->backend.get(), compute->kernels.get(), tp->get());
    testing::ThrowIfError(model.status(), "model");
    std::vector<int32_t> tokens(kT, 1);
    auto logits = (*model)->LastLogits(tokens, 1, kT);
    if (logits.ok() || logits.status().code() != StatusCode::kFailedPrecondition) {
      throw std::runtime_error("LastLogits of a split model: " + logits.status().ToString());
    }
  });
}

// The split's bookkeeping: every rank's segments cover its arena, and the
// owned segments of all ranks cover the whole table once; with pipeline
// stages too (the last stage's wte copy is not its own).
TEST(GptParamSplitTest, SegmentsCoverTheWholeTableOnce) {
  const GptConfig config = SmallConfig(false);
  for (auto [mp, pp] : {std::pair{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}}) {
    const ParamSplit split = GptModelSplit(config, mp, pp, 0);
    const int degree = mp * pp;
    ASSERT_EQ(split.whole_size, size_t(GptParamCount(config)));
    std::vector<int> covered(split.whole_size, 0);
    for (int r = 0; r < degree; ++r) {
      size_t local = 0;
      for (const ArenaSegment& s : split.segments[r]) {
        EXPECT_EQ(s.local, local) << "degree " << degree << ", rank " << r;
        local += s.size;
        if (s.replicated) continue;
        for (size_t i = 0; i < s.size; ++i) ++covered[s.whole + i];
      }
      EXPECT_EQ(local, split.local_size[r]);
    }
    for (size_t i = 0; i < covered.size(); ++i) {
      ASSERT_EQ(covered[i], 1) << "degree " << degree << ", whole float " << i;
    }
  }
}

}  // namespace
}  // namespace fleet::trainer
