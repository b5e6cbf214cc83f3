#include "trainer/collective/gpt_task.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fleet::trainer::collective {

Result<std::unique_ptr<GptTask>> GptTask::Create(const GptConfig& model, Backend* backend,
                                                 GptKernels* kernels,
                                                 std::shared_ptr<const data::GptDataset> train,
                                                 std::shared_ptr<const data::GptDataset> eval,
                                                 const GptTaskOptions& options) {
  CHECK(train != nullptr);
  for (const data::GptDataset* d : {train.get(), eval.get()}) {
    if (d == nullptr) continue;
    if (d->options().seq_len > model.max_position_embeddings) {
      return Status::InvalidArgument(
          absl::StrCat("sequence length ", d->options().seq_len,
                       " exceeds Model.max_position_embeddings ", model.max_position_embeddings),
          "Data.*.dataset.max_seq_len");
    }
    if (d->options().vocab_size != model.vocab_size) {
      return Status::InvalidArgument(
          absl::StrCat("dataset checks ids against ", d->options().vocab_size,
                       " but the model's vocabulary is ", model.vocab_size),
          "Model.vocab_size");
    }
  }
  if (eval != nullptr && eval->options().seq_len != train->options().seq_len) {
    return Status::InvalidArgument(
        absl::StrCat("Eval sequences of ", eval->options().seq_len, " tokens, Train of ",
                     train->options().seq_len),
        "Data.Eval.dataset.max_seq_len");
  }
  if (options.eval_iters < 0 || options.eval_batch < 1) {
    return Status::InvalidArgument("eval_iters must be >= 0 and eval_batch >= 1");
  }
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> gpt,
                         GptModel::Create(model, backend, kernels, options.tensor_parallel));
  return std::unique_ptr<GptTask>(
      new GptTask(std::move(gpt), std::move(train), std::move(eval), options));
}

Status GptTask::ReadBatch(const data::GptDataset& dataset, std::span<const int64_t> ids) {
  const int64_t T = dataset.options().seq_len;
  const int64_t S = dataset.sample_tokens();
  samples_.resize(ids.size() * S);
  FLEET_RETURN_IF_ERROR(dataset.ReadSamples(ids, samples_.data()));
  batch_ = static_cast<int>(ids.size());
  tokens_.resize(ids.size() * T);
  targets_.resize(ids.size() * T);
  for (size_t b = 0; b < ids.size(); ++b) {
    const int32_t* sample = samples_.data() + b * S;
    std::copy(sample, sample + T, tokens_.begin() + b * T);
    std::copy(sample + 1, sample + 1 + T, targets_.begin() + b * T);
  }
  return Status::OK();
}

Status GptTask::LoadBatch(std::span<const int64_t> ids) { return ReadBatch(*train_, ids); }

Result<float> GptTask::ForwardBackward(const GradReadyFn& grad_ready, float grad_scale) {
  GptForwardOptions options;
  options.grad_scale = grad_scale;
  FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(tokens_, targets_, batch_,
                                                     static_cast<int>(seq_len()), options));
  model_->Backward(grad_ready);
  FLEET_RETURN_IF_ERROR(model_->comm_status());
  return loss;
}

Result<std::vector<float>> GptTask::EvalSums(int rank, int world_size) {
  if (eval_ == nullptr) return std::vector<float>{0.0f, 0.0f};
  return LossSums(*eval_, options_.eval_iters, rank, world_size);
}

Result<std::vector<float>> GptTask::LossSums(const data::GptDataset& dataset, int64_t iters,
                                             int rank, int world_size) {
  if (dataset.options().seq_len != seq_len()) {
    return Status::InvalidArgument(
        absl::StrCat("evaluation sequences of ", dataset.options().seq_len, " tokens, Train of ",
                     seq_len()),
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
    FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(tokens_, targets_, batch_,
                                                       static_cast<int>(T), options));
    const double count = static_cast<double>(batch_) * static_cast<double>(T);
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
