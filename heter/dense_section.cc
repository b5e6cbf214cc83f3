#include "heter/dense_section.h"

#include <string>

#include "trainer/kernels/backend_factory.h"
#include "worker/config.h"
#include "worker/tasks/ctr_tower.h"

namespace fleet::heter {

DenseSection::DenseSection(DenseShape shape, uint32_t dense_table, trainer::Device device,
                           std::unique_ptr<trainer::Backend> backend,
                           std::unique_ptr<trainer::CtrModel> model)
    : shape_(shape),
      dense_table_(dense_table),
      device_(device),
      backend_(std::move(backend)),
      model_(std::move(model)) {
  if (device_.is_cpu()) {
    host_params_ = {model_->arena().params().data(), model_->arena().size()};
  } else {
    staging_.resize(model_->arena().size());
    host_params_ = staging_;
  }
}

Result<std::unique_ptr<DenseSection>> DenseSection::Create(const ps::JobConfig& job,
                                                           const trainer::Device& device,
                                                           ThreadPool* pool) {
  auto refuse = [](const Status& why) {
    return why.WithContext("the job config has no dense section for a heter worker to run");
  };
  // The same sections a CPU worker reads, with the same checks.
  auto config = worker::ParseWorkerConfig(job.root);
  if (!config.ok()) return refuse(config.status());
  // The CTR models' dense part; anything else has none for heter workers.
  auto tower = worker::CtrTowerConfig(*config, job);
  if (!tower.ok()) return refuse(tower.status());
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::Backend> backend,
                         trainer::CreateBackend(device, pool));
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::CtrModel> model,
                         trainer::CtrModel::Create(*tower, backend.get()));
  const uint32_t id = config->model.dense_table;
  const ps::TableConfig* table = job.table(id);
  const std::string key = "model.dense_table=" + std::to_string(id);
  if (table == nullptr || table->kind != ps::TableKind::kDense) {
    return refuse(Status::InvalidArgument("names no dense table in `tables`", key));
  }
  if (table->dim != model->arena().size()) {
    return refuse(Status::InvalidArgument("the dense table has dim " + std::to_string(table->dim) +
                                              " but the tower has " +
                                              std::to_string(model->arena().size()) + " parameters",
                                          key));
  }
  const DenseShape shape{tower->num_slots, tower->embedding_dim, tower->num_dense};
  return std::unique_ptr<DenseSection>(
      new DenseSection(shape, id, device, std::move(backend), std::move(model)));
}

Status DenseSection::LoadParams() {
  if (device_.is_cpu()) return Status::OK();
  return model_->arena().ParamsFromHost(staging_);
}

Status DenseSection::Run(const TrainRequest& request, TrainReply* reply,
                         std::span<float> dense_grad) {
  CHECK_GE(request.batch(), 1);
  CHECK_EQ(dense_grad.size(), param_count());
  trainer::ParamArena& arena = model_->arena();
  arena.ZeroGrad();
  FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(request.pooled.span(), request.dense.span(),
                                                     request.labels.span()));
  model_->Backward();
  reply->id = request.id;
  reply->loss = loss;
  reply->pooled_grad = SArray<float>::Uninitialized(request.pooled.size());
  reply->probs = SArray<float>::Uninitialized(request.labels.size());
  model_->PooledGradToHost(reply->pooled_grad.span());
  model_->ProbabilitiesToHost(reply->probs.span());
  backend_->CopyToHost(dense_grad.data(), arena.grads().data(), dense_grad.size_bytes());
  if (request.dense_grad_scale != 1.0f) {
    for (float& g : dense_grad) g *= request.dense_grad_scale;
  }
  return Status::OK();
}

}  // namespace fleet::heter
