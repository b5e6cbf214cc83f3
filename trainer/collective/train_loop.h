// The collective training loop, once for every model: data-parallel
// training of a CollectiveTask (trainer/collective/task.h) over any
// Collective (Gloo on CPUs, NCCL on GPUs) or none (one process). The
// examples (mnist_mlp, ...) are thin programs over RunTrainLoop; tests and
// benchmarks drive it in-process.
//
// Sample order. Epoch e visits the training samples in one permutation drawn
// from (shuffle_seed, e), identical on every rank. Step s of the epoch uses
// the global batch order[s*G, (s+1)*G), G = batch_size * world_size, and
// rank r takes its slice order[s*G + r*B, s*G + (r+1)*B). So W ranks with
// batch B see exactly the samples (and, after the mean all-reduce, the
// gradient) of one rank with batch W*B. The last N mod G samples of each
// epoch are skipped.
//
// Data position and checkpoints. The position in the data is a function of
// the global step alone (epoch = step / steps_per_epoch, batch = step mod
// steps_per_epoch) once the data layout is fixed: number of training
// samples, global batch and shuffle seed. Rank 0 saves into checkpoint_dir
//   <task name>.ckpt  params + optimizer state + step (trainer/checkpoint.h)
//   data_position     the data layout and the position reached (text)
// data_position is written (atomically) first, then the checkpoint; a crash
// in between leaves the older checkpoint, whose step the unchanged layout
// still places exactly. On start, rank 0 loads both when the checkpoint
// exists, refuses a layout that differs from the run's (FailedPrecondition
// naming the key), and every rank takes rank 0's params, optimizer state and
// step (DataParallel::SyncFromRoot): a resumed run continues with exactly the
// losses of an uninterrupted one. Only rank 0 needs to see checkpoint_dir.
//
// Output (to `progress`; lines of rank 0 are what fleetrun shows):
//   every log_every_steps steps, options.progress_line of the window since
//   the previous line (DefaultProgressLine:
//     "epoch: E, step: S, train_loss: L, speed: X steps/s"),
//   after each epoch when options.evaluate:
//     "epoch: E, <eval_metric_name>: M"
// E counts from 0, S is the global step, L the mean loss over all ranks.
//
// Where the loop is meant to grow (one place each in train_loop.cc, so that
// models never copy it; none of these is built yet beyond what is said):
//   * several micro-batches per step: TrainStep would call LoadBatch and
//     ForwardBackward once per micro-batch (gradients add up), passing
//     grad_ready only with the last, before the one all-reduce and update;
//   * evaluation and saving on other schedules (e.g. every N steps): the
//     conditions in Run's step loop;
//   * another log line (e.g. FleetX's): options.progress_line, whose
//     ProgressWindow already carries the global batch and the learning rate;
//   * state beyond params + optimizer + step (e.g. RNG state): written
//     beside data_position by Save, read back by ResumeAndSync;
//   * a different all-reduce + update (e.g. a sharded optimizer): Update.
//
// Thread safety: RunTrainLoop may run on several threads at once (one per
// rank, each with its own task, Collective and backend).
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/collective/task.h"
#include "trainer/data_parallel.h"
#include "trainer/optimizer.h"

namespace fleet::trainer::collective {

// What a progress line reports: the steps since the previous line.
struct ProgressWindow {
  int64_t epoch = 0;         // of the last step, from 0
  int64_t step = 0;          // global steps done
  double loss = 0;           // mean loss of the window's steps over all ranks
  int64_t steps = 0;         // steps in the window
  double seconds = 0;        // wall time of the window (evaluation excluded)
  int64_t global_batch = 0;  // samples per step over all ranks
  float learning_rate = 0;   // the optimizer's at the last step
};

// "epoch: E, step: S, train_loss: L, speed: X steps/s" (L with 6 decimals,
// X with 2).
std::string DefaultProgressLine(const ProgressWindow& window);

struct TrainLoopOptions {
  // Passes over the training samples. The run stops earlier at max_steps.
  int epochs = 1;
  // Samples per step on each rank; the global batch is batch_size x ranks.
  // Larger batches run more samples/s but need more epochs or a larger
  // learning rate for the same accuracy.
  int batch_size = 64;
  // Seed of the per-epoch sample order (the same on every rank).
  uint64_t shuffle_seed = 1;
  // Stop once the global step reaches this; 0 = run every epoch.
  int64_t max_steps = 0;
  // Print the progress line every this many steps (0 = never).
  int log_every_steps = 200;
  // Evaluate (task.EvalSums over all ranks) after each epoch.
  bool evaluate = true;
  // Save/resume here (see the top of this file); empty = no checkpoints.
  std::string checkpoint_dir;
  // Also save every this many steps (0 = only at the end of each epoch and
  // of the run).
  int64_t checkpoint_every_steps = 0;
  // The optimizer over task.arena() (trainer/optimizer.h; default Adam, lr
  // 1e-3).
  OptimizerConfig optimizer;
  DataParallelOptions data_parallel;
  // Formats each progress line; DefaultProgressLine unless replaced.
  std::function<std::string(const ProgressWindow&)> progress_line = DefaultProgressLine;
  // Called after every completed step with the global step reached; a
  // non-OK status ends the run with it. For tests and fault injection.
  std::function<Status(int64_t step)> after_step;
};

struct TrainReport {
  int64_t start_step = 0;  // step resumed from (0 for a fresh run)
  int64_t end_step = 0;    // step reached
  int64_t steps_per_epoch = 0;
  // This rank's loss of each step run, steps start_step+1 .. end_step.
  std::vector<float> step_losses;
  // Wall time of each of those steps (load, forward, backward, all-reduce,
  // update), microseconds.
  std::vector<double> step_micros;
  // The task's evaluation metric over all ranks after each epoch completed
  // in this run (MNIST: test accuracy).
  std::vector<double> eval_metric;
  // The final parameters (identical on every rank), host copy.
  std::vector<float> params;
};

// Trains `task` as described at the top of this file. `collective` is null
// for a single process, else this rank's group (not owned); `progress` (may
// be null) receives the lines above. Every rank must call it with the same
// options and a task of the same model and data. Blocks until done; each
// wait on a peer is bounded by the Collective's timeout and
// options.data_parallel.timeout. Returns InvalidArgument for bad options or
// too few samples for one global batch, the optimizer's InvalidArgument, the
// checkpoint errors of trainer/checkpoint.h, FailedPrecondition for a
// checkpoint of another data layout, the task's errors, and any error of the
// data-parallel helper (naming the rank and operation).
Result<TrainReport> RunTrainLoop(const TrainLoopOptions& options, CollectiveTask& task,
                                 Collective* collective, std::ostream* progress);

}  // namespace fleet::trainer::collective
