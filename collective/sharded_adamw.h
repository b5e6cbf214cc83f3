// ShardedAdamWUpdater: AdamW (trainer/models/adamw.h) for the collective loop, its
// state replicated (data parallel) or split over the ranks (ZeRO, Rajbhandari
// et al. 2020):
//
//   stage 0  every rank all-reduces the gradients and updates every
//            parameter with its own full copy of m and v (plain data
//            parallel);
//   stage 1  the gradients are reduce-scattered: rank r keeps the sum of its
//            piece of every bucket (DataParallel's sharded mode), updates the
//            parameters of its pieces with m and v for those pieces only
//            (1/W of the state), and the ranks all-gather the parameters;
//   stage 2  as stage 1, and each bucket's full gradients are discarded as
//            soon as they are reduced (on the CPU the pages go back to the
//            system), so between steps a rank holds 1/W of the gradients.
//            With gradient accumulation the full gradients live until the
//            last micro-batch's backward has reduced them.
//   stage 3  as stage 2, one bucket per model unit, and the parameters too
//            are kept as this rank's pieces only: the model acquires a
//            unit's parameters through param_hooks() (all-gathered, the next
//            unit prefetched) and releases them after use (DataParallel,
//            "Sharded parameters"); the update writes the pieces and nothing
//            is gathered after it. A checkpoint gathers the whole model for
//            rank 0 to write (a transient full copy per rank).
// Every stage computes the same update (up to the order of float sums):
// global-norm clipping sums the squares of each rank's pieces and
// all-reduces them; the mean over ranks is folded into the update's
// gradient scale.
//
// Offload (options.offload, FleetX's sharding_offload, DeepSpeed's
// --cpu-optimizer): the fp32 master copy of this rank's pieces, m and v live
// in a host arena (a CPU backend of their own), and the update runs there on
// the CPU twin's kernels with their own offload_threads: each piece's reduced
// gradients are copied to the host, updated into the master copy, and the
// master copied back as the compute parameters (the arena's pieces, or stage
// 3's shard). On CPU ranks the same code runs, host to host. Each bucket's
// gradients are copied to the host as soon as it is reduced, on the thread
// that reduced it (the communication thread, or the caller's with a
// shared-memory group), overlapping the backward of earlier blocks.
// With clipping off and no loss scaler the update of the bucket's piece
// (host gradients -> master, m, v -> compute parameters) runs there too,
// right after the copy, with BeginStep's learning rate and step number
// (beside backward with a communication thread; with a shared-memory group,
// which reduces on the caller's thread, between blocks of backward); Step
// then finds the updates done (FinishGradients' bounded wait covers
// them), gathers the parameters and counts the step. This is exact: a
// bucket is reduced only once backward has finished every tensor in it, and
// backward reads no parameter of a finished tensor again (the tied
// embedding and head is the table's first tensor, finished and reduced
// last); at stage 3 the update writes the bucket's own pieces, which only
// that unit's all-gather reads, and the unit is not acquired again in this
// pass. With clipping or the loss scaler on, the updates still run in Step
// after the last bucket: the clip factor and the overflow check need the
// norm of every gradient. With one process nothing is reduced, and Step
// copies and updates every piece.
//
// float16 (options.loss_scaler set): the losses are scaled by a
// DynamicLossScaler (collective/loss_scaler.h) whose overflow check reuses the
// clipping's sum of squares (so every rank decides alike); an overflowing
// step changes no parameter or moment but counts as a step, and the scale
// travels in the state files so a resumed run scales as the first would.
//
// Checkpoints (directory `dir`, name e.g. "gpt"):
//   <name>.ckpt                     parameters and step (trainer/checkpoint.h,
//                                   optimizer "adamw" with no state buffers),
//                                   written by rank 0, last, atomically
//   <name>.adamw.s<step>.<r>-of-<D> m and v of shard r's pieces, written by
//                                   the first rank of its data-parallel group
//                                   (stage 0: one file, rank 0's, D = 1), each written
//                                   atomically before the .ckpt; a rank
//                                   removes its older ones once the new
//                                   .ckpt is in place
// A state file lists the arena ranges it holds, so a checkpoint loads under
// any sharding degree and stage: each rank reads the parameters and, from
// whichever state files overlap them, the moments of its own pieces (a
// degree-2 checkpoint loads with degree 1 and the other way round). Because
// the .ckpt names the step of the state files and is replaced last, a crash
// during a save leaves the previous checkpoint whole. Every rank reads the
// directory, so with several machines it must be shared storage.
//
// Tensor parallelism (options.tensor_parallel, a ParamSplit of the model's
// group): the groups given to Create are then those of this rank's slice
// (the ranks holding the same part of the model), and the arena is this
// rank's part. The clipping norm adds the squares of the other parts over
// the model-parallel group (replicated tensors counted once). Checkpoints
// stay in the whole model's layout: the data-parallel rank 0 of every part
// gathers the parameters over the model-parallel group for its first rank
// to write, and each state file lists whole-model ranges (file r of
// M x D: part r / D, shard r mod D; replicated tensors only in part 0's
// files), so a checkpoint loads under any split, tensor-parallel or not.
//
// Thread safety: one thread drives an updater.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "comm/file_system.h"
#include "comm/status.h"
#include "trainer/models/adamw.h"
#include "collective/updater.h"
#include "collective/data_parallel.h"
#include "trainer/kernels/gpt_kernels.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "collective/loss_scaler.h"
#include "trainer/param_arena.h"
#include "trainer/param_split.h"

