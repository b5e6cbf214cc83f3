// Heterogeneous PS jobs in one process: servers, CPU workers and heter
// workers on threads (tests/heter/heter_job.h), small CTR data.
#include "tests/heter/heter_job.h"

#include <gtest/gtest.h>

#include <cmath>

#include "trainer/models/ctr_model.h"
#include "worker/config.h"
#include "worker/tasks/ctr_tower.h"

namespace fleet::heter {
namespace {

using ps::testing::MakeJob;
using testing::HeterJob;
using worker::PsWorkerReport;
using worker::testing::FreshDir;
using worker::testing::InProcessJob;
using worker::testing::MakeCtrData;
using worker::testing::OracleAuc;
using worker::testing::SmallCtrYaml;

std::vector<PsWorkerReport> Reports(std::vector<Result<PsWorkerReport>> results) {
  std::vector<PsWorkerReport> reports;
  for (auto& r : results) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) reports.push_back(std::move(r).value());
  }
  return reports;
}

// The job of SmallCtrYaml with a heter section and one progress line per step.
ps::JobConfig HeterYaml(const std::string& dir, const std::string& mode, int batch, int epochs,
                        int depth, int micro_batches) {
  ps::JobConfig job = MakeJob(SmallCtrYaml(dir, mode, batch, epochs));
  CHECK(ps::ApplyOverride(job.root, "Distributed.heter.pipeline_depth=" + std::to_string(depth))
            .ok());
  CHECK(ps::ApplyOverride(job.root,
                          "Distributed.heter.micro_batches=" + std::to_string(micro_batches))
            .ok());
  CHECK(ps::ApplyOverride(job.root, "train.log_interval=1").ok());
  auto parsed = ps::ParseJobConfig(job.root);
  CHECK(parsed.ok()) << parsed.status().ToString();
  return std::move(parsed).value();
}

// `job` run CPU-only and with heter workers on the same cluster shape:
// every worker's report of both (checked complete), and the heter job (for
// its workers' counters).
struct CpuAndHeter {
  std::vector<PsWorkerReport> cpu, heter;
  std::unique_ptr<HeterJob> heter_job;
};
CpuAndHeter RunCpuAndHeter(const ps::JobConfig& job, int servers, int workers, int heters) {
  CpuAndHeter r;
  InProcessJob cpu(job, servers, workers);
  r.heter_job = std::make_unique<HeterJob>(job, servers, workers, heters);
  r.cpu = Reports(cpu.Run());
  r.heter = Reports(r.heter_job->Run());
  EXPECT_EQ(r.cpu.size(), static_cast<size_t>(workers));
  EXPECT_EQ(r.heter.size(), static_cast<size_t>(workers));
  return r;
}

// Every step's training loss of `got` within `rel` (relative) of `want`'s.
void ExpectSameLosses(const PsWorkerReport& want, const PsWorkerReport& got, double rel) {
  ASSERT_EQ(got.train_losses.size(), want.train_losses.size());
  for (size_t i = 0; i < want.train_losses.size(); ++i) {
    const double a = want.train_losses[i], b = got.train_losses[i];
    ASSERT_LE(std::abs(a - b), rel * std::abs(a))
        << "step " << i << ": cpu " << a << " heter " << b;
  }
}

// Sync mode, one micro-batch per step, one in flight: every step computes
// exactly what the CPU-only job computes (the same tower code on the same
// parameters, the dense contributions summed in the same order), so each
// step's loss matches.
TEST(HeterJobTest, SyncDepthOneMatchesTheCpuOnlyRunStepByStep) {
  const std::string dir = FreshDir("heter_equivalence");
  MakeCtrData(dir, 1000);  // 2000 lines: 32 steps of 2 x 32 per epoch
  const ps::JobConfig job = HeterYaml(dir, "sync", 32, 2, /*depth=*/1, /*micro_batches=*/1);
  const CpuAndHeter r = RunCpuAndHeter(job, 2, 2, 2);
  ASSERT_EQ(r.heter.size(), 2u);
  ASSERT_GT(r.cpu[0].train_losses.size(), 60u);
  ExpectSameLosses(r.cpu[0], r.heter[0], 1e-4);
  EXPECT_NEAR(r.heter[0].heldout_metric, r.cpu[0].heldout_metric, 1e-4);
  // The dense side did the dense work: every micro-batch went to a heter worker.
  EXPECT_EQ(r.heter_job->heter(0).micro_batches() + r.heter_job->heter(1).micro_batches(),
            2 * 2 * 32);
  EXPECT_GT(r.heter[0].heter_idle_fraction, 0.0);
}

