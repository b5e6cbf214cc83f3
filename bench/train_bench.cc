// train_bench: training throughput of the PS worker and of the dense models,
// each beside a reference measured in the same run.
//
//   1. ctr_dnn worker step (pull, pool, forward, backward, unpool, push)
//      through a communicator that keeps the parameters in local memory (no
//      PS, no network: "compute only"), at 1 and 2 BLAS threads, each
//      against its GEMM floor: the same GEMMs (shapes recorded from one step
//      of the model) timed alone with the same BLAS and thread count, step
//      and floor alternating. Target: step <= 1.3x floor. Then the step
//      against 2 parameter servers in this process (sync mode, 1 worker, real
//      ZeroMQ over loopback) vs compute only: target >= 0.6.
//   2. MLP 784-128-128-10 step (forward, backward, Adam), batch 64, against
//      its GEMM floor (target <= 1.3x); the real training loop on real data
//      (collective/train_loop.h over the MLP classifier task, 1 rank: batch gather, step,
//      timing) against the bare step, alternating in rounds (target >= 0.95 of its samples/s).
//   3. MNIST-MLP at 2 ranks vs 1 rank (bench/mnist_rounds.h; ranks are
//      threads here, each with its own Gloo group over loopback), samples/s
//      over all steps (target >= 1.2).
//
//   train_bench [--seconds=2] [--batch=256] [--lines=20000] [--cases=ctr,mlp,ranks]
//               [--mnist_steps=600] [--mnist_rounds=3] [--data_dir=...]
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <thread>

#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/mnist_rounds.h"
#include "comm/gloo_collective.h"
#include "comm/shm_collective.h"
#include "comm/kv_store.h"
#include "ps/server.h"
#include "worker/local_communicator.h"
#include "collective/mlp_classifier.h"
#include "collective/train_loop.h"
#include "data/ctr_generator.h"
#include "data/mnist.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/models/ctr_model.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"
#include "worker/communicator.h"
#include "worker/config.h"
#include "worker/task.h"
#include "trainer/kernels/cpu_backend.h"

DEFINE_double(seconds, 2.0, "Target seconds of timed iterations per case.");
DEFINE_int32(batch, 256, "ctr_dnn samples per step (one worker).");
DEFINE_int32(lines, 20000, "Synthetic CTR training lines generated for the ctr_dnn cases.");
DEFINE_int32(mlp_batch, 64, "MLP samples per step.");
DEFINE_string(cases, "ctr,ctr_ps,mlp,ranks",
              "Sections to run, comma separated: ctr (compute only vs GEMM floor, 1 and 2 "
              "threads), ctr_ps (against 2 in-process servers), mlp, ranks.");
DEFINE_int32(mnist_steps, 600, "MNIST training steps timed per configuration (loop and ranks).");
DEFINE_int32(mnist_rounds, 3, "MNIST configurations alternate this many times.");
DEFINE_string(data_dir, fleet::data::kDefaultMnistDir, "MNIST-format IDX files.");

namespace fleet::bench {
namespace {

// (a): parameters in local memory (worker/local_communicator.h).
using worker::LocalCommunicator;

std::string JobYaml(const std::string& data_dir, int batch) {
  return "Distributed: {mode: sync, timeout_ms: 60000}\n"
         "tables:\n"
         "  - {id: 0, kind: sparse, dim: 9, shard_num: 64, optimizer: {rule: adagrad, "
         "learning_rate: 0.15}}\n"
         "  - {id: 1, kind: dense, dim: 420401, optimizer: {rule: adam, learning_rate: 0.002}}\n"
         "model: {kind: ctr_dnn, sparse_table: 0, dense_table: 1, hidden: [400, 400, 400]}\n"
         "data: {train: " +
         data_dir +
         "/train}\n"
         "train: {batch_size: " +
         std::to_string(batch) + "}\n";
}

using trainer::CpuBackend;

// A step's GEMMs, recorded from one step of the model, run alone on buffers
// of their shapes.
class GemmFloor {
 public:
  explicit GemmFloor(std::vector<CpuBackend::GemmCall> calls) : calls_(std::move(calls)) {
    for (const CpuBackend::GemmCall& c : calls_) {
      a_.emplace_back(static_cast<size_t>(c.M) * c.K, 0.01f);
      b_.emplace_back(static_cast<size_t>(c.K) * c.N, 0.02f);
      c_.emplace_back(static_cast<size_t>(c.M) * c.N, 0.0f);
    }
  }
  void Run() {
    for (size_t i = 0; i < calls_.size(); ++i) {
      const CpuBackend::GemmCall& c = calls_[i];
      trainer::kernels::GemmBlas(c.trans_a, c.trans_b, c.M, c.N, c.K, 1.0f, a_[i].data(),
                                 b_[i].data(), c.beta, c_[i].data());
    }
  }
  size_t size() const { return calls_.size(); }
  double flops() const {
    double f = 0;
    for (const auto& c : calls_) f += 2.0 * c.M * c.N * c.K;
    return f;
  }