namespace fleet::trainer::collective {

struct ShardingOptions {
  // Ranks the optimizer state is split over: 1 (replicated), the world size
  // (the whole group), or a divisor between, with the sharding and
  // data-parallel groups given to Create (parallel_groups.h).
  int degree = 1;
  // 1, 2 or 3 when degree > 1 (see the top of this file); ignored when 1.
  int stage = 1;
};

struct ShardedAdamWOptions {
  ShardingOptions sharding;
  DataParallelOptions data_parallel;
  // Dynamic loss scaling (float16 training); none for float32 and bfloat16.
  std::optional<LossScalerConfig> loss_scaler;
  // Stage 3: the model's parameter units (GptModel::ParamUnits), required.
  std::vector<TensorRange> param_units;
  // Master weights and moments on the host, updated by offload_threads CPU
  // threads (see the top of this file). Frees 12 bytes per parameter of the
  // rank's share from the device; costs two copies of the share per step.
  bool offload = false;
  int offload_threads = 1;
  // This rank's part of a tensor-parallel model (see the top of this file;
  // not owned, outlives the updater); null: the arena is the whole model.
  const ParamSplit* tensor_parallel = nullptr;
  // Where Save and Resume read and write (not owned, outlives the updater);
  // null: the real file system. Tests pass a FaultInjectionFileSystem.
  FileSystem* file_system = nullptr;
};

class ShardedAdamWUpdater final : public GradientUpdater {
 public:
  // `groups` (world null for one process; shard and replica needed only for
  // a degree between 1 and the world size), `arena` and `kernels` (on the
  // arena's device) are not owned and outlive this. `config` as validated
  // (AdamWConfig::Validate); `lr` is the learning rate until the first Step.
  // InvalidArgument for a degree that does not divide the world or does not
  // match the groups, a stage outside {1, 2, 3} or stage 3 without
  // param_units; DataParallel::Create's and
  // DynamicLossScaler::Create's errors. Allocates m and v for this rank's
  // pieces.
  static Result<std::unique_ptr<ShardedAdamWUpdater>> Create(const DataParallelGroups& groups,
                                                             ParamArena* arena, GptKernels* kernels,
                                                             const AdamWConfig& config, float lr,
                                                             const ShardedAdamWOptions& options,
                                                             const std::string& name);
  ~ShardedAdamWUpdater() override;

  void BeginStep(float lr) override;
  GradReadyFn grad_ready(bool last_micro_batch) override;
  Status Step() override;
  int64_t step() const override;
  float learning_rate() const override { return lr_; }
  float loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0f; }
  std::optional<double> grad_norm() const override {
    return rule_.config().clip_norm > 0.0f ? std::optional<double>(last_grad_norm_) : std::nullopt;
  }
  Status SumOverRanks(std::span<float> values) override { return dp_->SumOverRanks(values); }
  bool HasCheckpoint(const std::filesystem::path& dir) const override;
  Status Save(const std::filesystem::path& dir) override;
  Status Resume(const std::filesystem::path& dir) override;
  UpdaterMemory memory() const override;
  Status MaterializeParams() override { return dp_->GatherAllParams(); }

  // What the model must call around its uses of parameters (stage 3; null
  // otherwise). Valid while this updater lives.
  ParamUseHooks* param_hooks() { return dp_->param_hooks(); }

  // The global gradient norm of the last Step (before clipping; 0 when
  // clipping is off).
  double last_grad_norm() const { return last_grad_norm_; }
  // Steps skipped for a float16 overflow so far (this run).
  int64_t skipped_steps() const { return skipped_steps_; }
  // Whether each piece is updated as soon as its bucket is reduced (see the
  // top of this file): offload, more than one rank, no clipping, no loss
  // scaler.
  bool updates_on_reduction() const { return updates_on_reduction_; }
  // Of the last Step's pieces, how many were updated before its last bucket
  // was reduced: the buckets less one when updates run on reduction, 0
  // when they run in Step. For tests; read it after Step.
  size_t updates_before_last_reduction() const { return updates_before_last_reduction_; }

