// The collective training loop, once for every model: data-parallel
// training of a CollectiveTask (collective/task.h) over any
// Collective (Gloo on CPUs, NCCL on GPUs) or none (one process). The
// examples (mnist_mlp, ...) are thin programs over RunTrainLoop; tests and
// benchmarks drive it in-process.
//
// Sample order. Epoch e visits the training samples in one permutation drawn
// from (shuffle_seed, e), identical on every rank (or in order, without
// options.shuffle). Step s of the epoch uses
// the global batch order[s*G, (s+1)*G), G = batch_size * world_size, and
// rank r takes its slice order[s*G + r*B, s*G + (r+1)*B). So W ranks with
// batch B see exactly the samples (and, after the mean all-reduce, the
// gradient) of one rank with batch W*B. The last N mod G samples of each
// epoch are skipped.
//
// Micro-batches. With micro_batches k a rank's batch of a step is cut into
// k consecutive pieces of batch_size / k samples; each is loaded and run
// forward and backward with gradient scale 1/k, so the step's gradient is
// that of the whole batch (gradient accumulation) while only a micro-batch's
// activations are in memory.
//
// The update. What happens to the gradients and which optimizer state each
// rank holds is the GradientUpdater's (updater.h): by default a
// ReplicatedUpdater over options.optimizer (all-reduce, every rank the whole
// state); options.make_updater plugs in another, e.g. AdamW with its state
// sharded over the ranks (sharded_adamw.h). learning_rate_at, when set,
// gives the learning rate of each step (a schedule).
//
// Data position and checkpoints. The position in the data is a function of
// the global step alone (epoch = step / steps_per_epoch, batch = step mod
// steps_per_epoch) once the data layout is fixed: number of training
// samples, global batch and shuffle seed. The sample order is a pure function
// of (shuffle_seed, epoch), so the step is all the random state there is to
// restore. Into checkpoint_dir rank 0 writes
//   data_position     the data layout and the position reached (text)
// first (atomically), then the updater its own files (ReplicatedUpdater:
// rank 0's <task name>.ckpt, params + optimizer state + step, see
// trainer/checkpoint.h); a crash in between leaves the older checkpoint,
// whose step the unchanged layout still places exactly. On start, when the
// updater finds its checkpoint, rank 0 refuses a data layout that differs
// from the run's (FailedPrecondition naming the key), and the updater
// restores params, optimizer state and step on every rank: a resumed run
// continues with exactly the losses of an uninterrupted one. Which ranks
// must see checkpoint_dir is the updater's to say (ReplicatedUpdater: rank 0
// only).
//
// Output (to `progress`; lines of rank 0 are what fleetrun shows):
//   every log_every_steps steps, options.progress_line of the window since
//   the previous line (DefaultProgressLine:
//     "epoch: E, step: S, train_loss: L, speed: X steps/s"),
//   after each epoch when options.evaluate, and every eval_every_steps steps:
//     options.eval_line (default "epoch: E, <eval_metric_name>: M")
// E counts from 0, S is the global step, L the mean loss over all ranks.
//
// Thread safety: RunTrainLoop may run on several threads at once (one per
// rank, each with its own task, Collective and backend).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "comm/status.h"
#include "collective/task.h"
#include "collective/updater.h"
#include "collective/data_parallel.h"
#include "trainer/optimizer.h"
#include "data/tensorboard/event_writer.h"

