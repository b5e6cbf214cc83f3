// CollectiveTask: what one model brings to the collective training loop
// (collective/train_loop.h) — its parameters, its training samples
// and the computation on a batch of them, and its evaluation. The loop owns
// everything that is the same for every model: the sample order and each
// rank's slice of it, the optimizer, the gradient all-reduce, checkpoints
// and the data position, progress lines, step timing.
//
// A step, as the loop drives it on every rank:
//
//   task.BeginStep(step)
//   task.PrefetchBatch(first micro-batch's ids)      // a hint
//   zero the gradients
//   for each of the step's k micro-batches:
//     task.LoadBatch(ids);                              // this rank's samples of it
//     loss = task.ForwardBackward(grad_ready, 1 / k);   // adds gradients, reports finished tensors
//   ... reduction over ranks, optimizer step (collective/updater.h) ...
//
// LoadBatch and ForwardBackward are separate so the loop can time reading
// apart from computing, and so that a step can be several micro-batches
// (gradients accumulate because ForwardBackward adds to them).
//
// Ownership: the task owns its model and data; the loop borrows the task for
// one run. Thread safety: one thread drives a task (ranks that run as
// threads each have their own).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "trainer/param_arena.h"

namespace fleet::trainer::collective {

class CollectiveTask {
 public:
  virtual ~CollectiveTask() = default;

  // Short name of the model, e.g. "mlp": the checkpoint file is
  // "<name>.ckpt".
  virtual std::string name() const = 0;

  // Every trained parameter and its gradient: what the loop all-reduces,
  // hands to the optimizer and saves. The same arena for the task's
  // lifetime.
  virtual ParamArena& arena() = 0;

  // Training samples. The loop visits ids [0, n) in one permutation per
  // epoch, identical on every rank, and gives each rank its slice of each
  // global batch.
  virtual int64_t num_train_samples() const = 0;

  // Makes training samples `ids` (each in [0, num_train_samples()), any
  // count >= 1) the input of the next ForwardBackward. Errors: those of
  // reading the data, naming the sample.
  virtual Status LoadBatch(std::span<const int64_t> ids) = 0;

  // The loop's global step (steps done before it) of the micro-batches
  // LoadBatch loads next, called before each step's first LoadBatch: what a
  // task's randomness within a step (dropout) is keyed by, so a step is the
  // same when repeated or resumed. The default ignores it.
  virtual void BeginStep(int64_t step) { (void)step; }

  // A hint: `ids` are the samples of the next LoadBatch. The loop gives it
  // before zeroing the step's gradients, so a task whose samples are
  // scattered in memory can start their cache misses and have them overlap
  // that. Must not change any result; the default does nothing.
  virtual void PrefetchBatch(std::span<const int64_t> ids) { (void)ids; }

  // Forward and backward on the loaded batch: ADDS grad_scale times the
  // gradient of the batch's mean loss to arena().grads(), calling grad_ready
  // (may be empty) as tensors become final, and returns that mean loss
  // (unscaled). Errors: InvalidArgument from the model (bad input values).
  virtual Result<float> ForwardBackward(const GradReadyFn& grad_ready, float grad_scale) = 0;

  // Evaluation with the current parameters over this rank's part of the
  // held-out data (ranks split it among themselves by `rank` of
  // `world_size`): sums that add up over ranks into the metric, of the same
  // length on every rank. The loop sums them over ranks and calls
  // EvalMetric.
  virtual Result<std::vector<float>> EvalSums(int rank, int world_size) = 0;
  virtual double EvalMetric(std::span<const float> sums) const = 0;
  // The metric's name in the progress line, e.g. "test_accuracy".
  virtual std::string eval_metric_name() const = 0;
};

}  // namespace fleet::trainer::collective
