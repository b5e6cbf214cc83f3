// ps_worker end to end, in process: servers + workers on threads, small data.
#include <cmath>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/tensorboard_events.h"
#include "tests/worker/worker_test_util.h"
#include "data/ctr_reader.h"
#include "comm/file_io.h"

namespace fleet::worker {
namespace {

using ps::testing::MakeJob;
using testing::AllKeys;
using testing::CtrCounts;
using testing::FreshDir;
using testing::InProcessJob;
using testing::MakeCtrData;
using testing::OracleAuc;
using testing::ServerCounts;
using testing::SmallCtrYaml;
using testing::TrainLineCounts;

const std::string& CtrData() { return testing::AucData("ctr_data"); }

std::vector<PsWorkerReport> RunOk(InProcessJob& job) {
  std::vector<PsWorkerReport> reports;
  for (auto& r : job.Run()) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) reports.push_back(r.value());
  }
  return reports;
}

class WorkerModeTest : public ::testing::TestWithParam<std::string> {};

// The AUC bar of issue 5 at a small size: 2 servers, 2 workers, 150k lines, 4 epochs.
TEST_P(WorkerModeTest, ReachesOracleAucMinus002) {
  const std::string& dir = CtrData();
  InProcessJob job(MakeJob(SmallCtrYaml(dir, GetParam(), 128, 4)), 2, 2);
  auto reports = RunOk(job);
  ASSERT_EQ(reports.size(), 2u);
  const double oracle = OracleAuc(dir);
  for (const auto& r : reports) {
    EXPECT_EQ(r.metric_name, "auc");
    EXPECT_NEAR(r.oracle_auc, oracle, 1e-9);
    EXPECT_GE(r.heldout_metric, oracle - 0.02) << GetParam() << " oracle " << oracle;
    EXPECT_EQ(r.malformed_lines, 0);
    EXPECT_GT(r.train_samples_per_sec, 0);
  }
  // Every worker computed the same aggregated metric.
  EXPECT_DOUBLE_EQ(reports[0].heldout_metric, reports[1].heldout_metric);
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerModeTest, ::testing::Values("sync", "async", "geo"),
                         [](const auto& info) { return info.param; });

// The same job with the CTR accessor on the sparse table: rows of embed_w (1)
// + embedx (3), so a pull has the plain table's 4 floats and the dense table
// is unchanged; the workers push a show and a click per key, and a row gets
// its embedx once its score reaches the threshold. Reaches the same bar, and
// the servers counted every sighting.
class WorkerCtrAccessorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkerCtrAccessorTest, ReachesOracleAucMinus002AndCountsShowsAndClicks) {
  const std::string& dir = CtrData();
  std::string yaml = SmallCtrYaml(dir, GetParam(), 128, 4);
  yaml.replace(yaml.find("dim: 4, shard_num: 8,"), 21,
               "dim: 3, shard_num: 8, accessor: ctr, ctr: {embed_dim: 1, embedx_threshold: 1000},");
  InProcessJob job(MakeJob(yaml), 2, 2);
  auto reports = RunOk(job);
  ASSERT_EQ(reports.size(), 2u);
  const double oracle = OracleAuc(dir);
  EXPECT_GE(reports[0].heldout_metric, oracle - 0.02) << GetParam() << " oracle " << oracle;
  // Every training line showed each of its 26 keys once per epoch, with its
  // label as the click.
  const CtrCounts want = TrainLineCounts(dir, 4);
  const CtrCounts got = ServerCounts(job, dir);
  EXPECT_EQ(got.shows, want.shows);
  EXPECT_EQ(got.clicks, want.clicks);
  EXPECT_GT(got.ext_rows, 0u);
  EXPECT_LT(got.ext_rows, got.rows);  // rarely clicked keys never reach the threshold
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerCtrAccessorTest, ::testing::Values("sync", "geo"),
                         [](const auto& info) { return info.param; });