 private:
  std::vector<CpuBackend::GemmCall> calls_;
  std::vector<std::vector<float>> a_, b_, c_;
};

// Times `step` and `reference` alternately (one call each per iteration, so
// the machine's other load hits both alike) for about --seconds in total.
std::pair<Summary, Summary> TimePaired(const std::function<void()>& step,
                                       const std::function<void()>& reference) {
  const int n = IterationsFor([&] { step(), reference(); }, FLAGS_seconds);
  std::vector<double> a, b;
  for (int i = 0; i < n; ++i) {
    a.push_back(TimeEach(step, 1)[0]);
    b.push_back(TimeEach(reference, 1)[0]);
  }
  return {Summarize(a), Summarize(b)};
}

double SamplesPerSec(double micros, int batch) { return batch / (micros * 1e-6); }

// "step / floor: 1.21x at p50, 1.18x at min (target <= 1.3: ok)".
void PrintFloorRatio(const Summary& step, const Summary& floor) {
  const double r = step.p50 / floor.p50;
  std::printf("  step / GEMM floor: %.2fx at p50 (%s), %.2fx at min\n", r,
              r <= 1.3 ? "ok, target <= 1.3" : "ABOVE TARGET 1.3", step.min / floor.min);
}

// The GEMMs of one ctr_dnn forward + backward at batch B, from a model of
// the same shape as the worker's.
GemmFloor CtrDnnGemms(const trainer::CtrModelConfig& config, int B) {
  CpuBackend backend;
  auto model = trainer::CtrModel::Create(config, &backend);
  CHECK(model.ok()) << model.status().ToString();
  const int S = config.num_slots, D = config.embedding_dim;
  std::vector<float> pooled(static_cast<size_t>(S) * B * D, 0.1f),
      dense(static_cast<size_t>(B) * config.num_dense, 0.5f), labels(B, 1.0f);
  std::vector<CpuBackend::GemmCall> calls;
  backend.RecordGemms(&calls);
  CHECK(model.value()->Forward(pooled, dense, labels).ok());
  model.value()->Backward();
  backend.RecordGemms(nullptr);
  return GemmFloor(std::move(calls));
}

void CtrDnnCases(bool floor_cases, bool server_case) {
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

  int64_t full = task.value()->num_train_batches();
  if (task.value()->batch_samples(full - 1) < static_cast<size_t>(FLAGS_batch)) --full;
  CHECK_GT(full, 0) << "--lines must give at least one full batch";
  int64_t next = 0;
  auto step_through = [&](worker::Communicator& comm) {
    Status s = task.value()->TrainStep(next, comm);
    CHECK(s.ok()) << s.ToString();
    next = (next + 1) % full;
  };

  // (a) compute only. Verify once: a step gives a finite loss sum.
  LocalCommunicator local(9, task.value()->dense_param_count());
  CHECK(task.value()->TrainStep(0, local).ok());
  const auto sums = task.value()->TakeTrainSums();
  CHECK(std::isfinite(sums[0]) && sums[1] == static_cast<float>(task.value()->batch_samples(0)));

  trainer::CtrModelConfig mc;
  mc.hidden = {400, 400, 400};
  GemmFloor floor = CtrDnnGemms(mc, FLAGS_batch);
  std::printf(
      "\nctr_dnn worker step, batch %d, 26 slots x dim 9, FC 400-400-400 "
      "(420401 dense params = 1.6 MB pulled and pushed per step); GEMM floor = its %zu "
      "GEMMs alone (%.0f MFLOP)\n",
      FLAGS_batch, floor.size(), floor.flops() / 1e6);
  PrintHeader();
  double compute_only[3] = {};
  for (int threads : {1, 2}) {
    if (!floor_cases) break;
    trainer::kernels::SetBlasThreads(threads);
    auto [step, ref] = TimePaired([&] { step_through(local); }, [&] { floor.Run(); });
    PrintRow("(a) compute only, " + std::to_string(threads) + "T", step, 0);
    PrintRow("    GEMM floor, " + std::to_string(threads) + "T", ref, 0);
    PrintFloorRatio(step, ref);
    compute_only[threads] = SamplesPerSec(step.p50, FLAGS_batch);
  }
  if (floor_cases) {
    std::printf("  compute-only samples/s at p50: 1 thread %.0f, 2 threads %.0f (%.2fx)\n",
                compute_only[1], compute_only[2], compute_only[2] / compute_only[1]);
  }
  // One worker process per core in a real job: the rest at 1 BLAS thread.
  trainer::kernels::SetBlasThreads(1);
  if (!server_case) return;

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
  auto [b, a] = TimePaired([&] { step_through(*comm.value()); }, [&] { step_through(local); });
  PrintRow("(b) 2 local servers, sync", b, 2.0 * 420401 * 4);
  PrintRow("(a) compute only, 1T", a, 0);
  std::printf("  samples/s at p50: (a) %.0f  (b) %.0f  (b)/(a) = %.2f (target >= 0.6)\n",
              SamplesPerSec(a.p50, FLAGS_batch), SamplesPerSec(b.p50, FLAGS_batch), a.p50 / b.p50);
  for (auto& s : servers) CHECK(s->Shutdown(false).ok());
}

// The bare MLP training step of the MNIST task's model and optimizer (forward,
// backward, Adam) on fixed host batches.
class BareMlpStep {
 public:
  BareMlpStep(trainer::CpuBackend::GemmKind kind, int B) : backend_(nullptr, kind) {
    x_.resize(static_cast<size_t>(B) * 784);
    labels_.resize(B);
    for (size_t i = 0; i < x_.size(); ++i)
      x_[i] = static_cast<float>((i * 2654435761u) % 256) / 255.0f;
    for (int i = 0; i < B; ++i) labels_[i] = i % 10;
    auto model = trainer::Mlp::Create({}, &backend_);
    CHECK(model.ok());
    model_ = std::move(model).value();
    adam_ = std::make_unique<trainer::Adam>(&model_->arena(), trainer::kernels::AdamHyper{});
  }
  float Step() {
    model_->arena().ZeroGrad();
    auto loss = model_->Forward(x_, labels_);
    CHECK(loss.ok());
    model_->Backward();
    adam_->Step();
    return *loss;
  }
  trainer::CpuBackend& backend() { return backend_; }

