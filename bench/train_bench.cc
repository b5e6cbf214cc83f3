// train_bench: training throughput of the PS worker and of our kernels, each
// beside a reference measured in the same run.
//
//   ctr_dnn worker step (pull, pool, forward, backward, push), samples/s:
//     (a) compute only: the same step through a communicator that keeps the
//         parameters in local memory (no PS, no network);
//     (b) against 2 parameter servers in this process (sync mode, 1 worker,
//         real ZeroMQ over loopback). Target: (b)/(a) >= 0.6.
//   MLP (784-128-128-10) training step, samples/s: OpenBLAS GEMM vs the
//   naive triple-loop GEMM (CpuBackend::GemmKind::kNaive).
//
//   train_bench [--seconds=2] [--batch=256] [--lines=20000]
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <unordered_map>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "bench/bench_util.h"
#include "ps/server.h"
#include "trainer/data/ctr_generator.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"
#include "worker/communicator.h"
#include "worker/config.h"
#include "worker/task.h"

DEFINE_double(seconds, 2.0, "Target seconds of timed iterations per case.");
DEFINE_int32(batch, 256, "ctr_dnn samples per step (one worker).");
DEFINE_int32(lines, 20000, "Synthetic CTR training lines generated for the ctr_dnn cases.");
DEFINE_int32(mlp_batch, 64, "MLP samples per step.");

namespace fleet::bench {
namespace {

using worker::Communicator;
using worker::PullRequest;
using worker::PushRequest;

// (a): parameters in local memory, rows created on first use; Push applies
// plain SGD so the step does the same amount of memory traffic as a real one.
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(size_t dim, size_t dense) : dim_(dim), dense_(dense, 0.01f) {}
  Status Pull(const PullRequest& r) override {
    for (size_t i = 0; i < r.sparse_keys.size(); ++i) {
      auto& row = rows_[r.sparse_keys[i]];
      row.resize(dim_, 0.001f);
      std::copy(row.begin(), row.end(), r.sparse_values.begin() + i * dim_);
    }
    if (!r.dense_values.empty()) std::copy(dense_.begin(), dense_.end(), r.dense_values.begin());
    return Status::OK();
  }
  Status Push(const PushRequest& r) override {
    for (size_t i = 0; i < r.sparse_keys.size(); ++i) {
      auto& row = rows_[r.sparse_keys[i]];
      for (size_t j = 0; j < dim_; ++j) row[j] -= 0.01f * r.sparse_grads[i * dim_ + j];
    }
    for (size_t j = 0; j < r.dense_grads.size(); ++j) dense_[j] -= 0.001f * r.dense_grads[j];
    return Status::OK();
  }
  Status Flush() override { return Status::OK(); }
  double GradientScale(size_t) const override { return 1.0; }
  const char* name() const override { return "local"; }

 private:
  const size_t dim_;
  std::vector<float> dense_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
};

std::string JobYaml(const std::string& data_dir, int batch) {
  return "Distributed: {mode: sync, timeout_ms: 60000}\n"
         "tables:\n"
         "  - {id: 0, kind: sparse, dim: 9, shard_num: 64, optimizer: {rule: adagrad, learning_rate: 0.15}}\n"
         "  - {id: 1, kind: dense, dim: 420401, optimizer: {rule: adam, learning_rate: 0.002}}\n"
         "model: {kind: ctr_dnn, sparse_table: 0, dense_table: 1, hidden: [400, 400, 400]}\n"
         "data: {train: " + data_dir + "/train}\n"
         "train: {batch_size: " + std::to_string(batch) + "}\n";
}

// Times task steps (cycling over its full batches) through `comm`.
Summary TimeSteps(worker::WorkerTask& task, Communicator& comm) {
  int64_t full = task.num_train_batches();
  if (task.batch_samples(full - 1) < static_cast<size_t>(FLAGS_batch)) --full;  // short last one
  CHECK_GT(full, 0) << "--lines must give at least one full batch";
  int64_t next = 0;
  auto step = [&] {
    Status s = task.TrainStep(next, comm);
    CHECK(s.ok()) << s.ToString();
    next = (next + 1) % full;
  };
  return Summarize(TimeEach(step, IterationsFor(step, FLAGS_seconds)));
}

double SamplesPerSec(const Summary& s, int batch) { return batch / (s.p50 * 1e-6); }

void CtrDnnCases() {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "fleet_train_bench_ctr").string();
  data::CtrGeneratorOptions g;
  g.out_dir = dir;
  g.train_files = 1;
  g.test_files = 1;
  g.lines_per_file = FLAGS_lines;
  auto gen = data::GenerateCtrData(g);
  CHECK(gen.ok()) << gen.status().ToString();

  auto job = ps::ParseJobConfig(YAML::Load(JobYaml(dir, FLAGS_batch)));
  CHECK(job.ok()) << job.status().ToString();
  auto config = worker::ParseWorkerConfig(job->root);
  CHECK(config.ok()) << config.status().ToString();
  auto task = worker::CreateWorkerTask(config.value(), job.value(), {});
  CHECK(task.ok()) << task.status().ToString();
  CHECK_EQ(task.value()->dense_param_count(), 420401u);

