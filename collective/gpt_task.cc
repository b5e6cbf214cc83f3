#include "collective/gpt_task.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/models/gpt_lora_files.h"

namespace fleet::trainer::collective {

Result<std::unique_ptr<GptTask>> GptTask::Create(const GptConfig& model, Backend* backend,
                                                 GptKernels* kernels,
                                                 std::shared_ptr<const data::GptSamples> train,
                                                 std::shared_ptr<const data::GptSamples> eval,
                                                 const GptTaskOptions& options) {
  CHECK(train != nullptr);
  for (const data::GptSamples* d : {train.get(), eval.get()}) {
    if (d == nullptr) continue;
    if (d->seq_len() > model.max_position_embeddings) {
      return Status::InvalidArgument(
          absl::StrCat("sequence length ", d->seq_len(), " exceeds Model.max_position_embeddings ",
                       model.max_position_embeddings),
          "Data.*.dataset.max_seq_len");
    }
    if (d->vocab_size() != model.vocab_size) {
      return Status::InvalidArgument(
          absl::StrCat("dataset checks ids against ", d->vocab_size(),
                       " but the model's vocabulary is ", model.vocab_size),
          "Model.vocab_size");
    }
  }
  if (eval != nullptr && eval->seq_len() != train->seq_len()) {
    return Status::InvalidArgument(
        absl::StrCat("Eval sequences of ", eval->seq_len(), " tokens, Train of ", train->seq_len()),
        "Data.Eval.dataset.max_seq_len");
  }
  if (options.eval_iters < 0 || options.eval_batch < 1) {
    return Status::InvalidArgument("eval_iters must be >= 0 and eval_batch >= 1");
  }
  const GptPipelineOptions& pipe = options.pipeline;
  GptStage stage = GptWholeStage(model);
  if (pipe.stages > 1) {
    FLEET_ASSIGN_OR_RETURN(stage, GptPipelineStage(model, pipe.stages, pipe.stage));
  }
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> gpt,
                         GptModel::Create(model, backend, kernels, options.tensor_parallel,
                                          pipe.stages > 1 ? &stage : nullptr));
  std::unique_ptr<GptPipeline> pipeline;
  if (pipe.stages > 1) {
    FLEET_ASSIGN_OR_RETURN(pipeline, GptPipeline::Create(gpt.get(), pipe));
  }
  return std::unique_ptr<GptTask>(
      new GptTask(std::move(gpt), std::move(pipeline), std::move(train), std::move(eval), options));
}

std::string GptTask::name() const {
  return model_->config().lora.enabled() ? kGptLoraTaskName : "gpt";
}

Status GptTask::ReadBatch(const data::GptSamples& dataset, std::span<const int64_t> ids) {
  const int64_t T = dataset.seq_len();
  tokens_.resize(ids.size() * T);
  targets_.resize(ids.size() * T);
  FLEET_RETURN_IF_ERROR(dataset.ReadInputsAndTargets(ids, tokens_.data(), targets_.data()));
  batch_ = static_cast<int>(ids.size());
  return Status::OK();
}

Status GptTask::LoadBatch(std::span<const int64_t> ids) {
  streams_.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    streams_[i] = static_cast<uint32_t>(ids[i]) ^ static_cast<uint32_t>(ids[i] >> 32);
  }
  return ReadBatch(*train_, ids);
}

Result<float> GptTask::ForwardBackward(const GradReadyFn& grad_ready, float grad_scale) {
  GptForwardOptions options;
  options.grad_scale = grad_scale;
  options.dropout_seed = GptDropoutStepSeed(options_.seed, step_);
  options.dropout_streams = streams_;
  const int T = static_cast<int>(seq_len());
  if (pipeline_ != nullptr)
    return pipeline_->Train(tokens_, targets_, batch_, T, options, grad_ready);
  FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(tokens_, targets_, batch_, T, options));
  model_->Backward(grad_ready);
  FLEET_RETURN_IF_ERROR(model_->comm_status());
  return loss;
}

Result<std::vector<float>> GptTask::EvalSums(int rank, int world_size) {
  if (eval_ == nullptr) return std::vector<float>{0.0f, 0.0f};
  return LossSums(*eval_, options_.eval_iters, rank, world_size);
}

Result<std::vector<float>> GptTask::LossSums(const data::GptSamples& dataset, int64_t iters,
                                             int rank, int world_size) {
  if (dataset.seq_len() != seq_len()) {
    return Status::InvalidArgument(absl::StrCat("evaluation sequences of ", dataset.seq_len(),
                                                " tokens, Train of ", seq_len()),
                                   "Data.*.dataset.max_seq_len");
  }
  const int64_t n = dataset.num_samples();
  const int64_t T = seq_len();
  std::vector<int64_t> ids(options_.eval_batch);
  GptForwardOptions options;
  options.for_backward = false;
  double loss_sum = 0.0, tokens = 0.0;
  for (int64_t i = rank; i < iters; i += world_size) {
    for (int j = 0; j < options_.eval_batch; ++j) ids[j] = (i * options_.eval_batch + j) % n;
    FLEET_RETURN_IF_ERROR(ReadBatch(dataset, ids));
    FLEET_ASSIGN_OR_RETURN(
        float loss, pipeline_ != nullptr
                        ? pipeline_->Evaluate(tokens_, targets_, batch_, static_cast<int>(T))
                        : model_->Forward(tokens_, targets_, batch_, static_cast<int>(T), options));
    // The model's loss is the mean over positions with a target.
    const double count = static_cast<double>(
        std::count_if(targets_.begin(), targets_.end(), [](int32_t t) { return t >= 0; }));
    loss_sum += static_cast<double>(loss) * count;
    tokens += count;
  }
  return std::vector<float>{static_cast<float>(loss_sum), static_cast<float>(tokens)};
}

double GptTask::EvalMetric(std::span<const float> sums) const {
  if (sums.size() < 2 || sums[1] <= 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(sums[0]) / static_cast<double>(sums[1]);
}

}  // namespace fleet::trainer::collective
