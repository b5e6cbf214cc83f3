// Parameter arena, optimizers, checkpoints and model input checks.
// The key property: a run resumed from a checkpoint continues with exactly
// the same losses and parameters as the run that was never interrupted.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/models/ctr_model.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"
#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::trainer {
namespace {

using testing::RandomVector;

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("fleet_trainer_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

TEST(ParamArenaTest, LayoutFollowsTheTable) {
  CpuBackend backend;
  auto arena = ParamArena::Create({{"a", Shape{2, 3}}, {"b", Shape{4}}, {"c", Shape{1, 1, 2}}},
                                  &backend);
  ASSERT_TRUE(arena.ok());
  EXPECT_EQ(arena->size(), 12u);
  EXPECT_EQ(arena->offset(1), 6u);
  EXPECT_EQ(arena->offset(2), 10u);
  EXPECT_EQ(arena->param("b").data(), arena->params().data() + 6);
  EXPECT_EQ(arena->grad("c").data(), arena->grads().data() + 10);
  EXPECT_TRUE(arena->param("c").shape() == (Shape{1, 1, 2}));
  EXPECT_TRUE(arena->Find("zzz").status().IsNotFound());

  EXPECT_TRUE(ParamArena::Create({{"a", Shape{2}}, {"a", Shape{3}}}, &backend)
                  .status().IsInvalidArgument());
  EXPECT_TRUE(ParamArena::Create({{"", Shape{2}}}, &backend).status().IsInvalidArgument());
  EXPECT_TRUE(ParamArena::Create({{"x", Shape{0, 2}}}, &backend).status().IsInvalidArgument());
}

TEST(OptimizerTest, ConfigIsChecked) {
  CpuBackend backend;
  auto arena = ParamArena::Create({{"w", Shape{3}}}, &backend);
  ASSERT_TRUE(arena.ok());
  OptimizerConfig c;
  EXPECT_TRUE(CreateOptimizer(c, &*arena).ok());
  c.type = "sgd";
  EXPECT_TRUE(CreateOptimizer(c, &*arena).ok());
  c.type = "adagrad";
  EXPECT_TRUE(CreateOptimizer(c, &*arena).status().IsInvalidArgument());
  c = {};
  c.lr = 0;
  EXPECT_TRUE(CreateOptimizer(c, &*arena).status().IsInvalidArgument());
  c = {};
  c.beta2 = 1.0f;
  EXPECT_TRUE(CreateOptimizer(c, &*arena).status().IsInvalidArgument());
}

TEST(OptimizerTest, SgdStep) {
  CpuBackend backend;
  auto arena = ParamArena::Create({{"w", Shape{3}}}, &backend);
  ASSERT_TRUE(arena.ok());
  ASSERT_TRUE(arena->ParamsFromHost(std::vector<float>{1, 2, 3}).ok());
  std::vector<float> g = {0.5f, -1, 0};
  std::copy(g.begin(), g.end(), arena->grads().data());
  Sgd sgd(&*arena, 0.1f);
  sgd.Step();
  EXPECT_EQ(sgd.step(), 1);
  const auto p = arena->ParamsToHost();
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  EXPECT_FLOAT_EQ(p[1], 2.1f);
  EXPECT_FLOAT_EQ(p[2], 3.0f);
}

// A small MLP training on fixed random batches.
struct Trainer {
  explicit Trainer(const std::string& optimizer_type) {
    MlpConfig config;
    config.sizes = {12, 9, 7, 4};
    config.seed = 42;
    model = std::move(Mlp::Create(config, &backend).value());
    OptimizerConfig oc;
    oc.type = optimizer_type;
    oc.lr = optimizer_type == "sgd" ? 0.1f : 0.01f;
    optimizer = std::move(CreateOptimizer(oc, &model->arena()).value());
  }
  // One step on batch number `i` (the same batch for the same i).
  float Step(int i) {
    const int B = 5;
    const auto x = RandomVector(B * 12, 100 + i);
    std::vector<int32_t> labels(B);
    for (int b = 0; b < B; ++b) labels[b] = (b + i) % 4;
    model->arena().ZeroGrad();
    const float loss = model->Forward(x, labels).value();
    model->Backward();
    optimizer->Step();
    return loss;
  }
  CpuBackend backend;
  std::unique_ptr<Mlp> model;
  std::unique_ptr<Optimizer> optimizer;
};

class CheckpointTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointTest, ResumedRunIsIdentical) {
  TempDir dir;
  const std::string path = dir.File("ckpt.bin");
  Trainer a(GetParam());
  for (int i = 0; i < 4; ++i) a.Step(i);
  ASSERT_TRUE(SaveCheckpoint(path, a.model->arena(), *a.optimizer).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::vector<float> losses_a;
  for (int i = 4; i < 8; ++i) losses_a.push_back(a.Step(i));

  Trainer b(GetParam());  // fresh model: same seed, but not trained
  Status st = LoadCheckpoint(path, &b.model->arena(), b.optimizer.get());
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(b.optimizer->step(), 4);
  std::vector<float> losses_b;
  for (int i = 4; i < 8; ++i) losses_b.push_back(b.Step(i));

  EXPECT_EQ(losses_a, losses_b);  // bit-identical
  EXPECT_EQ(a.model->arena().ParamsToHost(), b.model->arena().ParamsToHost());
  for (size_t s = 0; s < a.optimizer->state().size(); ++s) {
    const Tensor& sa = a.optimizer->state()[s];
    const Tensor& sb = b.optimizer->state()[s];
    EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.numel() * sizeof(float))) << "state " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CheckpointTest, ::testing::Values("adam", "sgd"));

// Both loaders (LoadCheckpoint, and LoadCheckpointParams, which reads the
// parameters only) against every way a file can be bad: the exact code, the
// reason and the file in the message, and the model untouched.
class CheckpointLoadErrorsTest : public ::testing::TestWithParam<bool> {
 protected:
  bool params_only() const { return GetParam(); }
  Status Load(const std::string& path, Trainer* t) const {
    return params_only() ? LoadCheckpointParams(path, &t->model->arena())
                         : LoadCheckpoint(path, &t->model->arena(), t->optimizer.get());
  }
};

TEST_P(CheckpointLoadErrorsTest, EveryBadFileIsRejectedAndLeavesTheModelAlone) {
  TempDir dir;
  const std::string path = dir.File("ckpt.bin");
  Trainer a("adam");
  a.Step(0);
  ASSERT_TRUE(SaveCheckpoint(path, a.model->arena(), *a.optimizer).ok());
  std::vector<char> good;
  {
    std::ifstream f(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  const auto write = [&](const std::vector<char>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };

  Trainer b("adam");
  const auto before = b.model->arena().ParamsToHost();
  const auto expect_rejected = [&](StatusCode code, const std::string& words) {
    Status st = Load(path, &b);
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
    EXPECT_EQ(b.model->arena().ParamsToHost(), before);
    EXPECT_EQ(b.optimizer->step(), 0);
  };

  // One flipped byte anywhere in the data: checksum.
  std::vector<char> bad = good;
  bad[bad.size() / 2] ^= 0x40;
  write(bad);
  expect_rejected(StatusCode::kCorruption, "checksum");
  // Truncated.
  write(std::vector<char>(good.begin(), good.end() - 9));
  expect_rejected(StatusCode::kCorruption, "checksum");
  // Not a checkpoint.
  write(std::vector<char>{'h', 'e', 'l', 'l', 'o'});
  expect_rejected(StatusCode::kCorruption, "magic");
  // Missing.
  std::filesystem::remove(path);
  expect_rejected(StatusCode::kNotFound, "does not exist");

  // Another model shape: the first tensor that differs is named, with both shapes.
  CpuBackend backend;
  MlpConfig other;
  other.sizes = {12, 9, 5, 4};
  auto m = Mlp::Create(other, &backend);
  ASSERT_TRUE(m.ok());
  Adam adam(&(*m)->arena(), {});
  ASSERT_TRUE(SaveCheckpoint(path, (*m)->arena(), adam).ok());
  expect_rejected(StatusCode::kFailedPrecondition,
                  "at #2: checkpoint \"fc2.weight\" [5, 9], model \"fc2.weight\" [7, 9]");
  // The same tensors and one more: the first extra one is named.
  MlpConfig deeper;
  deeper.sizes = {12, 9, 7, 4, 3};
  auto d = Mlp::Create(deeper, &backend);
  ASSERT_TRUE(d.ok());
  Sgd deeper_sgd(&(*d)->arena(), 0.1f);
  ASSERT_TRUE(SaveCheckpoint(path, (*d)->arena(), deeper_sgd).ok());
  expect_rejected(StatusCode::kFailedPrecondition,
                  "checkpoint has 8 tensors, the model has 6 (first extra: \"fc4.weight\" [3, 4])");

  // Written by another optimizer: only the parameters-only loader takes it.
  Trainer sgd("sgd");
  ASSERT_TRUE(SaveCheckpoint(path, sgd.model->arena(), *sgd.optimizer).ok());
  if (params_only()) {
    EXPECT_TRUE(Load(path, &b).ok());
    EXPECT_EQ(b.model->arena().ParamsToHost(), sgd.model->arena().ParamsToHost());
  } else {
    expect_rejected(StatusCode::kFailedPrecondition, "optimizer");
  }
}

INSTANTIATE_TEST_SUITE_P(Loaders, CheckpointLoadErrorsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "LoadCheckpointParams" : "LoadCheckpoint";
                         });

// LoadCheckpointParams: the parameters of a checkpoint written by any
// optimizer (any number of state buffers), into a model with no optimizer.
TEST(CheckpointParamsTest, LoadsOnlyTheParametersWhateverTheOptimizer) {
  TempDir dir;
  const std::string path = dir.File("ckpt.bin");
  for (const char* type : {"adam", "sgd"}) {
    Trainer a(type);
    for (int i = 0; i < 3; ++i) a.Step(i);
    ASSERT_TRUE(SaveCheckpoint(path, a.model->arena(), *a.optimizer).ok());
    Trainer b("adam");
    ASSERT_NE(a.model->arena().ParamsToHost(), b.model->arena().ParamsToHost());
    Status st = LoadCheckpointParams(path, &b.model->arena());
    ASSERT_TRUE(st.ok()) << type << ": " << st.ToString();
    EXPECT_EQ(a.model->arena().ParamsToHost(), b.model->arena().ParamsToHost()) << type;
    EXPECT_EQ(b.optimizer->step(), 0) << type;
    // The resumed optimizer still steps from its own (zero) state.
    EXPECT_TRUE(std::isfinite(b.Step(3)));
  }
}

TEST(CheckpointErrorsTest, UnwritableDirectoryIsAnIOError) {
  Trainer a("adam");
  Status st = SaveCheckpoint("/nonexistent_dir_for_fleet/ckpt.bin", a.model->arena(),
                             *a.optimizer);
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_NE(st.message().find("/nonexistent_dir_for_fleet/ckpt.bin.tmp"), std::string::npos);
}

TEST(MlpTest, BadBatchIsRejectedWithoutSideEffects) {
  CpuBackend backend;
  MlpConfig config;
  config.sizes = {3, 4, 2};
  auto model = Mlp::Create(config, &backend);
  ASSERT_TRUE(model.ok());
  const std::vector<float> x(6, 0.5f);
  EXPECT_TRUE((*model)->Forward(x, std::vector<int32_t>{0, 2}).status().IsInvalidArgument());
  EXPECT_TRUE((*model)->Forward(x, std::vector<int32_t>{0, -1}).status().IsInvalidArgument());
  EXPECT_TRUE((*model)->Forward(x, std::vector<int32_t>{0}).status().IsInvalidArgument());
  EXPECT_TRUE((*model)->Forward({}, {}).status().IsInvalidArgument());
  EXPECT_TRUE((*model)->Forward(x, std::vector<int32_t>{0, 1}).ok());

  config.sizes = {3};
  EXPECT_TRUE(Mlp::Create(config, &backend).status().IsInvalidArgument());
  config.sizes = {3, 0, 2};
  EXPECT_TRUE(Mlp::Create(config, &backend).status().IsInvalidArgument());
}

TEST(MlpTest, InitIsDeterministicAndPytorchLike) {
  CpuBackend backend;
  MlpConfig config;  // 784-128-128-10
  auto a = Mlp::Create(config, &backend);
  auto b = Mlp::Create(config, &backend);
  ASSERT_TRUE(a.ok() && b.ok());
  const auto pa = (*a)->arena().ParamsToHost();
  EXPECT_EQ(pa, (*b)->arena().ParamsToHost());
  EXPECT_EQ(pa.size(), 784u * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10);
  const Tensor w1 = (*a)->arena().param("fc1.weight");
  float maxabs = 0;
  for (int64_t i = 0; i < w1.numel(); ++i) maxabs = std::max(maxabs, std::fabs(w1[i]));
  EXPECT_LE(maxabs, 1.0f / std::sqrt(784.0f));
  EXPECT_GT(maxabs, 0.9f / std::sqrt(784.0f));
  config.seed = 2;
  auto c = Mlp::Create(config, &backend);
  EXPECT_NE(pa, (*c)->arena().ParamsToHost());
}

// Loss goes down when the same few batches are seen repeatedly.
TEST(MlpTest, LearnsASeparableProblem) {
  Trainer t("adam");
  float first = 0, last = 0;
  for (int i = 0; i < 60; ++i) {
    const float loss = t.Step(i % 3);
    if (i == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.5f * first);
}

TEST(CtrDnnTest, DefaultShapeAndInputChecks) {
  CpuBackend backend;
  CtrModelConfig config;  // 26 slots x 9 + 13 dense, 400-400-400-1
  auto model = CtrModel::Create(config, &backend);
  ASSERT_TRUE(model.ok());
  CtrModel& dnn = **model;
  EXPECT_EQ(dnn.input_width(), 26 * 9 + 13);
  EXPECT_EQ(dnn.arena().size(), size_t{247} * 400 + 400 + 2 * (400 * 400 + 400) + 400 + 1);
  const int B = 4;
  const auto pooled = RandomVector(size_t(26) * B * 9, 1);
  auto dense = RandomVector(size_t(B) * 13, 2);
  std::vector<float> labels = {0, 1, 1, 0};
  auto loss = dnn.Forward(pooled, dense, labels);
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(*loss, std::log(2.0f), 0.3f);  // near chance at init
  dnn.Backward();
  EXPECT_EQ(dnn.pooled_grad().numel(), 26 * B * 9);

  labels[2] = 1.5f;
  EXPECT_TRUE(dnn.Forward(pooled, dense, labels).status().IsInvalidArgument());
  labels[2] = 1;
  dense[5] = std::nanf("");
  EXPECT_TRUE(dnn.Forward(pooled, dense, labels).status().IsInvalidArgument());
  dense[5] = 0;
  EXPECT_TRUE(dnn.Forward(std::span<const float>(pooled).first(pooled.size() - 1), dense, labels)
                  .status().IsInvalidArgument());
  config.embedding_dim = 0;
  EXPECT_TRUE(CtrModel::Create(config, &backend).status().IsInvalidArgument());
}

}  // namespace
}  // namespace fleet::trainer
