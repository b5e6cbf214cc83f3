#include "bench/mnist_rounds.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "trainer/backend.h"
#include "collective/mlp_classifier.h"
#include "collective/train_loop.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::bench {
namespace {

constexpr int kBatch = 64;
constexpr int kWarmupSteps = 20;

#define MNIST_CHECK_OK(rank, expr)                                            \
  do {                                                                        \
    ::fleet::Status _st = (expr);                                             \
    if (!_st.ok()) LOG(FATAL) << "rank " << (rank) << ": " << _st.ToString(); \
  } while (0)

// Runs `steps` timed training steps (after the warm-up) of `row` on this
// rank and appends their times. Ranks >= row.ranks sit it out.
void TrainSteps(int rank, Collective& group, const data::MnistData& data, int steps,
                MnistRow* row) {
  if (rank >= row->ranks) return;
  trainer::kernels::SetBlasThreads(row->blas_threads);
  trainer::CpuBackend backend;
  auto task = trainer::collective::MlpClassifierTask::Create({}, data.train, data.test, &backend);
  MNIST_CHECK_OK(rank, task.status());
  trainer::collective::TrainLoopOptions options;  // Adam, lr 1e-3
  options.batch_size = kBatch;
  options.epochs = 1000;  // bounded by max_steps
  options.max_steps = steps + kWarmupSteps;
  options.log_every_steps = 0;
  options.evaluate = false;
  options.data_parallel.bucket_bytes = row->bucket_bytes;
  auto report = trainer::collective::RunTrainLoop(options, **task,
                                                  row->ranks > 1 ? &group : nullptr, nullptr);
  MNIST_CHECK_OK(rank, report.status());
  const float first = report->step_losses.front(), last = report->step_losses.back();
  if (!(last < 0.8f * first)) {
    LOG(FATAL) << row->label << ": loss went from " << first << " to " << last;
  }
  row->micros.insert(row->micros.end(), report->step_micros.begin() + kWarmupSteps,
                     report->step_micros.end());
}

}  // namespace

std::vector<MnistRow> DefaultMnistRows() {
  const size_t kDefaultBucket = trainer::DataParallelOptions{}.bucket_bytes;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return {
      {"1 rank, 1 BLAS thread", 1, 1, kDefaultBucket, false, {}},
      {absl::StrCat("1 rank, ", cores, " BLAS threads"), 1, cores, kDefaultBucket, false, {}},
      {"2 ranks, default bucket", 2, 1, kDefaultBucket, false, {}},
      {"2 ranks, 64KiB buckets", 2, 1, 64 << 10, false, {}},
      {"2 ranks, shared memory", 2, 1, kDefaultBucket, true, {}},
  };
}

void RunMnistRounds(int rank, Collective& gloo, Collective& shm, const data::MnistData& data,
                    int rounds, int steps, std::vector<MnistRow>* rows) {
  for (int round = 0; round < rounds; ++round) {
    for (MnistRow& row : *rows) {
      MNIST_CHECK_OK(rank, gloo.Barrier());  // the idle rank waits here
      TrainSteps(rank, row.shm ? shm : gloo, data, steps, &row);
    }
  }
  MNIST_CHECK_OK(rank, gloo.Barrier());
}

MnistFigures FiguresOf(const MnistRow& row) {
  const Summary summary = Summarize(row.micros);
  const double samples = double{kBatch} * row.ranks;
  const double total_s = std::accumulate(row.micros.begin(), row.micros.end(), 0.0) / 1e6;
  return {row.micros.size() * samples / total_s, samples * 1e6 / summary.p50,
          samples * 1e6 / summary.min};
}

MnistFigures PrintMnistRows(const std::vector<MnistRow>& rows, int rounds, int steps,
                            double target) {
  std::printf(
      "MNIST-MLP 784-128-128-10 training steps (batch %d per rank, Adam), %d rounds x %d "
      "steps each; per-step time and samples/s\n",
      kBatch, rounds, steps);
  PrintHeader();
  // Best samples/s per rank count.
  MnistFigures best[3];
  for (const MnistRow& row : rows) {
    const MnistFigures f = FiguresOf(row);
    PrintRow(row.label, Summarize(row.micros), 0);
    std::printf("  %-22s samples/s: %.0f over all steps, %.0f at p50, %.0f at min step time\n", "",
                f.all, f.p50, f.min);
    MnistFigures& b = best[row.ranks];
    b = {std::max(b.all, f.all), std::max(b.p50, f.p50), std::max(b.min, f.min)};
  }
  const MnistFigures ratio{best[2].all / best[1].all, best[2].p50 / best[1].p50,
                           best[2].min / best[1].min};
  std::printf(
      "  best 2 ranks / best 1 rank, samples/s: %.2fx over all steps (%s %.1f), %.2fx at "
      "p50, %.2fx at min\n\n",
      ratio.all, ratio.all >= target ? "ok, target" : "BELOW TARGET", target, ratio.p50, ratio.min);
  return ratio;
}

}  // namespace fleet::bench