// The other CTR models' dense parts run on heter workers too: the same
// step-by-step losses as the CPU-only run (wide and FM read each field's
// float 0 as its first-order weight, floats 1..3 as its embedding).
class HeterCtrModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HeterCtrModelTest, SyncMatchesTheCpuOnlyRunStepByStep) {
  const std::string dir = FreshDir("heter_" + GetParam());
  MakeCtrData(dir, 500);
  ps::JobConfig job = HeterYaml(dir, "sync", 32, 1, /*depth=*/1, /*micro_batches=*/1);
  CHECK(ps::ApplyOverride(job.root, "model.kind=" + GetParam()).ok());
  CHECK(ps::ApplyOverride(job.root, "model.cross_layers=1").ok());
  auto config = worker::ParseWorkerConfig(job.root);
  ASSERT_TRUE(config.ok());
  auto model = worker::CtrTowerConfig(*config, job);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  size_t params = 0;
  for (const trainer::ParamSpec& p : trainer::CtrModelParamTable(*model))
    params += static_cast<size_t>(p.shape.numel());
  CHECK(ps::ApplyOverride(job.root, "tables.1.dim=" + std::to_string(params)).ok());
  auto parsed = ps::ParseJobConfig(job.root);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const CpuAndHeter r = RunCpuAndHeter(*parsed, 1, 1, 1);
  ASSERT_EQ(r.heter.size(), 1u);
  ASSERT_GT(r.cpu[0].train_losses.size(), 20u);
  ExpectSameLosses(r.cpu[0], r.heter[0], 1e-4);
  EXPECT_EQ(r.heter_job->heter(0).micro_batches(), 32);
}

INSTANTIATE_TEST_SUITE_P(Kinds, HeterCtrModelTest, ::testing::Values("wide_deep", "deepfm", "dcn"),
                         [](const auto& info) { return info.param; });

// Sync mode with each step cut into 3 micro-batches sends them all whatever
// the depth (each reply waits for the whole step: at depth 1 the job would
// wait for its own second micro-batch until the deadline). The step's dense
// gradient is the sum of its pieces' scaled gradients, so every step's loss
// stays within float rounding of the CPU-only run's.
TEST(HeterJobTest, SyncSendsAStepsMicroBatchesTogetherAndMatchesTheCpuOnlyRun) {
  const std::string dir = FreshDir("heter_sync_micro");
  MakeCtrData(dir, 1000);
  const ps::JobConfig job = HeterYaml(dir, "sync", 32, 1, /*depth=*/1, /*micro_batches=*/3);
  const CpuAndHeter r = RunCpuAndHeter(job, 1, 2, 2);
  ASSERT_EQ(r.heter.size(), 2u);
  ExpectSameLosses(r.cpu[0], r.heter[0], 1e-3);
  EXPECT_EQ(r.heter_job->heter(0).micro_batches() + r.heter_job->heter(1).micro_batches(),
            2 * 32 * 3);
}

// A heter worker given a config without a dense section to run refuses to
// start, saying what is missing; one whose model differs from the CPU
// workers' refuses their micro-batches, and the job fails naming it.
TEST(HeterJobTest, ConfigsWithoutADenseSectionOrAnotherModelAreClearErrors) {
  const std::string dir = FreshDir("heter_bad_config");
  MakeCtrData(dir, 200);
  const std::string good = SmallCtrYaml(dir, "sync", 32, 1);
  auto refused = [&](const std::string& yaml, const std::string& needle) {
    HeterWorkerOptions o;
    o.servers = {"127.0.0.1:1"};
    o.job = MakeJob(yaml);
    auto h = HeterWorker::Create(o);
    ASSERT_FALSE(h.ok()) << needle;
    EXPECT_TRUE(h.status().IsInvalidArgument()) << h.status().ToString();
    EXPECT_NE(h.status().message().find("no dense section"), std::string::npos)
        << h.status().ToString();
    EXPECT_NE(h.status().message().find(needle), std::string::npos) << h.status().ToString();
  };
  refused(good.substr(0, good.find("model:")), "missing section: model");
  std::string mlp = good;
  mlp.replace(mlp.find("kind: ctr_dnn"), 13, "kind: mlp");
  refused(mlp + "data: {train_images: a, train_labels: b}\n", "model.kind");
  std::string no_dense = good;
  no_dense.replace(no_dense.find("  - {id: 1, kind: dense"), 0, "");
  no_dense.replace(no_dense.find("dense_table: 1"), 14, "dense_table: 5");
  refused(no_dense, "names no dense table in `tables`: model.dense_table=5");
  std::string wrong_dim = good;
  wrong_dim.replace(wrong_dim.find("dim: 4321"), 9, "dim: 4000");
  refused(wrong_dim, "has dim 4000 but the tower has 4321 parameters");

  // Heter workers with another embedding width than the CPU workers'.
  ps::JobConfig cpu_job = MakeJob(good);
  HeterJob heter(cpu_job, 1, 1, 1);
  std::string wider = good;
  wider.replace(wider.find("dim: 4, shard_num"), 6, "dim: 5");
  wider.replace(wider.find("dim: 4321"), 9, "dim: 5153");
  HeterWorkerOptions o;
  o.servers = heter.job().servers();
  o.job = MakeJob(wider);
  auto mismatched = HeterWorker::Create(o);
  ASSERT_TRUE(mismatched.ok()) << mismatched.status().ToString();
  auto bound = mismatched.value()->Start();
  ASSERT_TRUE(bound.ok());
  heter.job().set_heter_workers({bound.value()});
  auto results = heter.Run();
  ASSERT_FALSE(results[0].ok());
  const Status& s = results[0].status();
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("heter worker 0 (" + bound.value()), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("26 slots x 4 + 13 dense features but this heter worker's model has "
                             "26 slots x 5"),
            std::string::npos)
      << s.ToString();
}