 private:
  class ParamsFileOptimizer;
  ShardedAdamWUpdater(ParamArena* arena, GptKernels* kernels, const AdamWConfig& config, float lr,
                      const ShardingOptions& sharding, std::unique_ptr<DataParallel> dp,
                      std::optional<DynamicLossScaler> scaler, const std::string& name,
                      const ParamSplit* split, GptCompute host, FileSystem* fs);
  bool offloaded() const { return host_.kernels != nullptr; }
  // Where m and v live: the host arena when offloaded, else the arena's device.
  Backend* state_backend() const { return offloaded() ? host_.backend.get() : arena_->backend(); }
  // The compute parameters of a piece: the arena's, or stage 3's shard.
  float* DeviceParams(const GradPiece& piece) const;
  // Offload: the master copy takes the compute parameters (after a resume).
  void InitMaster();
  // Offload: one AdamW step of a piece whose gradients are on the host
  // (host_grads_), into the master copy, then the compute parameters.
  void UpdateOffloadedPiece(const GradPiece& piece, int64_t t, float grad_scale);
  // After the updates: the parameters gathered (stages 1 and 2), the step
  // counted, the memory measured.
  Status FinishStep();
  // Offload: bucket b was reduced (on the reducing thread): its piece's
  // gradients go to the host, and with updates_on_reduction() it is updated.
  void OnBucketReduced(size_t b);
  std::string StateFileName(int64_t step, int rank, int files) const;
  // A run of moments: checkpoint (whole-model) floats [begin, end) are
  // m_/v_[offset, offset + end - begin).
  struct StateRun {
    size_t begin = 0, end = 0, offset = 0;
  };
  // This rank's pieces as checkpoint runs; `to_save`: without the
  // replicated tensors of model-parallel parts other than the first.
  std::vector<StateRun> StateRuns(bool to_save) const;
  // The checkpoint's parameter count (the whole model's).
  size_t CheckpointFloats() const;
  // Index of this rank's state file and their number per checkpoint.
  int state_file() const;
  // Tensor parallelism: the sum over the model-parallel group of a host value.
  Status SumOverModelParallel(float* value);
  // Writes / reads the params file in the whole model's layout.
  Status SaveParams(const std::filesystem::path& path);
  Status LoadParams(const std::filesystem::path& path);
  Status SaveState(const std::filesystem::path& dir) const;
  // Reads the moments of this rank's pieces from the state files of `step`.
  Status LoadState(const std::filesystem::path& dir, int64_t step);
  // Removes this rank's state files of steps other than the current one.
  void RemoveOldState(const std::filesystem::path& dir) const;
  // Whether this rank writes a state file: the first replica of each piece
  // (rank 0 alone when nothing is sharded).
  bool writes_state() const { return sharded() ? dp_->replica_rank() == 0 : dp_->rank() == 0; }
  // State files per checkpoint: one per shard (of each tensor-parallel part).
  int state_files() const { return dp_->shard_size() * (split_ ? split_->degree : 1); }
  bool sharded() const { return dp_->sharded(); }

  // Fixed after construction.
  ParamArena* const arena_;
  GptKernels* const kernels_;
  const AdamWRule rule_;
  const ShardingOptions sharding_;
  const std::unique_ptr<DataParallel> dp_;
  const std::string name_;
  const ParamSplit* const split_;  // tensor parallelism; null: none
  FileSystem* const fs_;           // checkpoints' files; not owned
  GptCompute host_;                // offload: the host arena's backend and CPU kernels
  const size_t state_floats_;      // m and v each: this rank's pieces (or the arena)
  std::shared_ptr<float> m_, v_;
  // Offload, on the host: fp32 master parameters and the reduced gradients.
  std::shared_ptr<float> master_, host_grads_;
  // The params file's optimizer: name "adamw", the step, no state buffers.
  const std::unique_ptr<ParamsFileOptimizer> params_file_;
  const bool updates_on_reduction_;

  // Written by the caller between steps (BeginStep) and read by the
  // reducing thread during them; FinishGradients' wait orders the two.
  float lr_;
  // Written by the reducing thread during a step, read by the caller after
  // FinishGradients.
  size_t updated_this_step_ = 0;
  size_t updates_before_last_reduction_ = 0;

  size_t measured_between_steps_ = 0;
  double last_grad_norm_ = 0.0;
  std::optional<DynamicLossScaler> scaler_;
  int64_t skipped_steps_ = 0;
};

}  // namespace fleet::trainer::collective
