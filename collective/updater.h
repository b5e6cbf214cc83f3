// GradientUpdater: what the collective training loop (train_loop.h) does
// with a step's gradients, and the optimizer state it checkpoints. Two
// implementations, one class each:
//   * ReplicatedUpdater (below): every rank holds the whole optimizer state;
//     gradients are all-reduced (DataParallel) and any trainer::Optimizer
//     (sgd, adam, adamw) steps over the whole arena. Rank 0 alone saves
//     "<name>.ckpt" (trainer/checkpoint.h) and the others take its state.
//   * ShardedAdamWUpdater (sharded_adamw.h): AdamW whose state is either
//     replicated (data parallel) or split over the ranks (ZeRO stage 1 and
//     2), with checkpoints that reload under any sharding degree.
//
// A step, as the loop drives it:
//   updater.BeginStep(lr);                                // zero gradients, the step's lr
//   for m in micro-batches: task.ForwardBackward(updater.grad_ready(m == last), 1/k);
//   updater.Step();                                       // reduce, update, params equal
//   everywhere
//
// Thread safety: one thread (the loop's) drives an updater.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "comm/collective.h"
#include "comm/status.h"
#include "collective/data_parallel.h"
#include "trainer/optimizer.h"
#include "trainer/param_arena.h"

namespace fleet::trainer::collective {

// Bytes this rank holds between steps for training state other than the
// parameters, on the arena's device.
struct UpdaterMemory {
  size_t gradient_bytes = 0;   // gradients kept (full, or this rank's shard)
  size_t optimizer_bytes = 0;  // optimizer state (moments)
  size_t param_bytes = 0;      // parameters kept (full, or this rank's shard at stage 3)
  size_t host_bytes = 0;       // offload: master weights, moments and gradients on the host
  // Measured where the updater can (ShardedAdamWUpdater with
  // DataParallelOptions::measure_resident_bytes; 0 otherwise): the most
  // bytes of parameters, gradients and optimizer state this rank held during
  // a step, and right after a step.
  size_t measured_peak_bytes = 0;
  size_t measured_between_steps_bytes = 0;
};

class GradientUpdater {
 public:
  virtual ~GradientUpdater() = default;

  // Zeroes the gradients the next backward adds into; `lr` is the learning
  // rate of this step, given before backward so that an updater may update
  // a bucket's parameters as soon as its gradients are reduced
  // (ShardedAdamWUpdater's offload).
  virtual void BeginStep(float lr) = 0;
  // The callback for a micro-batch's backward. Only the last micro-batch
  // of a step reports its tensors (the gradients are final then), so the
  // reduction overlaps that backward.
  virtual GradReadyFn grad_ready(bool last_micro_batch) = 0;
  // Reduces what is left of the gradients (the mean over ranks), updates the
  // parameters with BeginStep's learning rate (or waits for the updates
  // already running), and leaves them identical on every rank; step() grows
  // by one. Errors: the reduction's (naming the rank and
  // operation); the updater is unusable after one.
  virtual Status Step() = 0;

  // Optimizer steps taken (the global step).
  virtual int64_t step() const = 0;
  // The learning rate of the last BeginStep (or the configured one before).
  virtual float learning_rate() const = 0;
  // The factor the next step's losses are multiplied by before backward
  // (float16's dynamic loss scale; 1 otherwise). The loop passes it, over
  // the number of micro-batches, as ForwardBackward's gradient scale.
  virtual float loss_scale() const { return 1.0f; }
  // The global gradient norm of the last Step, before clipping, when the
  // updater measures it (AdamW with clipping on); nullopt otherwise.
  virtual std::optional<double> grad_norm() const { return std::nullopt; }
  // In place: values become their sum over ranks (metrics).
  virtual Status SumOverRanks(std::span<float> values) = 0;

  // True when `dir` holds a checkpoint of this updater's kind, as rank 0
  // sees it.
  virtual bool HasCheckpoint(const std::filesystem::path& dir) const = 0;
  // Every rank calls it: writes this updater's checkpoint of the parameters
  // and optimizer state (each file atomically; see the implementation for
  // which ranks write what). IOError naming the file.
  virtual Status Save(const std::filesystem::path& dir) = 0;
  // Every rank calls it: loads the checkpoint in `dir` (HasCheckpoint) into
  // params, state and step, or, with no checkpoint there or an empty dir,
  // makes every rank start from rank 0's parameters. Every rank learns
  // whether every other one succeeded, so none waits for a peer that gave
  // up. Errors: those of trainer/checkpoint.h, FailedPrecondition for a
  // checkpoint of another model or a failure on another rank.
  virtual Status Resume(const std::filesystem::path& dir) = 0;

  virtual UpdaterMemory memory() const = 0;

  // Makes the arena hold every parameter (an updater that keeps only shards
  // of them between steps, ZeRO stage 3, gathers them; they stay until the
  // model next releases them). For the final parameters. Collective: every
  // rank calls it. Errors: the gathers'.
  virtual Status MaterializeParams() { return Status::OK(); }
};

// Any trainer::Optimizer over the whole arena, gradients all-reduced.
class ReplicatedUpdater final : public GradientUpdater {
 public:
  // `optimizer` is bound to `arena`; `collective` (null for one process)
  // and `arena` are not owned and outlive this. The checkpoint file is
  // "<name>.ckpt". Errors: DataParallel::Create's.
  static Result<std::unique_ptr<ReplicatedUpdater>> Create(Collective* collective,
                                                           ParamArena* arena,
                                                           std::unique_ptr<Optimizer> optimizer,
                                                           const DataParallelOptions& options,
                                                           const std::string& name);

  void BeginStep(float lr) override {
    dp_->ZeroGrad();
    optimizer_->set_learning_rate(lr);
  }
  GradReadyFn grad_ready(bool last_micro_batch) override;
  Status Step() override;
  int64_t step() const override { return optimizer_->step(); }
  float learning_rate() const override { return optimizer_->learning_rate(); }
  Status SumOverRanks(std::span<float> values) override { return dp_->SumOverRanks(values); }
  bool HasCheckpoint(const std::filesystem::path& dir) const override;
  // Rank 0 writes "<name>.ckpt"; the other ranks write nothing.
  Status Save(const std::filesystem::path& dir) override;
  // Rank 0 reads "<name>.ckpt"; every rank then takes rank 0's parameters,
  // state and step (broadcast).
  Status Resume(const std::filesystem::path& dir) override;
  UpdaterMemory memory() const override;

 private:
  ReplicatedUpdater(std::unique_ptr<Optimizer> optimizer, std::unique_ptr<DataParallel> dp,
                    std::string file)
      : optimizer_(std::move(optimizer)), dp_(std::move(dp)), file_(std::move(file)) {}

  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<DataParallel> dp_;
  const std::string file_;
};

// Every rank learns whether `local` failed on any rank (one
// updater.SumOverRanks of a flag). Returns `local` when it failed here,
// FailedPrecondition naming `what` when it failed only elsewhere, OK when it
// succeeded everywhere; the sum's own error when that fails.
Status AgreeOnSuccess(GradientUpdater& updater, const Status& local, const std::string& what);

}  // namespace fleet::trainer::collective