  // (a) compute only. Verify once: a step gives a finite loss sum.
  LocalCommunicator local(9, task.value()->dense_param_count());
  CHECK(task.value()->TrainStep(0, local).ok());
  const auto sums = task.value()->TakeTrainSums();
  CHECK(std::isfinite(sums[0]) && sums[1] == static_cast<float>(task.value()->batch_samples(0)));
  const Summary a = TimeSteps(*task.value(), local);

  // (b) 2 in-process servers, sync mode.
  std::vector<std::unique_ptr<ps::PsServer>> servers;
  std::vector<std::string> endpoints;
  for (int s = 0; s < 2; ++s) {
    ps::PsServerOptions o;
    o.rank = s;
    o.num_servers = 2;
    o.num_workers = 1;
    o.job = job.value();
    auto server = ps::PsServer::Create(o);
    CHECK(server.ok()) << server.status().ToString();
    auto bound = server.value()->Start();
    CHECK(bound.ok()) << bound.status().ToString();
    endpoints.push_back(bound.value());
    servers.push_back(std::move(server).value());
  }
  ps::PsClientOptions co;
  co.servers = endpoints;
  auto client = ps::PsClient::Create(co, job.value());
  CHECK(client.ok());
  CHECK(client.value()->InitDense(1, task.value()->InitialDenseParams()).ok());
  worker::CommunicatorOptions copts;
  copts.sparse_table = 0;
  copts.dense_table = 1;
  copts.batch_size = FLAGS_batch;
  auto comm = worker::CreateCommunicator(client.value().get(), copts);
  CHECK(comm.ok()) << comm.status().ToString();
  // Verify once: a step through the servers changes the dense table.
  std::vector<float> before(420401), after(420401);
  CHECK(client.value()->PullDense(1, before).ok());
  CHECK(task.value()->TrainStep(0, *comm.value()).ok());
  CHECK(client.value()->PullDense(1, after).ok());
  CHECK(before != after) << "a synced step left the dense table unchanged";
  const Summary b = TimeSteps(*task.value(), *comm.value());

  std::printf("\nctr_dnn worker step, batch %d, 26 slots x dim 9, FC 400-400-400 "
              "(420401 dense params = 1.6 MB pulled and pushed per step)\n",
              FLAGS_batch);
  PrintHeader();
  PrintRow("(a) compute only", a, 0);
  PrintRow("(b) 2 local servers, sync", b, 2.0 * 420401 * 4);
  std::printf("samples/s: (a) %.0f  (b) %.0f  (b)/(a) = %.2f (target >= 0.6)\n",
              SamplesPerSec(a, FLAGS_batch), SamplesPerSec(b, FLAGS_batch),
              SamplesPerSec(b, FLAGS_batch) / SamplesPerSec(a, FLAGS_batch));
  for (auto& s : servers) CHECK(s->Shutdown(false).ok());
}

void MlpCases() {
  const int B = FLAGS_mlp_batch;
  std::vector<float> x(static_cast<size_t>(B) * 784);
  std::vector<int32_t> labels(B);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 256) / 255.0f;
  for (int i = 0; i < B; ++i) labels[i] = i % 10;

  auto run = [&](trainer::CpuBackend::GemmKind kind, float* first_loss) {
    trainer::CpuBackend backend(nullptr, kind);
    auto model = trainer::Mlp::Create({}, &backend);
    CHECK(model.ok());
    trainer::Mlp& m = *model.value();
    auto step = [&] {
      m.arena().ZeroGrad();
      auto loss = m.Forward(x, labels);
      CHECK(loss.ok());
      m.Backward();
      backend.SgdUpdate(m.arena().params().data(), m.arena().grads().data(), m.arena().size(),
                        0.01f, 0.0f);
    };
    m.arena().ZeroGrad();
    *first_loss = m.Forward(x, labels).value();
    return Summarize(TimeEach(step, IterationsFor(step, FLAGS_seconds)));
  };
  float loss_blas = 0, loss_naive = 0;
  const Summary blas = run(trainer::CpuBackend::GemmKind::kBlas, &loss_blas);
  const Summary naive = run(trainer::CpuBackend::GemmKind::kNaive, &loss_naive);
  // Verify: both GEMMs give the same first loss from the same initialisation.
  CHECK_LT(std::abs(loss_blas - loss_naive), 1e-4) << loss_blas << " vs " << loss_naive;

  std::printf("\nMLP 784-128-128-10 training step (forward, backward, SGD), batch %d, "
              "OpenBLAS threads %d\n", B, trainer::kernels::BlasThreads());
  PrintHeader();
  PrintRow("OpenBLAS GEMM", blas, 0);
  PrintRow("naive triple-loop GEMM", naive, 0);
  std::printf("samples/s: OpenBLAS %.0f  naive %.0f  speed-up %.1fx\n", SamplesPerSec(blas, B),
              SamplesPerSec(naive, B), SamplesPerSec(blas, B) / SamplesPerSec(naive, B));
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // keep the servers' start-up lines out of the table
  fleet::bench::PrintEnvironment("train_bench");
  // One worker process on this machine: one BLAS thread, as ps_worker runs
  // (train.blas_threads), so (a) and (b) compare the same compute.
  fleet::trainer::kernels::SetBlasThreads(1);
  fleet::bench::CtrDnnCases();
  fleet::bench::MlpCases();
  return 0;
}