namespace fleet::trainer::collective {

// What a progress line reports: the steps since the previous line.
struct ProgressWindow {
  int64_t epoch = 0;         // of the last step, from 0
  int64_t step = 0;          // global steps done
  int64_t batch = 0;         // the last step's index within its epoch, from 0 (FleetX's "batch")
  double loss = 0;           // mean loss of the window's steps over all ranks
  int64_t steps = 0;         // steps in the window
  double seconds = 0;        // wall time of the window (evaluation excluded)
  int64_t global_batch = 0;  // samples per step over all ranks
  float learning_rate = 0;   // the optimizer's at the last step
  double reader_seconds = 0;  // of `seconds`, this rank's time in LoadBatch
  // Ranks that read distinct data (the loop's group: dp x sharding; the
  // tensor- and pipeline-parallel ranks of one replica are one). FleetX's
  // get_data_world_size, which its per-replica ips divides by.
  int data_world_size = 1;
  std::optional<double> grad_norm;  // the updater's, at the last step (GradientUpdater::grad_norm)
  float loss_scale = 1;             // the updater's, for the next step
};

// An evaluation's result, for its line.
struct EvalWindow {
  int64_t epoch = 0;
  int64_t step = 0;
  double metric = 0;
  double seconds = 0;  // wall time of the evaluation
};

// "epoch: E, step: S, train_loss: L, speed: X steps/s" (L with 6 decimals,
// X with 2).
std::string DefaultProgressLine(const ProgressWindow& window);

struct TrainLoopOptions {
  // TensorBoard curves (data/tensorboard/event_writer.h), written by rank
  // 0 only; not owned, null = none. At each progress line: train/loss,
  // train/learning_rate, train/samples_per_sec, train/grad_norm (when the
  // updater measures it) and train/loss_scale (when not 1); at each
  // evaluation eval/<task's eval_metric_name>. progress_scalars and
  // eval_scalars (may be empty) add a task's own. A failed write prints one
  // warning line and stops the writing, not the training.
  tensorboard::ScalarSink* scalars = nullptr;
  std::function<Status(const ProgressWindow&, tensorboard::ScalarSink&)> progress_scalars;
  std::function<Status(const EvalWindow&, tensorboard::ScalarSink&)> eval_scalars;
  // Passes over the training samples. The run stops earlier at max_steps.
  int epochs = 1;
  // Samples per step on each rank; the global batch is batch_size x ranks.
  // Larger batches run more samples/s but need more epochs or a larger
  // learning rate for the same accuracy.
  int batch_size = 64;
  // Micro-batches per step (gradient accumulation, see the top): must
  // divide batch_size. More of them hold fewer activations at once and cost
  // more passes of small GEMMs.
  int micro_batches = 1;
  // Seed of the per-epoch sample order (the same on every rank).
  uint64_t shuffle_seed = 1;
  // False: every epoch visits the samples in id order (a dataset that
  // shuffles itself, e.g. Megatron's, whose sampler reads it in order).
  bool shuffle = true;
  // Stop once the global step reaches this; 0 = run every epoch.
  int64_t max_steps = 0;
  // Print the progress line every this many steps (0 = never).
  int log_every_steps = 200;
  // Evaluate (task.EvalSums over all ranks) after each epoch.
  bool evaluate = true;
  // Also evaluate every this many steps (0 = only after epochs).
  int64_t eval_every_steps = 0;
  // Save/resume here (see the top of this file); empty = no checkpoints.
  std::string checkpoint_dir;
  // Resume from this directory instead of checkpoint_dir (FleetX's
  // Engine.save_load.ckpt_dir beside output_dir); empty = checkpoint_dir.
  std::string resume_dir;
  // Also save every this many steps (0 = only at the end of each epoch and
  // of the run).
  int64_t checkpoint_every_steps = 0;
  // The optimizer over task.arena() (trainer/optimizer.h; default Adam, lr
  // 1e-3), used by the default updater.
  OptimizerConfig optimizer;
  DataParallelOptions data_parallel;
  // Makes the updater for the task's arena and this rank's group (may be
  // null); empty: a ReplicatedUpdater over `optimizer` and data_parallel.
  std::function<Result<std::unique_ptr<GradientUpdater>>(ParamArena*, Collective*)> make_updater;
  // The learning rate of the step taken after `step` steps; empty: the
  // updater's own, unchanged.
  std::function<float(int64_t step)> learning_rate_at;
  // Formats each progress line; DefaultProgressLine unless replaced.
  std::function<std::string(const ProgressWindow&)> progress_line = DefaultProgressLine;
  // Formats each evaluation line; empty: "epoch: E, <metric name>: M".
  std::function<std::string(const EvalWindow&)> eval_line;
  // Whether rank 0 of `collective` writes the data position file. False on
  // the tensor-parallel ranks other than the first of their group: each of
  // them is rank 0 of its own slice, and the first writes the same file.
  bool writes_data_position = true;
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
  // The task's evaluation metric over all ranks at each evaluation of this
  // run (MNIST: test accuracy), and the global step it was taken at.
  std::vector<double> eval_metric;
  std::vector<int64_t> eval_steps;
  // A metric the program measured after the loop (GPT: the Test part's
  // loss); the loop itself leaves it empty.
  std::optional<double> test_metric;
  // What this rank's updater held for gradients and optimizer state.
  UpdaterMemory memory;
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
