#include "trainer/models/ctr_dnn.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "trainer/models/init.h"

namespace fleet::trainer {

ParamTable CtrDnnParamTable(const CtrDnnConfig& c) {
  ParamTable table;
  int in = c.num_slots * c.embedding_dim + c.num_dense;
  for (size_t l = 0; l < c.hidden.size(); ++l) {
    AddLinearParams(&table, "fc" + std::to_string(l + 1), in, c.hidden[l]);
    in = c.hidden[l];
  }
  AddLinearParams(&table, "fc" + std::to_string(c.hidden.size() + 1), in, 1);
  return table;
}

Result<std::unique_ptr<CtrDnn>> CtrDnn::Create(const CtrDnnConfig& c, Backend* backend) {
  CHECK(backend != nullptr);
  if (c.num_slots < 0 || c.embedding_dim <= 0 || c.num_dense < 0 ||
      c.num_slots * c.embedding_dim + c.num_dense <= 0) {
    return Status::InvalidArgument(
        "CtrDnn needs num_slots >= 0, embedding_dim > 0, num_dense >= 0 and some input");
  }
  for (int h : c.hidden) {
    if (h <= 0)
      return Status::InvalidArgument("Model.hidden entries must be > 0, got", std::to_string(h));
  }
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(CtrDnnParamTable(c), backend));
  FLEET_RETURN_IF_ERROR(arena.ParamsFromHost(LinearUniformInit(arena.table(), c.seed)));
  return std::unique_ptr<CtrDnn>(new CtrDnn(c, backend, std::move(arena)));
}

CtrDnn::CtrDnn(const CtrDnnConfig& config, Backend* backend, ParamArena arena)
    : config_(config), backend_(backend), arena_(std::move(arena)), concat_(backend), loss_(backend) {
  const size_t L = config_.hidden.size() + 1;
  for (size_t l = 0; l < L; ++l) {
    linears_.emplace_back(arena_, "fc" + std::to_string(l + 1),
                          l + 1 < L ? kernels::Activation::kRelu : kernels::Activation::kNone);
  }
}

void CtrDnn::EnsureBatch(int B) {
  if (B == batch_) return;
  batch_ = B;
  const int S = config_.num_slots, D = config_.embedding_dim;
  pooled_ = backend_->AllocateTensor(Shape{S, B, D});
  dpooled_ = backend_->AllocateTensor(Shape{S, B, D});
  dense_ = backend_->AllocateTensor(Shape{B, config_.num_dense});
  input_ = backend_->AllocateTensor(Shape{B, input_width()});
  dinput_ = backend_->AllocateTensor(Shape{B, input_width()});
  y_.clear(), dy_.clear();
  for (size_t l = 0; l < linears_.size(); ++l) {
    const Shape s{B, linears_[l].out_features()};
    y_.push_back(backend_->AllocateTensor(s));
    dy_.push_back(backend_->AllocateTensor(s));
  }
  probs_ = backend_->AllocateTensor(Shape{B});
  labels_ = backend_->AllocateTensor(Shape{B});
  slot_parts_.clear(), slot_grads_.clear(), slot_grad_ptrs_.clear();
  for (int s = 0; s < S; ++s) {
    slot_parts_.emplace_back(pooled_.data() + int64_t{s} * B * D, Shape{B, D});
    slot_grads_.push_back(pooled_grad(s));
  }
  slot_parts_.push_back(dense_);
  for (Tensor& t : slot_grads_) slot_grad_ptrs_.push_back(&t);
  slot_grad_ptrs_.push_back(nullptr);  // dense features get no gradient
}

void CtrDnn::ProbabilitiesToHost(std::span<float> out) const {
  CHECK_EQ(static_cast<int64_t>(out.size()), probs_.numel());
  backend_->CopyToHost(out.data(), probs_.data(), out.size() * sizeof(float));
}

void CtrDnn::PooledGradToHost(std::span<float> out) const {
  CHECK_EQ(static_cast<int64_t>(out.size()), dpooled_.numel());
  backend_->CopyToHost(out.data(), dpooled_.data(), out.size() * sizeof(float));
}

Tensor CtrDnn::pooled_grad(int slot) const {
  CHECK(slot >= 0 && slot < config_.num_slots);
  const int64_t n = int64_t{batch_} * config_.embedding_dim;
  return Tensor(dpooled_.data() + slot * n, Shape{batch_, config_.embedding_dim});
}

Result<float> CtrDnn::Forward(std::span<const float> pooled, std::span<const float> dense,
                              std::span<const float> labels) {
  const int64_t B = static_cast<int64_t>(labels.size());
  const int S = config_.num_slots, D = config_.embedding_dim;
  if (B == 0) return Status::InvalidArgument("empty batch");
  if (static_cast<int64_t>(pooled.size()) != B * S * D) {
    return Status::InvalidArgument("pooled embeddings have " + std::to_string(pooled.size()) +
                                   " floats, want slots x B x dim = " + std::to_string(B * S * D));
  }
  if (static_cast<int64_t>(dense.size()) != B * config_.num_dense) {
    return Status::InvalidArgument(
        "dense features have " + std::to_string(dense.size()) +
        " floats, want B x num_dense = " + std::to_string(B * config_.num_dense));
  }
  for (int64_t b = 0; b < B; ++b) {
    if (!(labels[b] >= 0.0f && labels[b] <= 1.0f)) {
      return Status::InvalidArgument("label outside [0, 1]", "sample " + std::to_string(b));
    }
  }
  for (size_t i = 0; i < dense.size(); ++i) {
    if (!std::isfinite(dense[i])) {
      return Status::InvalidArgument("non-finite dense feature",
                                     "sample " + std::to_string(i / config_.num_dense));
    }
  }
  EnsureBatch(static_cast<int>(B));
  backend_->CopyFromHost(pooled_.data(), pooled.data(), pooled.size_bytes());
  backend_->CopyFromHost(dense_.data(), dense.data(), dense.size_bytes());
  backend_->CopyFromHost(labels_.data(), labels.data(), labels.size_bytes());

  concat_.Forward(slot_parts_, &input_);

  const size_t L = linears_.size();
  for (size_t l = 0; l < L; ++l) linears_[l].Forward(l == 0 ? input_ : y_[l - 1], &y_[l]);
  const float loss = loss_.Forward(y_[L - 1], labels_.data(), &probs_);
  forward_done_ = true;
  return loss;
}

void CtrDnn::Backward(const GradReadyFn& on_grads_ready) {
  CHECK(forward_done_) << "CtrDnn::Backward without a successful Forward";
  forward_done_ = false;
  const size_t L = linears_.size();
  const auto zero = [this](Tensor& t) { backend_->Fill(t.data(), t.numel(), 0.0f); };
  // The loss and the concat add into their outputs; every other gradient
  // buffer is overwritten by the layer that produces it.
  zero(dy_[L - 1]);
  zero(dpooled_);
  loss_.Backward(1.0f, &dy_[L - 1]);
  for (size_t l = L; l-- > 0;) {
    linears_[l].Backward(dy_[l], l > 0 ? &dy_[l - 1] : &dinput_, GradMode::kOverwrite);
    if (on_grads_ready) on_grads_ready(2 * l, 2 * l + 2);
  }
  // Split the input gradient back into the slots.
  concat_.Backward(dinput_, slot_grad_ptrs_);
}

}  // namespace fleet::trainer