// Sync determinism: 2 workers with batch B and 1 worker with batch 2B see
// the same lines per step (line i goes to worker i % 2) and the servers
// apply the rank-ordered sum of per-worker gradients scaled by b/(B*W): the
// gradient of the global batch mean. SGD on both tables keeps the check
// about the data path, not optimizer state.
TEST(WorkerSyncTest, TwoWorkersBatchBEqualOneWorkerBatch2B) {
  const std::string dir = FreshDir("sync_equivalence");
  MakeCtrData(dir, 1000);  // 2000 lines: 31.25 global batches of 64 (a short last one)
  auto yaml = [&](int batch) {
    std::string y = SmallCtrYaml(dir, "sync", batch, 1);
    // SGD on both tables.
    y.replace(y.find("rule: adagrad, learning_rate: 0.15"), 34, "rule: sgd, learning_rate: 0.100");
    y.replace(y.find("rule: adam, learning_rate: 0.003"), 32, "rule: sgd, learning_rate: 0.050");
    return y;
  };
  InProcessJob two(MakeJob(yaml(32)), 2, 2);
  InProcessJob one(MakeJob(yaml(64)), 2, 1);
  RunOk(two);
  RunOk(one);
  // The initialisation alone (no epoch), to show the parameters did move.
  auto init_job = MakeJob(yaml(64));
  init_job.root["train"]["epochs"] = 0;
  InProcessJob untrained(init_job, 1, 1);
  RunOk(untrained);

  std::vector<float> d2(4321), d1(4321);
  ASSERT_TRUE(two.client().PullDense(1, d2).ok());
  ASSERT_TRUE(one.client().PullDense(1, d1).ok());
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < d1.size(); ++i) {
    if (std::abs(d1[i] - d2[i]) > worst) worst = std::abs(d1[i] - d2[i]), worst_at = i;
  }
  EXPECT_LE(worst, 1e-5) << "dense param " << worst_at << ": " << d1[worst_at] << " vs "
                         << d2[worst_at];
  const std::vector<uint64_t> keys = AllKeys(dir);
  std::vector<float> s2(keys.size() * 4), s1(keys.size() * 4);
  ASSERT_TRUE(two.client().PullSparse(0, keys, s2).ok());
  ASSERT_TRUE(one.client().PullSparse(0, keys, s1).ok());
  worst = 0;
  for (size_t i = 0; i < s1.size(); ++i) {
    if (std::abs(s1[i] - s2[i]) > worst) worst = std::abs(s1[i] - s2[i]), worst_at = i;
  }
  EXPECT_LE(worst, 1e-5) << "sparse key " << keys[worst_at / 4] << " element " << worst_at % 4;
  // The parameters did move: the comparison is not of two untouched tables.
  std::vector<float> d0(4321);
  ASSERT_TRUE(untrained.client().PullDense(1, d0).ok());
  double moved = 0;
  for (size_t i = 0; i < d0.size(); ++i) moved = std::max<double>(moved, std::abs(d1[i] - d0[i]));
  EXPECT_GT(moved, 1e-3);
}

