// The model registry of ps_worker (worker/task.h) as ParseWorkerConfig and
// CreateWorkerTask see it: kinds are looked up by name, an unknown kind is
// refused naming the known ones, and each model's own config rules and
// default dense table apply.
#include "worker/task.h"

#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "ps/job_config.h"
#include "tests/test_paths.h"
#include "tests/worker/worker_test_util.h"
#include "worker/config.h"
#include "worker/tasks/ctr_tower.h"

namespace fleet::worker {
namespace {

Result<WorkerConfig> Parse(const std::string& yaml) { return ParseWorkerConfig(YAML::Load(yaml)); }

TEST(WorkerTaskRegistryTest, ListsEveryModelOnceWithItsFunctions) {
  std::set<std::string> kinds;
  for (const WorkerTaskType* type : WorkerTaskTypes()) {
    ASSERT_NE(type, nullptr);
    EXPECT_TRUE(kinds.insert(type->kind).second) << "kind listed twice: " << type->kind;
    EXPECT_NE(type->check_config, nullptr) << type->kind;
    EXPECT_NE(type->create, nullptr) << type->kind;
    EXPECT_EQ(FindWorkerTaskType(type->kind), type);
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"ctr_dnn", "mlp"}));
  // The CTR models share the ctr_dnn task.
  for (const char* ctr : {"dnn", "wide_deep", "deepfm", "dcn"}) {
    EXPECT_EQ(FindWorkerTaskType(ctr), FindWorkerTaskType("ctr_dnn")) << ctr;
  }
  EXPECT_EQ(FindWorkerTaskType("xdeepfm"), nullptr);
  EXPECT_EQ(WorkerTaskKinds(), "ctr_dnn, dnn, wide_deep, deepfm, dcn, mlp");
}

TEST(WorkerTaskRegistryTest, HugeSizesAreRefusedNamingTheKeyBeforeAnyAllocation) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model: {kind: ctr_dnn, hidden: [100000000]}\ndata: {train: x}\n", "model.hidden"},
      {"model: {kind: ctr_dnn, hidden: [60000, 60000, 60000]}\ndata: {train: x}\n",
       "weights"},
      {"model: {kind: mlp, sizes: [784, 100000000]}\ndata: {train_images: a, train_labels: b}\n",
       "model.sizes"},
      {"model: {kind: ctr_dnn}\ndata: {train: x}\ntrain: {batch_size: 100000000}\n",
       "train.batch_size"},
      {"model: {kind: ctr_dnn}\ndata: {train: x}\ntrain: {blas_threads: 100000}\n",
       "train.blas_threads"},
      {"model: {kind: ctr_dnn}\ndata: {train: x}\ntrain: {epochs: 10000000000}\n",
       "train.epochs"},
  };
  for (const auto& [yaml, named] : cases) {
    auto c = Parse(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_TRUE(c.status().IsInvalidArgument()) << c.status().ToString();
    EXPECT_NE(c.status().ToString().find(named), std::string::npos) << c.status().ToString();
  }
}

