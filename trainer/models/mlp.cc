#include "trainer/models/mlp.h"

#include <string>

#include "trainer/models/init.h"

namespace fleet::trainer {

ParamTable MlpParamTable(const MlpConfig& config) {
  ParamTable table;
  for (size_t l = 0; l + 1 < config.sizes.size(); ++l) {
    AddLinearParams(&table, "fc" + std::to_string(l + 1), config.sizes[l], config.sizes[l + 1]);
  }
  return table;
}

Result<std::unique_ptr<Mlp>> Mlp::Create(const MlpConfig& config, Backend* backend) {
  CHECK(backend != nullptr);
  if (config.sizes.size() < 2) {
    return Status::InvalidArgument("Model.sizes needs at least an input and an output size");
  }
  for (int s : config.sizes) {
    if (s <= 0) return Status::InvalidArgument("Model.sizes entries must be > 0, got", std::to_string(s));
  }
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(MlpParamTable(config), backend));
  FLEET_RETURN_IF_ERROR(arena.ParamsFromHost(LinearUniformInit(arena.table(), config.seed)));
  return std::unique_ptr<Mlp>(new Mlp(config, backend, std::move(arena)));
}

Mlp::Mlp(const MlpConfig& config, Backend* backend, ParamArena arena)
    : config_(config), backend_(backend), arena_(std::move(arena)), loss_(backend) {
  const size_t L = config_.sizes.size() - 1;
  for (size_t l = 0; l < L; ++l) {
    linears_.emplace_back(arena_, "fc" + std::to_string(l + 1));
    if (l + 1 < L) tanhs_.emplace_back(backend_);
  }
}

void Mlp::EnsureBatch(int B) {
  if (B == batch_) return;
  batch_ = B;
  const size_t L = linears_.size();
  x_ = backend_->AllocateTensor(Shape{B, config_.sizes[0]});
  labels_ = backend_->AllocateBytes(sizeof(int32_t) * B);
  z_.clear(), dz_.clear(), a_.clear(), da_.clear();
  for (size_t l = 0; l < L; ++l) {
    const Shape s{B, config_.sizes[l + 1]};
    z_.push_back(backend_->AllocateTensor(s));
    dz_.push_back(backend_->AllocateTensor(s));
    if (l + 1 < L) {
      a_.push_back(backend_->AllocateTensor(s));
      da_.push_back(backend_->AllocateTensor(s));
    }
  }
  probs_ = backend_->AllocateTensor(Shape{B, num_classes()});
}

Result<float> Mlp::Forward(std::span<const float> x, std::span<const int32_t> labels) {
  const int64_t B = static_cast<int64_t>(labels.size());
  const int in = config_.sizes[0];
  if (B == 0) return Status::InvalidArgument("empty batch");
  if (static_cast<int64_t>(x.size()) != B * in) {
    return Status::InvalidArgument("batch has " + std::to_string(x.size()) + " inputs, want " +
                                   std::to_string(B) + " x " + std::to_string(in));
  }
  for (int64_t b = 0; b < B; ++b) {
    if (labels[b] < 0 || labels[b] >= num_classes()) {
      return Status::InvalidArgument("label " + std::to_string(labels[b]) + " outside [0, " +
                                         std::to_string(num_classes()) + ")",
                                     "sample " + std::to_string(b));
    }
  }
  EnsureBatch(static_cast<int>(B));
  backend_->CopyFromHost(x_.data(), x.data(), x.size_bytes());
  backend_->CopyFromHost(labels_.get(), labels.data(), labels.size_bytes());

  const size_t L = linears_.size();
  const Tensor* in_act = &x_;
  for (size_t l = 0; l < L; ++l) {
    linears_[l].Forward(*in_act, &z_[l]);
    if (l + 1 < L) {
      tanhs_[l].Forward(z_[l], &a_[l]);
      in_act = &a_[l];
    }
  }
  const float loss =
      loss_.Forward(z_[L - 1], static_cast<const int32_t*>(labels_.get()), &probs_);
  forward_done_ = true;
  return loss;
}

void Mlp::Backward(const GradReadyFn& on_grads_ready) {
  CHECK(forward_done_) << "Mlp::Backward without a successful Forward";
  forward_done_ = false;
  const size_t L = linears_.size();
  for (size_t l = 0; l < L; ++l) {
    backend_->Fill(dz_[l].data(), dz_[l].numel(), 0.0f);
    if (l + 1 < L) backend_->Fill(da_[l].data(), da_[l].numel(), 0.0f);
  }
  loss_.Backward(1.0f, &dz_[L - 1]);
  for (size_t l = L; l-- > 0;) {
    linears_[l].Backward(dz_[l], l > 0 ? &da_[l - 1] : nullptr);
    if (on_grads_ready) on_grads_ready(2 * l, 2 * l + 2);  // fc{l+1}.weight, .bias
    if (l > 0) tanhs_[l - 1].Backward(da_[l - 1], &dz_[l - 1]);
  }
}

std::vector<float> Mlp::Probabilities() const {
  std::vector<float> host(static_cast<size_t>(probs_.numel()));
  backend_->CopyToHost(host.data(), probs_.data(), host.size() * sizeof(float));
  return host;
}

}  // namespace fleet::trainer
