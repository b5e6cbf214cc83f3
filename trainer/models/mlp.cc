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
    if (s <= 0)
      return Status::InvalidArgument("Model.sizes entries must be > 0, got", std::to_string(s));
  }
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(MlpParamTable(config), backend));
  FLEET_RETURN_IF_ERROR(arena.ParamsFromHost(LinearUniformInit(arena.table(), config.seed)));
  return std::unique_ptr<Mlp>(new Mlp(config, backend, std::move(arena)));
}

Mlp::Mlp(const MlpConfig& config, Backend* backend, ParamArena arena)
    : config_(config), backend_(backend), arena_(std::move(arena)), loss_(backend) {
  const size_t L = config_.sizes.size() - 1;
  for (size_t l = 0; l < L; ++l) {
    linears_.emplace_back(arena_, "fc" + std::to_string(l + 1),
                          l + 1 < L ? kernels::Activation::kTanh : kernels::Activation::kNone);
  }
}

void Mlp::EnsureBatch(int B) {
  if (B == batch_) return;
  batch_ = B;
  const size_t L = linears_.size();
  if (!backend_->device().is_cpu()) {
    x_buffer_ = backend_->AllocateTensor(Shape{B, config_.sizes[0]});
    labels_ = backend_->AllocateBytes(sizeof(int32_t) * B);
  }
  y_.clear(), dy_.clear();
  for (size_t l = 0; l < L; ++l) {
    const Shape s{B, config_.sizes[l + 1]};
    y_.push_back(backend_->AllocateTensor(s));
    dy_.push_back(backend_->AllocateTensor(s));
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
  const int32_t* device_labels = labels.data();
  if (backend_->device().is_cpu()) {
    // Host memory is the device's: view the caller's batch instead of
    // copying it (see the header).
    x_ = Tensor(const_cast<float*>(x.data()), Shape{B, in});
  } else {
    x_ = x_buffer_;
    backend_->CopyFromHost(x_.data(), x.data(), x.size_bytes());
    backend_->CopyFromHost(labels_.get(), labels.data(), labels.size_bytes());
    device_labels = static_cast<const int32_t*>(labels_.get());
  }

  const size_t L = linears_.size();
  for (size_t l = 0; l < L; ++l) linears_[l].Forward(l == 0 ? x_ : y_[l - 1], &y_[l]);
  const float loss = loss_.Forward(y_[L - 1], device_labels, &probs_);
  forward_done_ = true;
  return loss;
}

void Mlp::Backward(const GradReadyFn& on_grads_ready, float grad_scale) {
  CHECK(forward_done_) << "Mlp::Backward without a successful Forward";
  forward_done_ = false;
  const size_t L = linears_.size();
  // The loss adds into the logits' gradient; every other dy_ is overwritten
  // by the next layer's backward.
  backend_->Fill(dy_[L - 1].data(), dy_[L - 1].numel(), 0.0f);
  loss_.Backward(grad_scale, &dy_[L - 1]);
  for (size_t l = L; l-- > 0;) {
    linears_[l].Backward(dy_[l], l > 0 ? &dy_[l - 1] : nullptr, GradMode::kOverwrite);
    if (on_grads_ready) on_grads_ready(2 * l, 2 * l + 2);  // fc{l+1}.weight, .bias
  }
}

std::vector<float> Mlp::Probabilities() const {
  std::vector<float> host(static_cast<size_t>(probs_.numel()));
  backend_->CopyToHost(host.data(), probs_.data(), host.size() * sizeof(float));
  return host;
}

}  // namespace fleet::trainer