TEST(WorkerTaskRegistryTest, UnknownKindIsRefusedNamingTheKnownOnes) {
  auto c = Parse("model: {kind: xdeepfm}\ndata: {train: x}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsInvalidArgument()) << c.status().ToString();
  EXPECT_NE(c.status().ToString().find("model.kind"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find(
                "must be one of ctr_dnn, dnn, wide_deep, deepfm, dcn, mlp, got 'xdeepfm'"),
            std::string::npos)
      << c.status().ToString();
}

TEST(WorkerTaskRegistryTest, EachModelAppliesItsOwnConfigRulesAndDefaults) {
  auto ctr = Parse("model: {kind: ctr_dnn}\ndata: {train: x}\n");
  ASSERT_TRUE(ctr.ok()) << ctr.status().ToString();
  EXPECT_EQ(ctr->model.kind, "ctr_dnn");
  EXPECT_EQ(ctr->model.dense_table, 1u);

  auto mlp = Parse("model: {kind: mlp}\ndata: {train_images: a, train_labels: b}\n");
  ASSERT_TRUE(mlp.ok()) << mlp.status().ToString();
  EXPECT_EQ(mlp->model.dense_table, 0u);
  auto mlp_set =
      Parse("model: {kind: mlp, dense_table: 3}\ndata: {train_images: a, train_labels: b}\n");
  ASSERT_TRUE(mlp_set.ok()) << mlp_set.status().ToString();
  EXPECT_EQ(mlp_set->model.dense_table, 3u);

  // ctr_dnn's data key is not mlp's, and the other way round.
  auto ctr_bad = Parse("model: {kind: ctr_dnn}\ndata: {train_images: a, train_labels: b}\n");
  ASSERT_FALSE(ctr_bad.ok());
  EXPECT_NE(ctr_bad.status().ToString().find("data.train"), std::string::npos);
  EXPECT_NE(ctr_bad.status().message().find("required for model.kind ctr_dnn"), std::string::npos);
  auto mlp_bad = Parse("model: {kind: mlp}\ndata: {train: x}\n");
  ASSERT_FALSE(mlp_bad.ok());
  EXPECT_NE(mlp_bad.status().message().find("required for model.kind mlp"), std::string::npos)
      << mlp_bad.status().ToString();
  auto mlp_half =
      Parse("model: {kind: mlp}\ndata: {train_images: a, train_labels: b, test_images: c}\n");
  ASSERT_FALSE(mlp_half.ok());
  EXPECT_NE(mlp_half.status().message().find("give both or neither"), std::string::npos);
}

// model.kind picks the CTR model's parts; cross_layers is checked.
TEST(WorkerTaskRegistryTest, CtrKindsChooseTheirParts) {
  const std::string tables =
      "tables:\n"
      "  - {id: 0, kind: sparse, dim: 8, accessor: ctr, ctr: {embed_dim: 1}}\n"
      "  - {id: 1, kind: dense, dim: 10}\n";
  auto tower = [&](const std::string& model) {
    const YAML::Node root = YAML::Load(tables + "model: " + model + "\ndata: {train: x}\n");
    Result<ps::JobConfig> job = ps::ParseJobConfig(root);
    CHECK(job.ok()) << job.status().ToString();
    Result<WorkerConfig> config = ParseWorkerConfig(root);
    CHECK(config.ok()) << config.status().ToString();
    return CtrTowerConfig(*config, *job);
  };
  auto deepfm = tower("{kind: deepfm, hidden: [8]}");
  ASSERT_TRUE(deepfm.ok()) << deepfm.status().ToString();
  EXPECT_TRUE(deepfm->wide && deepfm->fm);
  EXPECT_EQ(deepfm->cross_layers, 0);
  EXPECT_EQ(deepfm->embedding_dim, 9);  // embed_w + embedx
  EXPECT_EQ(deepfm->hidden, std::vector<int>{8});
  auto dcn = tower("{kind: dcn}");
  ASSERT_TRUE(dcn.ok());
  EXPECT_EQ(dcn->cross_layers, 3);  // the default
  EXPECT_FALSE(dcn->wide || dcn->fm);
  auto dnn = tower("{kind: ctr_dnn, cross_layers: 5}");
  ASSERT_TRUE(dnn.ok());
  EXPECT_EQ(dnn->cross_layers, 0);  // not a dcn: ignored
  EXPECT_EQ(tower("{kind: dcn, cross_layers: 2}")->cross_layers, 2);
  for (const char* bad : {"0", "17"}) {
    auto c =
        Parse(std::string("model: {kind: dcn, cross_layers: ") + bad + "}\ndata: {train: x}\n");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().ToString().find("model.cross_layers"), std::string::npos);
  }
  WorkerConfig mlp;
  mlp.model.kind = "mlp";
  auto not_ctr = CtrTowerConfig(mlp, ps::JobConfig{});
  ASSERT_FALSE(not_ctr.ok());
  EXPECT_NE(not_ctr.status().message().find("'mlp' is not a CTR model"), std::string::npos);
}

// LoadPsJobConfig (fleetrun's check of the whole job file) reads a `_base_`
// chain, names the file that set a bad worker key, and puts an override to
// blame first, once.
TEST(WorkerTaskRegistryTest, LoadPsJobConfigNamesTheBaseFileOrOverrideOfABadKey) {
  const std::string dir = testing::FreshDir("worker_config_base");
  const std::string base = dir + "/base.yaml", child = dir + "/child.yaml";
  const std::string job =
      "tables: [{id: 0, kind: sparse, dim: 9}, {id: 1, kind: dense, dim: 10}]\n"
      "model: {kind: ctr_dnn}\ndata: {train: x}\n";
  std::ofstream(base) << job << "train: {epochs: 3}\n";
  std::ofstream(child) << "_base_: base.yaml\ntrain: {batch_size: 64}\n";
  auto ok = LoadPsJobConfig(child, {"train.log_interval=5"});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->worker.train.epochs, 3);
  EXPECT_EQ(ok->worker.train.batch_size, 64);
  EXPECT_EQ(ok->worker.train.log_interval, 5);
  EXPECT_EQ(ok->job.tables.size(), 2u);

  std::ofstream(base) << job << "train: {epoch: 3}\n";
  auto in_base = LoadPsJobConfig(child, {});
  ASSERT_FALSE(in_base.ok());
  EXPECT_NE(in_base.status().message().find("train.epoch: unknown key (from " + base + ")"),
            std::string::npos)
      << in_base.status().ToString();

  std::ofstream(base) << job;
  auto from_override = LoadPsJobConfig(child, {"train.epochs=2", "train.batchsize=1"});
  ASSERT_FALSE(from_override.ok());
  EXPECT_EQ(from_override.status().message().rfind(
                "-o train.batchsize=1: unknown key: train.batchsize; train takes ", 0),
            0u)
      << from_override.status().ToString();
  EXPECT_EQ(from_override.status().message().find("(from"), std::string::npos)
      << from_override.status().ToString();

  std::ofstream(child) << "_base_: base.yaml\n";
  auto no_data = LoadPsJobConfig(child, {"data=null"});
  ASSERT_FALSE(no_data.ok());
  EXPECT_EQ(no_data.status().message().rfind("-o data=null: missing section: data", 0), 0u)
      << no_data.status().ToString();
}