// A sync worker killed between its push of a step and its part of the
// metrics round after it (log_interval 1), then restarted: the other worker
// waits in that round for it, and it must not wait for the other's push of
// the next step (they deadlocked until Distributed.timeout_ms: 6 of 12 runs
// of the kill -9 repro). Killed here at a chosen point through
// PsWorkerOptions::die_after_push_for_test, then restarted as fleetrun
// --max_restart does (restart generation 1, same job id and KV store).
TEST(WorkerSyncTest, RestartedWorkerRejoinsTheMetricsRoundItsEarlierLifeMissed) {
  const std::string dir = FreshDir("sync_rejoin_round");
  MakeCtrData(dir, 500);  // 1000 lines: 16 global batches of 64
  std::string yaml = SmallCtrYaml(dir, "sync", 32, 1);
  yaml.replace(yaml.find("log_interval: 0"), 15, "log_interval: 1");
  yaml.replace(yaml.find("timeout_ms: 20000"), 17, "timeout_ms: 8000");
  InProcessJob job(MakeJob(yaml), 1, 2);
  auto options = [&](int rank) {
    PsWorkerOptions o;
    o.rank = rank;
    o.num_workers = 2;
    o.servers = job.servers();
    o.kv_endpoint = job.kv_endpoint();
    o.job_id = "rejoin";
    o.job = job.job();
    return o;
  };
  Result<PsWorkerReport> survivor = Status::Internal("not run"), first_life = survivor,
                         second_life = survivor;
  std::thread worker0([&] { survivor = RunPsWorker(options(0)); });
  std::thread worker1([&] {
    PsWorkerOptions o = options(1);
    o.die_after_push_for_test = [](int64_t step) { return step == 5; };
    first_life = RunPsWorker(o);
    o = options(1);
    o.restart_generation = 1;
    second_life = RunPsWorker(o);
  });
  worker0.join();
  worker1.join();
  EXPECT_NE(first_life.status().message().find("killed by the test after pushing step 5"),
            std::string::npos)
      << first_life.status().ToString();
  ASSERT_TRUE(survivor.ok()) << survivor.status().ToString();
  ASSERT_TRUE(second_life.ok()) << second_life.status().ToString();
  EXPECT_EQ(second_life->steps, survivor->steps - 6) << "rejoined at step 6";
}

// A checkpoint saved after epoch 1 and loaded into a fresh job evaluates to
// the same held-out AUC, and training on from it matches the original run's
// epoch 2 (sync mode is deterministic; the checkpoint holds optimizer state).
TEST(WorkerCheckpointTest, LoadedCheckpointContinuesWithTheSameMetric) {
  const std::string data_dir = FreshDir("ckpt_data");
  MakeCtrData(data_dir, 3000);
  const std::string ckpt = FreshDir("ckpt");
  auto base = SmallCtrYaml(data_dir, "sync", 128, 2);
  {
    auto job = MakeJob(base);
    job.root["train"]["save_dir"] = ckpt;
    job.root["train"]["save_every_epochs"] = 1;
    InProcessJob a(job, 2, 2);
    auto ra = RunOk(a);
    ASSERT_EQ(ra.size(), 2u);
    ASSERT_EQ(ra[0].epochs.size(), 2u);
    const double auc1 = ra[0].epochs[0].heldout_metric;
    const double auc2 = ra[0].epochs[1].heldout_metric;

    // Evaluate only, from the epoch-1 checkpoint.
    auto eval = ps::ParseJobConfig(YAML::Load(base));
    ASSERT_TRUE(eval.ok());
    ASSERT_TRUE(ps::ApplyOverride(eval->root, "server.load_dir=" + ckpt + "/epoch_1").ok());
    ASSERT_TRUE(ps::ApplyOverride(eval->root, "train.epochs=0").ok());
    auto eval_job = ps::ParseJobConfig(eval->root);
    ASSERT_TRUE(eval_job.ok()) << eval_job.status().ToString();
    InProcessJob b(eval_job.value(), 2, 2);
    auto rb = RunOk(b);
    ASSERT_EQ(rb.size(), 2u);
    EXPECT_NEAR(rb[0].heldout_metric, auc1, 1e-6);

    // Train one more epoch from it.
    ASSERT_TRUE(ps::ApplyOverride(eval->root, "train.epochs=1").ok());
    auto cont_job = ps::ParseJobConfig(eval->root);
    ASSERT_TRUE(cont_job.ok());
    InProcessJob c(cont_job.value(), 2, 2);
    auto rc = RunOk(c);
    ASSERT_EQ(rc.size(), 2u);
    EXPECT_NEAR(rc[0].heldout_metric, auc2, 1e-4);
  }
}

