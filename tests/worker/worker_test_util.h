// Runs a whole PS job inside the test process: S PsServers on free ports, a
// KV store for the workers' metrics group, and W RunPsWorker calls on W
// threads. Also makes small synthetic CTR data sets.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm/kv_store.h"
#include "ps/server.h"
#include "tests/ps/ps_cluster.h"
#include "trainer/data/ctr_generator.h"
#include "worker/app.h"

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

// Servers (kept after Run so tests can read the tables) and workers.
class InProcessJob {
 public:
  InProcessJob(ps::JobConfig job, int num_servers, int num_workers)
      : job_(std::move(job)), num_workers_(num_workers) {
    cluster_ = std::make_unique<ps::testing::PsCluster>(job_, num_servers, num_workers);
    kv_ = std::make_unique<KvStoreServer>(KvStoreServerOptions{});
    CHECK(kv_->Start().ok());
  }

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
        results[w] = RunPsWorker(o);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  ps::PsClient& client() { return cluster_->client(0); }

 private:
  ps::JobConfig job_;
  int num_workers_;
  std::unique_ptr<ps::testing::PsCluster> cluster_;
  std::unique_ptr<KvStoreServer> kv_;
  std::atomic<int> run_{0};
};

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