 private:
  trainer::CpuBackend backend_;
  std::unique_ptr<trainer::Mlp> model_;
  std::unique_ptr<trainer::Adam> adam_;
  std::vector<float> x_;
  std::vector<int32_t> labels_;
};

void MlpCases() {
  const int B = FLAGS_mlp_batch;
  trainer::kernels::SetBlasThreads(1);
  BareMlpStep blas(trainer::CpuBackend::GemmKind::kBlas, B);
  {
    // Verify: OpenBLAS and the naive GEMM give the same first loss.
    BareMlpStep naive(trainer::CpuBackend::GemmKind::kNaive, B);
    const float lb = blas.Step(), ln = naive.Step();
    CHECK_LT(std::abs(lb - ln), 1e-4) << lb << " vs " << ln;
  }
  std::vector<CpuBackend::GemmCall> calls;
  blas.backend().RecordGemms(&calls);
  blas.Step();
  blas.backend().RecordGemms(nullptr);
  GemmFloor floor(std::move(calls));
  auto [step, ref] = TimePaired([&] { blas.Step(); }, [&] { floor.Run(); });
  std::printf(
      "\nMLP 784-128-128-10 training step (forward, backward, Adam), batch %d, OpenBLAS "
      "threads 1; GEMM floor = its %zu GEMMs alone (%.1f MFLOP)\n",
      B, floor.size(), floor.flops() / 1e6);
  PrintHeader();
  PrintRow("MLP step", step, 0);
  PrintRow("    GEMM floor", ref, 0);
  PrintFloorRatio(step, ref);

  // The real loop (1 rank, real data) vs the bare step, in alternating rounds.
  auto data = data::LoadMnistData(data::MnistFilesIn(FLAGS_data_dir));
  CHECK(data.ok()) << data.status().ToString();
  const int rounds = std::max(1, FLAGS_mnist_rounds);
  const int steps = std::max(1, FLAGS_mnist_steps / rounds);
  constexpr int kWarmup = 20;
  std::vector<double> loop_us, bare_us;
  for (int r = 0; r < rounds; ++r) {
    trainer::CpuBackend backend;
    auto task =
        trainer::collective::MlpClassifierTask::Create({}, data->train, data->test, &backend);
    CHECK(task.ok()) << task.status().ToString();
    trainer::collective::TrainLoopOptions o;  // Adam, lr 1e-3
    o.batch_size = 64;
    o.epochs = 1000;
    o.max_steps = steps + kWarmup;
    o.log_every_steps = 0;
    o.evaluate = false;
    auto report = trainer::collective::RunTrainLoop(o, **task, nullptr, nullptr);
    CHECK(report.ok()) << report.status().ToString();
    CHECK_LT(report->step_losses.back(), 0.8f * report->step_losses.front());
    loop_us.insert(loop_us.end(), report->step_micros.begin() + kWarmup, report->step_micros.end());
    BareMlpStep bare(trainer::CpuBackend::GemmKind::kBlas, 64);
    for (int i = 0; i < kWarmup; ++i) bare.Step();
    const std::vector<double> t = TimeEach([&] { bare.Step(); }, steps);
    bare_us.insert(bare_us.end(), t.begin(), t.end());
  }
  const double loop_total = std::accumulate(loop_us.begin(), loop_us.end(), 0.0);
  const double bare_total = std::accumulate(bare_us.begin(), bare_us.end(), 0.0);
  std::printf(
      "\nMNIST-MLP training loop (RunTrainLoop, 1 rank, %s) vs the bare step, batch 64, "
      "%d rounds x %d steps\n",
      FLAGS_data_dir.c_str(), rounds, steps);
  PrintHeader();
  PrintRow("loop step", Summarize(loop_us), 0);
  PrintRow("bare step", Summarize(bare_us), 0);
  const double ratio = bare_total / loop_total;
  std::printf("  samples/s over all steps: loop %.0f, bare %.0f, loop/bare = %.3f (%s)\n",
              64.0 * loop_us.size() / loop_total * 1e6, 64.0 * bare_us.size() / bare_total * 1e6,
              ratio, ratio >= 0.95 ? "ok, target >= 0.95" : "BELOW TARGET 0.95");
}

// MNIST-MLP at 1 and 2 ranks, the ranks as threads with their own Gloo and
// shared-memory groups.
void RankCases() {
  auto data = data::LoadMnistData(data::MnistFilesIn(FLAGS_data_dir));
  CHECK(data.ok()) << data.status().ToString();
  KvStoreServer kv(KvStoreServerOptions{});
  CHECK(kv.Start().ok());
  const int rounds = std::max(1, FLAGS_mnist_rounds);
  const int steps = std::max(1, FLAGS_mnist_steps / rounds);
  std::vector<MnistRow> rows[2] = {DefaultMnistRows(), DefaultMnistRows()};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      KvStoreClient client(kv.endpoint(), "train_bench");
      auto group = GlooCollective::Create(
          client, GroupOptions<GlooCollectiveOptions>("train_bench/mnist", r, 2));
      CHECK(group.ok()) << group.status().ToString();
      auto shm = ShmCollective::Create(
          client, GroupOptions<ShmCollectiveOptions>("train_bench/mnist", r, 2));
      CHECK(shm.ok()) << shm.status().ToString();
      RunMnistRounds(r, **group, **shm, *data, rounds, steps, &rows[r]);
    });
  }
  for (auto& t : ranks) t.join();
  std::printf("\n");
  PrintMnistRows(rows[0], rounds, steps, /*target=*/1.2);
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // keep the servers' start-up lines out of the table
  fleet::bench::PrintEnvironment("train_bench");
  const std::vector<std::string> cases = absl::StrSplit(FLAGS_cases, ',', absl::SkipEmpty());
  auto wanted = [&](const char* name) {
    return std::find(cases.begin(), cases.end(), name) != cases.end();
  };
  if (wanted("ctr") || wanted("ctr_ps")) fleet::bench::CtrDnnCases(wanted("ctr"), wanted("ctr_ps"));
  if (wanted("mlp")) fleet::bench::MlpCases();
  if (wanted("ranks")) fleet::bench::RankCases();
  return 0;
}