TEST(WorkerTaskRegistryTest, CreateWorkerTaskRefusesAKindNoModelHas) {
  WorkerConfig config;
  config.model.kind = "xdeepfm";
  auto task = CreateWorkerTask(config, ps::JobConfig{}, {});
  ASSERT_FALSE(task.ok());
  EXPECT_TRUE(task.status().IsInvalidArgument());
  EXPECT_NE(task.status().message().find("ctr_dnn, dnn, wide_deep, deepfm, dcn, mlp"),
            std::string::npos);
}

// A long data load is not silent: the loader reports what it has read.
TEST(WorkerTaskRegistryTest, LoadingDataReportsProgress) {
  const std::string dir = testing::FreshDir("task_load_progress");
  testing::MakeCtrData(dir, 1024);
  auto ctr = testing::LoadCtrJob(dir);
  ASSERT_TRUE(ctr.ok()) << ctr.status().ToString();
  const ps::JobConfig& job = ctr->job;
  const WorkerConfig& config = ctr->config;
  std::vector<std::string> lines;
  WorkerTaskOptions options;
  options.load_progress_every = std::chrono::nanoseconds(1);  // after every batch
  options.load_progress = [&lines](const std::string& line) { lines.push_back(line); };
  auto task = CreateWorkerTask(config, job, options);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  // 2 x 1024 training lines in batches of 256, then the test file's.
  ASSERT_GE(lines.size(), 8u);
  EXPECT_EQ(lines[7].rfind("loading data.train: 2048 lines of this worker's share read (2048 "
                           "samples, 0 malformed), 8 batches, ",
                           0),
            0u)
      << lines[7];
  EXPECT_EQ(lines.back().rfind("loading data.test: ", 0), 0u) << lines.back();
  // Off by default.
  lines.clear();
  ASSERT_TRUE(CreateWorkerTask(config, job, {}).ok());
  EXPECT_TRUE(lines.empty());
}

}  // namespace
}  // namespace fleet::worker
