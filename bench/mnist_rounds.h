// MNIST-MLP training throughput at 1 and 2 ranks, shared by collective_bench
// (ranks are processes) and train_bench (ranks are threads of one process).
//
// Each configuration ("row") runs steps of the real training loop
// (collective/train_loop.h over the MLP classifier task: batch
// gather, forward, backward, bucketed all-reduce overlapped with backward,
// Adam) with batch 64 per rank. The rows
// alternate over several rounds so that changes in the machine's other load
// hit each alike; each round's first 20 steps (allocation, page faults) are
// not timed, and each round must lower the loss (the check before trusting
// the time).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "data/mnist.h"

namespace fleet::bench {

struct MnistRow {
  std::string label;
  int ranks = 1;  // ranks training (rank 1 waits while a 1-rank row runs)
  int blas_threads = 1;
  size_t bucket_bytes = 0;
  bool shm = false;  // over the shared-memory group instead of Gloo's
  std::vector<double> micros;  // step times of every round, warm-up dropped
};

// 1 rank with 1 BLAS thread, 1 rank with a BLAS thread per core, 2 ranks
// with 1 BLAS thread each over Gloo with the default bucket size and with
// 64 KiB buckets, and 2 ranks over shared memory (comm/shm_collective.h).
std::vector<MnistRow> DefaultMnistRows();

// The fields the Gloo and shared-memory group options share (comm/
// gloo_collective.h, comm/shm_collective.h), for rank `rank` of `size`.
template <typename Options>
Options GroupOptions(const std::string& group, int rank, int size,
                     std::chrono::milliseconds timeout = Options{}.timeout) {
  Options o;
  o.group = group;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  return o;
}

// Runs `rounds` rounds of every row on this rank of `gloo` and `shm` (the
// same 2 ranks as two groups), `steps` timed steps per row and round,
// appending step times to each row. LOG(FATAL)s on any error (a benchmark
// has no one to return it to).
void RunMnistRounds(int rank, Collective& gloo, Collective& shm, const data::MnistData& data,
                    int rounds, int steps, std::vector<MnistRow>* rows);

// samples/s over all steps, at the p50 and at the min step time.
struct MnistFigures {
  double all = 0, p50 = 0, min = 0;
};
MnistFigures FiguresOf(const MnistRow& row);

// Prints the table and the best-2-ranks over best-1-rank line, and returns
// those ratios (target: `target` over all steps).
MnistFigures PrintMnistRows(const std::vector<MnistRow>& rows, int rounds, int steps,
                            double target);

}  // namespace fleet::bench