// The heter pipeline with the CTR accessor: the CPU workers push a show and
// a click for every key of every micro-batch, once, whether the steps are
// cut into micro-batches (sync) or several are in flight (async).
class HeterCtrAccessorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HeterCtrAccessorTest, EveryMicroBatchIsCountedOnce) {
  const std::string dir = FreshDir("heter_ctr_" + GetParam());
  MakeCtrData(dir, 1000);
  ps::JobConfig job = HeterYaml(dir, GetParam(), 32, 2, /*depth=*/3, /*micro_batches=*/2);
  CHECK(ps::ApplyOverride(job.root, "tables.0.accessor=ctr").ok());
  CHECK(ps::ApplyOverride(job.root, "tables.0.dim=3").ok());
  CHECK(ps::ApplyOverride(job.root, "tables.0.ctr={embed_dim: 1, embedx_threshold: 5}").ok());
  HeterJob heter(MakeJob(YAML::Dump(job.root)), 2, 2, 2);
  const auto reports = Reports(heter.Run());
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_FALSE(std::isnan(reports[0].heldout_metric));
  const auto want = worker::testing::TrainLineCounts(dir, 2);
  const auto got = worker::testing::ServerCounts(heter.job(), dir);
  EXPECT_EQ(got.shows, want.shows);
  EXPECT_EQ(got.clicks, want.clicks);
  EXPECT_GT(got.ext_rows, 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, HeterCtrAccessorTest, ::testing::Values("sync", "async"),
                         [](const auto& info) { return info.param; });

const std::string& CtrData() { return worker::testing::AucData("heter_ctr_data"); }

struct BarCase {
  std::string mode;
  int depth;
  int micro_batches;
};

class HeterAucTest : public ::testing::TestWithParam<BarCase> {};

// The AUC bar of the CPU-only job (tests/worker/worker_e2e_test.cc) with the
// dense part on 2 heter workers: 2 servers, 2 CPU workers, 150k lines, 4
// epochs, 4 micro-batches in flight (sync: each step cut into 4).
TEST_P(HeterAucTest, ReachesOracleAucMinus002) {
  const BarCase& c = GetParam();
  const std::string& dir = CtrData();
  ps::JobConfig job = HeterYaml(dir, c.mode, 128, 4, c.depth, c.micro_batches);
  CHECK(ps::ApplyOverride(job.root, "train.log_interval=100").ok());
  job = MakeJob(YAML::Dump(job.root));
  HeterJob heter(job, 2, 2, 2);
  const auto reports = Reports(heter.Run());
  ASSERT_EQ(reports.size(), 2u);
  const double oracle = OracleAuc(dir);
  for (const auto& r : reports) {
    EXPECT_GE(r.heldout_metric, oracle - 0.02) << c.mode << " oracle " << oracle;
    EXPECT_EQ(r.heter_resends, 0);
  }
  // Both heter workers did their share.
  EXPECT_GT(heter.heter(0).micro_batches(), 0);
  EXPECT_GT(heter.heter(1).micro_batches(), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, HeterAucTest,
                         ::testing::Values(BarCase{"sync", 4, 4}, BarCase{"async", 4, 1},
                                           BarCase{"geo", 4, 1}),
                         [](const auto& info) {
                           return info.param.mode + "_depth" + std::to_string(info.param.depth) +
                                  "_micro" + std::to_string(info.param.micro_batches);
                         });

}  // namespace
}  // namespace fleet::heter
