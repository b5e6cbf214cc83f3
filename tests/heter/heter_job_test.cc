// Heterogeneous PS jobs in one process: servers, CPU workers and heter
// workers on threads (tests/heter/heter_job.h), small CTR data.
#include "tests/heter/heter_job.h"

#include <gtest/gtest.h>

#include <cmath>

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

// Sync mode, one micro-batch per step, one in flight: every step computes
// exactly what the CPU-only job computes (the same tower code on the same
// parameters, the dense contributions summed in the same order), so each
// step's loss matches.
TEST(HeterJobTest, SyncDepthOneMatchesTheCpuOnlyRunStepByStep) {
  const std::string dir = FreshDir("heter_equivalence");
  MakeCtrData(dir, 1000);  // 2000 lines: 32 steps of 2 x 32 per epoch
  const ps::JobConfig job = HeterYaml(dir, "sync", 32, 2, /*depth=*/1, /*micro_batches=*/1);
  InProcessJob cpu(job, 2, 2);
  HeterJob heter(job, 2, 2, 2);
  const auto want = Reports(cpu.Run());
  const auto got = Reports(heter.Run());
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(got[0].train_losses.size(), want[0].train_losses.size());
  ASSERT_GT(want[0].train_losses.size(), 60u);
  for (size_t i = 0; i < want[0].train_losses.size(); ++i) {
    const double a = want[0].train_losses[i], b = got[0].train_losses[i];
    ASSERT_LE(std::abs(a - b), 1e-4 * std::abs(a))
        << "step " << i << ": cpu " << a << " heter " << b;
  }
  EXPECT_NEAR(got[0].heldout_metric, want[0].heldout_metric, 1e-4);
  // The dense side did the dense work: every micro-batch went to a heter worker.
  EXPECT_EQ(heter.heter(0).micro_batches() + heter.heter(1).micro_batches(), 2 * 2 * 32);
  EXPECT_GT(got[0].heter_idle_fraction, 0.0);
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
