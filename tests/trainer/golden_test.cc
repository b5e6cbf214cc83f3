// The MLP and the CTR-DNN dense part against golden files written by
// golden/make_golden.py (NumPy, float64): outputs, loss, every parameter
// gradient (and the pooled-embedding and row gradients of the CTR model),
// then three Adam steps. Each tensor is compared with abs + rel tolerance
// and a failure names the tensor and its worst index.
//
// Every check runs on three CPU backends: OpenBLAS GEMM, the naive GEMM
// oracle, and OpenBLAS with a thread pool for the element-wise kernels.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "trainer/backend.h"
#include "trainer/models/ctr_model.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"
#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::Golden;
using testing::GoldenData;
using testing::LoadGoldenParams;

constexpr double kAbs = 1e-5, kRel = 1e-4;

// Every tensor of `host` (laid out like `arena`) vs golden "<prefix><name>".
void ExpectArena(const Golden& g, const ParamArena& arena, const std::vector<float>& host,
                 const std::string& prefix) {
  testing::ExpectArenaGolden(g, arena, host, prefix, kAbs, kRel);
}

std::unique_ptr<Adam> MakeAdam(const Golden& g, ParamArena* arena) {
  const auto& h = GoldenData(g, "adam.hparams");
  return std::make_unique<Adam>(arena, kernels::AdamHyper{h[0], h[1], h[2], h[3], h[4]});
}

enum class BackendKind { kBlas, kNaive, kBlasPool };

class GoldenTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kBlasPool) pool_ = std::make_unique<ThreadPool>(1);
    backend_ = std::make_unique<CpuBackend>(pool_.get(), GetParam() == BackendKind::kNaive
                                                             ? CpuBackend::GemmKind::kNaive
                                                             : CpuBackend::GemmKind::kBlas);
  }
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuBackend> backend_;
};

