// Runs a whole PS job inside the test process: S PsServers on free ports, a
// KV store for the workers' metrics group, and W RunPsWorker calls on W
// threads. Also makes small synthetic CTR data sets.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/kv_store.h"
#include "ps/server.h"
#include "ps/job_config.h"
#include "ps/table/accessor.h"
#include "tests/ps/ps_cluster.h"
#include "tests/test_paths.h"
#include "data/ctr_generator.h"
#include "data/ctr_reader.h"
#include "comm/file_io.h"
#include "worker/app.h"
#include "worker/config.h"

namespace fleet::worker::testing {

// A fresh directory under the test temp dir, removed first if present.
inline std::string FreshDir(const std::string& name) {
  auto dir = std::filesystem::path(::testing::TempDir()) / ("fleet_worker_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Small CTR data: two training files and one held-out file of
// lines_per_file lines each.
inline data::CtrGeneratorReport MakeCtrData(const std::string& dir, int64_t lines_per_file) {
  data::CtrGeneratorOptions g;
  g.out_dir = dir;
  g.train_files = 2;
  g.test_files = 1;
  g.lines_per_file = lines_per_file;
  g.seed = 5;
  auto report = data::GenerateCtrData(g);
  CHECK(report.ok()) << report.status().ToString();
  return report.value();
}

// configs/ctr_dnn.yaml over the train and test files MakeCtrData wrote into
// `dir` (no oracle), and its worker section.
struct CtrJob {
  ps::JobConfig job;
  WorkerConfig config;
};
inline Result<CtrJob> LoadCtrJob(const std::string& dir) {
  FLEET_ASSIGN_OR_RETURN(
      ps::JobConfig job,
      ps::LoadJobConfig(fleet::testing::SourcePath("configs/ctr_dnn.yaml"),
                        {"data.train=" + dir + "/train", "data.test=" + dir + "/test",
                         "data.oracle="}));
  FLEET_ASSIGN_OR_RETURN(WorkerConfig config, ParseWorkerConfig(job.root));
  return CtrJob{std::move(job), std::move(config)};
}
// The data set of the AUC tests (150k training lines, 75k held out),
// generated once per process in FreshDir(name); give each test program its
// own name, ctest runs them in parallel.
inline const std::string& AucData(const std::string& name) {
  static const std::string dir = [&] {
    std::string d = FreshDir(name);
    MakeCtrData(d, 75000);
    return d;
  }();
  return dir;
}

inline double OracleAuc(const std::string& dir) {
  auto o = data::ReadOracleFile(dir + "/oracle.txt");
  CHECK(o.ok()) << o.status().ToString();
  return o->oracle_auc;
}

// Servers (kept after Run so tests can read the tables) and workers.
class InProcessJob {
 public:
  InProcessJob(ps::JobConfig job, int num_servers, int num_workers)
      : job_(std::move(job)), num_workers_(num_workers) {
    cluster_ = std::make_unique<ps::testing::PsCluster>(job_, num_servers, num_workers);
    kv_ = std::make_unique<KvStoreServer>(KvStoreServerOptions{});
    CHECK(kv_->Start().ok());
  }

  // PsWorkerOptions::tensorboard_dir of every worker (worker 0 writes).
  std::string tensorboard_dir;

  // Runs every worker to completion; returns their results in rank order.
  std::vector<Result<PsWorkerReport>> Run() {
    std::vector<Result<PsWorkerReport>> results(num_workers_, Status::Internal("not run"));
    std::vector<std::thread> threads;
    for (int w = 0; w < num_workers_; ++w) {
      threads.emplace_back([&, w] {
        PsWorkerOptions o;
        o.rank = w;
        o.num_workers = num_workers_;
        o.servers = cluster_->endpoints();
        o.kv_endpoint = num_workers_ > 1 ? kv_->endpoint() : "";
        o.job_id = "job" + std::to_string(run_++ / num_workers_);
        o.job = job_;
        o.heter_workers = heter_workers_;
        o.tensorboard_dir = tensorboard_dir;
        results[w] = RunPsWorker(o);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  // The KV store the workers of Run() meet in (their metrics rounds).
  std::string kv_endpoint() const { return kv_->endpoint(); }
  ps::PsClient& client() { return cluster_->client(0); }
  ps::testing::PsCluster& cluster() { return *cluster_; }
  const std::vector<std::string>& servers() const { return cluster_->endpoints(); }
  const ps::JobConfig& job() const { return job_; }
  // The workers of later Runs send their dense part to these heter workers
  // (tests/heter/heter_job.h starts them).
  void set_heter_workers(std::vector<std::string> endpoints) {
    heter_workers_ = std::move(endpoints);
  }

 private:
  ps::JobConfig job_;
  int num_workers_;
  std::unique_ptr<ps::testing::PsCluster> cluster_;
  std::unique_ptr<KvStoreServer> kv_;
  std::vector<std::string> heter_workers_;
  std::atomic<int> run_{0};
};

// Keys of every training line, for reading the whole sparse table.
inline std::vector<uint64_t> AllKeys(const std::string& dir) {
  auto files = data::ExpandFileSpec(dir + "/train");
  CHECK(files.ok());
  auto reader = data::CtrReader::Open(files.value(), {});
  CHECK(reader.ok());
  std::set<uint64_t> keys;
  data::CtrBatch b;
  while (reader.value()->Next(&b).value() > 0) {
    for (const auto& slot : b.slots) keys.insert(slot.keys.begin(), slot.keys.end());
  }
  return {keys.begin(), keys.end()};
}

// CTR accessor counts over a sparse table (table 0).
struct CtrCounts {
  double shows = 0, clicks = 0;
  uint64_t rows = 0, ext_rows = 0;
};

// What `epochs` passes over the training data show: each line's 26 keys
// once, clicked when the label is 1.
inline CtrCounts TrainLineCounts(const std::string& dir, int epochs) {
  auto files = data::ExpandFileSpec(dir + "/train");
  CHECK(files.ok());
  auto reader = data::CtrReader::Open(files.value(), {});
  CHECK(reader.ok());
  CtrCounts c;
  data::CtrBatch b;
  while (reader.value()->Next(&b).value() > 0) {
    for (float label : b.labels) {
      c.shows += data::kCriteoSlots * epochs;
      c.clicks += label * data::kCriteoSlots * epochs;
    }
  }
  return c;
}

// The counts the servers of `job` hold for every training key.
inline CtrCounts ServerCounts(InProcessJob& job, const std::string& dir) {
  CtrCounts c;
  for (uint64_t key : AllKeys(dir)) {
    for (int s = 0; s < job.cluster().num_servers(); ++s) {
      ps::SparseTable* t = job.cluster().server(s).sparse_table(0);
      if (!t->owned_shards().contains(t->sharder()(key))) continue;
      std::vector<float> row, ext;
      if (!t->DebugRow(key, &row, &ext)) continue;
      c.shows += row[ps::CtrAccessor::kShow];
      c.clicks += row[ps::CtrAccessor::kClick];
      ++c.rows;
      c.ext_rows += !ext.empty();
    }
  }
  return c;
}

// The job YAML for a small ctr_dnn: embedding dim 4, hidden [32, 16].
// Dense dim = (26*4+13)*32+32 + 32*16+16 + 16+1 = 3744+32+512+16+17 = 4321.
inline std::string SmallCtrYaml(const std::string& data_dir, const std::string& mode,
                                int batch_size, int epochs) {
  return "Distributed: {mode: " + mode + ", k_steps: 4, max_merge: 2, timeout_ms: 20000}\n"
         "tables:\n"
         "  - {id: 0, kind: sparse, dim: 4, shard_num: 8,\n"
         "     optimizer: {rule: adagrad, learning_rate: 0.15},\n"
         "     initializer: {kind: uniform, range: 0.01, seed: 3}}\n"
         "  - {id: 1, kind: dense, dim: 4321, optimizer: {rule: adam, learning_rate: 0.003}}\n"
         "model: {kind: ctr_dnn, sparse_table: 0, dense_table: 1, hidden: [32, 16], seed: 1}\n"
         "data: {train: " + data_dir + "/train, test: " + data_dir + "/test, oracle: " +
         data_dir + "/oracle.txt}\n"
         "train: {batch_size: " + std::to_string(batch_size) + ", epochs: " +
         std::to_string(epochs) + ", log_interval: 0}\n";
}

}  // namespace fleet::worker::testing