// Worker 0's TensorBoard curves, decoded as TensorBoard reads them
// (tests/read_tb_events.py, python3-protobuf), hold the report's values: the
// training loss of every progress line and each epoch's held-out AUC.
TEST(WorkerTensorBoardTest, CurvesHoldTheReportedValues) {
  const std::string missing = fleet::testing::TbDecoderMissing();
  if (!missing.empty()) GTEST_SKIP() << "skipped: " << missing;
  const std::string dir = FreshDir("tensorboard");
  MakeCtrData(dir, 500);
  InProcessJob job(MakeJob(SmallCtrYaml(dir, "sync", 64, 2)), 1, 2);
  job.tensorboard_dir = dir + "/tb";
  auto reports = RunOk(job);
  ASSERT_EQ(reports.size(), 2u);
  std::string error;
  const auto scalars = fleet::testing::ReadTbScalars(FLEET_PROTOC, FLEET_TEST_SOURCE_DIR,
                                                     dir + "/tb", &error);
  ASSERT_TRUE(error.empty()) << error;
  std::vector<double> losses, aucs;
  for (const auto& s : scalars) {
    if (s.tag == "train/loss") losses.push_back(s.value);
    if (s.tag == "eval/auc") aucs.push_back(s.value);
  }
  ASSERT_EQ(losses.size(), reports[0].train_losses.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], reports[0].train_losses[i], 1e-6 * std::abs(losses[i])) << i;
  }
  ASSERT_EQ(aucs.size(), reports[0].epochs.size());
  for (size_t i = 0; i < aucs.size(); ++i) {
    EXPECT_NEAR(aucs[i], reports[0].epochs[i].heldout_metric, 1e-6) << i;
  }
}

TEST(WorkerDataTest, MalformedLinesAreCountedNotFatal) {
  const std::string dir = FreshDir("malformed");
  MakeCtrData(dir, 500);
  {
    std::ofstream f(dir + "/train/part-00000.txt", std::ios::app);
    f << "not a ctr line\n1\t2\n\nzz\t1\n";
  }
  InProcessJob job(MakeJob(SmallCtrYaml(dir, "async", 64, 1)), 1, 2);
  auto reports = RunOk(job);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].malformed_lines, 4);
  EXPECT_EQ(reports[1].malformed_lines, 4);
  EXPECT_FALSE(std::isnan(reports[0].heldout_metric));
}

TEST(WorkerConfigTest, DenseTableDimMustMatchTheModelExactly) {
  const std::string dir = CtrData();
  std::string yaml = SmallCtrYaml(dir, "sync", 64, 1);
  yaml.replace(yaml.find("dim: 4321"), 9, "dim: 4000");
  InProcessJob job(MakeJob(yaml), 1, 1);
  auto results = job.Run();
  ASSERT_FALSE(results[0].ok());
  const Status& s = results[0].status();
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("set tables.1.dim: 4321"), std::string::npos) << s.ToString();
}

TEST(WorkerConfigTest, UnknownKeysAndUnusedTablesAreRefused) {
  const std::string dir = CtrData();
  auto typo = MakeJob(SmallCtrYaml(dir, "sync", 64, 1));
  typo.root["train"]["batch_sise"] = 3;
  InProcessJob a(typo, 1, 1);
  auto ra = a.Run();
  ASSERT_FALSE(ra[0].ok());
  EXPECT_NE(ra[0].status().message().find("train.batch_sise"), std::string::npos);

  std::string extra = SmallCtrYaml(dir, "sync", 64, 1);
  extra.replace(extra.find("model:"), 0, "  - {id: 7, kind: dense, dim: 3}\n");
  InProcessJob b(MakeJob(extra), 1, 1);
  auto rb = b.Run();
  ASSERT_FALSE(rb[0].ok());
  EXPECT_NE(rb[0].status().message().find("table id 7 is not used"), std::string::npos)
      << rb[0].status().ToString();
}

}  // namespace
}  // namespace fleet::worker