TEST_P(GoldenTest, Mlp) {
  const Golden g = testing::ReadGolden(testing::GoldenDir() + "/mlp.golden");
  ASSERT_FALSE(g.empty());
  MlpConfig config;
  config.sizes.clear();
  for (float s : GoldenData(g, "config.sizes")) config.sizes.push_back(static_cast<int>(s));
  auto model = Mlp::Create(config, backend_.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Mlp& mlp = **model;
  LoadGoldenParams(g, &mlp.arena());

  const auto& x = GoldenData(g, "x");
  std::vector<int32_t> labels;
  for (float l : GoldenData(g, "labels")) labels.push_back(static_cast<int32_t>(l));

  mlp.arena().ZeroGrad();
  auto loss = mlp.Forward(x, labels);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_TRUE(AllClose("loss", std::vector<float>{*loss}, GoldenData(g, "loss"), kAbs, kRel));
  EXPECT_TRUE(AllClose("probs", mlp.Probabilities(), GoldenData(g, "probs"), kAbs, kRel));
  mlp.Backward();
  ExpectArena(g, mlp.arena(), mlp.arena().GradsToHost(), "grad.");

  LoadGoldenParams(g, &mlp.arena());
  auto adam = MakeAdam(g, &mlp.arena());
  for (int t = 1; t <= 3; ++t) {
    const std::string step = "adam.step" + std::to_string(t) + ".";
    mlp.arena().ZeroGrad();
    auto l = mlp.Forward(x, labels);
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(
        AllClose(step + "loss", std::vector<float>{*l}, GoldenData(g, step + "loss"), kAbs, kRel));
    mlp.Backward();
    adam->Step();
    ExpectArena(g, mlp.arena(), mlp.arena().ParamsToHost(), step);
  }
}

TEST_P(GoldenTest, CtrModel) {
  const Golden g = testing::ReadGolden(testing::GoldenDir() + "/ctr_dnn.golden");
  ASSERT_FALSE(g.empty());
  const auto& c = GoldenData(g, "config");
  ASSERT_GE(c.size(), 4u);
  CtrModelConfig config;
  config.num_slots = static_cast<int>(c[0]);
  config.embedding_dim = static_cast<int>(c[1]);
  config.num_dense = static_cast<int>(c[2]);
  config.hidden.assign(c.begin() + 3, c.end());
  auto model = CtrModel::Create(config, backend_.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  CtrModel& dnn = **model;
  LoadGoldenParams(g, &dnn.arena());

  const int S = config.num_slots, D = config.embedding_dim;
  const auto& labels = GoldenData(g, "labels");
  const int B = static_cast<int>(labels.size());

  // Pool each slot's rows the way a PS worker does.
  std::vector<std::vector<float>> rows(S);
  std::vector<std::vector<int64_t>> offsets(S);
  std::vector<EmbeddingBag> bags;
  std::vector<float> pooled(size_t(S) * B * D);
  for (int s = 0; s < S; ++s) {
    const std::string slot = "slot" + std::to_string(s);
    rows[s] = GoldenData(g, slot + ".rows");
    for (float o : GoldenData(g, slot + ".offsets")) offsets[s].push_back(static_cast<int64_t>(o));
    bags.emplace_back(GoldenData(g, slot + ".mean")[0] != 0.0f ? kernels::PoolMode::kMean
                                                         : kernels::PoolMode::kSum);
    Tensor out(pooled.data() + size_t(s) * B * D, Shape{B, D});
    const int64_t n = static_cast<int64_t>(rows[s].size()) / D;
    ASSERT_TRUE(bags[s].Forward(Tensor(rows[s].data(), Shape{n, D}), offsets[s], &out).ok());
  }
  EXPECT_TRUE(AllClose("pooled", pooled, GoldenData(g, "pooled"), kAbs, kRel));

  const auto& dense = GoldenData(g, "dense");
  dnn.arena().ZeroGrad();
  auto loss = dnn.Forward(pooled, dense, labels);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_TRUE(AllClose("loss", std::vector<float>{*loss}, GoldenData(g, "loss"), kAbs, kRel));
  const Tensor& probs = dnn.probabilities();
  EXPECT_TRUE(AllClose("probs", {probs.data(), size_t(probs.numel())}, GoldenData(g, "probs"),
                       kAbs, kRel));
  dnn.Backward();
  ExpectArena(g, dnn.arena(), dnn.arena().GradsToHost(), "grad.");
  const Tensor& dpooled = dnn.pooled_grad();
  EXPECT_TRUE(AllClose("grad.pooled", {dpooled.data(), size_t(dpooled.numel())},
                       GoldenData(g, "grad.pooled"), kAbs, kRel));
  for (int s = 0; s < S; ++s) {
    std::vector<float> drows(rows[s].size());
    Tensor dt(drows.data(), Shape{static_cast<int64_t>(drows.size()) / D, D});
    bags[s].Backward(dnn.pooled_grad(s), &dt);
    const std::string name = "grad.slot" + std::to_string(s) + ".rows";
    EXPECT_TRUE(AllClose(name, drows, GoldenData(g, name), kAbs, kRel));
  }

  LoadGoldenParams(g, &dnn.arena());
  auto adam = MakeAdam(g, &dnn.arena());
  for (int t = 1; t <= 3; ++t) {
    const std::string step = "adam.step" + std::to_string(t) + ".";
    dnn.arena().ZeroGrad();
    auto l = dnn.Forward(pooled, dense, labels);
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(
        AllClose(step + "loss", std::vector<float>{*l}, GoldenData(g, step + "loss"), kAbs, kRel));
    dnn.Backward();
    adam->Step();
    ExpectArena(g, dnn.arena(), dnn.arena().ParamsToHost(), step);
  }
}

INSTANTIATE_TEST_SUITE_P(CpuBackends, GoldenTest,
                         ::testing::Values(BackendKind::kBlas, BackendKind::kNaive,
                                           BackendKind::kBlasPool),
                         [](const auto& info) {
                           switch (info.param) {
                             case BackendKind::kBlas: return std::string("Blas");
                             case BackendKind::kNaive: return std::string("Naive");
                             default: return std::string("BlasPool");
                           }
                         });

}  // namespace
}  // namespace fleet::trainer
