// GptTask: GPT-2 training as a CollectiveTask (task.h), so the collective
// loop (train_loop.h) trains it like any model: samples are GptSamples
// (data/gpt_dataset.h) of seq_len inputs and targets: a GptDataset's
// token stream for pretraining, a PromptResponseDataset's pairs for
// fine-tuning (targets -1 on the prompt and padding). The loss is the mean
// next-token cross-entropy over the positions with a target; evaluation is
// the mean loss over the Eval part's targets.
//
// Evaluation. eval_iters batches of eval_batch sequences, batch i holding
// eval samples [i * eval_batch, (i + 1) * eval_batch) (wrapping around a
// small part), dealt to the ranks round robin (batch i to rank i mod W); the
// sums are the targets' summed loss and their count, so the metric is the
// same whatever the number of ranks.
//
// Ownership: the task owns the model; the backend, kernels and datasets are
// shared or borrowed as stated at Create. Thread safety: one thread drives a
// task.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collective/gpt_pipeline.h"
#include "collective/task.h"
#include "comm/status.h"
#include "data/gpt_dataset.h"
#include "trainer/kernels/gpt_kernels.h"
#include "trainer/models/gpt.h"

namespace fleet::trainer::collective {

struct GptTaskOptions {
  // Batches per evaluation (Engine.eval_iters) and sequences per batch
  // (Global.micro_batch_size). 0 batches: EvalSums returns zeros.
  int64_t eval_iters = 10;
  int eval_batch = 1;
  // The model's tensor-parallel split (not owned, outlives the task; null:
  // the whole model on this rank). The ranks of its group must load the
  // same batches.
  GptTensorParallel* tensor_parallel = nullptr;
  // The run's seed (Global.seed): with the step and each sample's id, the
  // key of the model's dropout masks (GptDropoutStepSeed).
  uint64_t seed = 0;
  // Pipeline parallelism (stages > 1; gpt_pipeline.h): the model is this
  // rank's stage (tensor_parallel must split the same stage), a loaded
  // batch is the step's whole batch, which ForwardBackward runs as
  // pipeline.micro_batches micro-batches through the stages, and
  // evaluation runs through them too. Every stage of a pipeline loads the
  // same batches and returns the same losses.
  GptPipelineOptions pipeline;
};

class GptTask final : public CollectiveTask {
 public:
  // `backend` and `kernels` (same device) are not owned and outlive the
  // task; `train` is required, `eval` may be null (no evaluation data: the
  // metric is then NaN). Errors: GptModel::Create's; InvalidArgument when a
  // dataset's sequence length exceeds the model's positions, or its id
  // bound differs from the model's vocabulary.
  static Result<std::unique_ptr<GptTask>> Create(const GptConfig& model, Backend* backend,
                                                 GptKernels* kernels,
                                                 std::shared_ptr<const data::GptSamples> train,
                                                 std::shared_ptr<const data::GptSamples> eval,
                                                 const GptTaskOptions& options);

  // "gpt", or "gpt_lora" with LoRA (its checkpoint is then gpt_lora.ckpt).
  std::string name() const override;
  // The trained parameters: the model's, or with LoRA its adapters alone
  // (GptModel::trainable_arena).
  ParamArena& arena() override { return model_->trainable_arena(); }
  int64_t num_train_samples() const override { return train_->num_samples(); }
  void BeginStep(int64_t step) override { step_ = step; }
  // Also keeps each sample's dropout stream: its id (the same on every rank).
  Status LoadBatch(std::span<const int64_t> ids) override;
  Result<float> ForwardBackward(const GradReadyFn& grad_ready, float grad_scale) override;
  // Sums: {summed token loss, tokens}.
  Result<std::vector<float>> EvalSums(int rank, int world_size) override;
  double EvalMetric(std::span<const float> sums) const override;
  std::string eval_metric_name() const override { return "eval_loss"; }

  // Sums {summed token loss, tokens} over batches i of `dataset` with
  // i in [0, iters) and i mod world_size == rank (batch i as described at the
  // top). What EvalSums does for the Eval part; gpt_pretrain's test
  // evaluation after training uses it for the Test part.
  Result<std::vector<float>> LossSums(const data::GptSamples& dataset, int64_t iters, int rank,
                                      int world_size);

  GptModel& model() { return *model_; }
  // Null without pipeline stages.
  GptPipeline* pipeline() { return pipeline_.get(); }
  int64_t seq_len() const { return train_->seq_len(); }

 private:
  GptTask(std::unique_ptr<GptModel> model, std::unique_ptr<GptPipeline> pipeline,
          std::shared_ptr<const data::GptSamples> train,
          std::shared_ptr<const data::GptSamples> eval, const GptTaskOptions& options)
      : model_(std::move(model)),
        pipeline_(std::move(pipeline)),
        train_(std::move(train)),
        eval_(std::move(eval)),
        options_(options) {}

  // Reads samples `ids` of `dataset` into tokens_ / targets_ ([n, T] each).
  Status ReadBatch(const data::GptSamples& dataset, std::span<const int64_t> ids);

  // Fixed after construction.
  const std::unique_ptr<GptModel> model_;
  const std::unique_ptr<GptPipeline> pipeline_;  // null: no pipeline stages
  const std::shared_ptr<const data::GptSamples> train_;
  const std::shared_ptr<const data::GptSamples> eval_;
  const GptTaskOptions options_;

  // The loaded batch.
  int64_t step_ = 0;
  int batch_ = 0;
  std::vector<int32_t> tokens_;    // [batch, T]
  std::vector<int32_t> targets_;   // [batch, T]
  std::vector<uint32_t> streams_;  // [batch]: the samples' dropout streams
};

}  // namespace fleet::trainer::collective
