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

Result<std::unique_ptr<CtrDnn>> CtrDnn::Create(const CtrDnnConfig& c, CpuBackend* backend) {
  CHECK(backend != nullptr);
  if (c.num_slots < 0 || c.embedding_dim <= 0 || c.num_dense < 0 ||
      c.num_slots * c.embedding_dim + c.num_dense <= 0) {
    return Status::InvalidArgument(
        "CtrDnn needs num_slots >= 0, embedding_dim > 0, num_dense >= 0 and some input");
  }
  for (int h : c.hidden) {
    if (h <= 0) return Status::InvalidArgument("Model.hidden entries must be > 0, got", std::to_string(h));
  }
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(CtrDnnParamTable(c), backend));
  FLEET_RETURN_IF_ERROR(arena.ParamsFromHost(LinearUniformInit(arena.table(), c.seed)));
  return std::unique_ptr<CtrDnn>(new CtrDnn(c, backend, std::move(arena)));
}

CtrDnn::CtrDnn(const CtrDnnConfig& config, CpuBackend* backend, ParamArena arena)
    : config_(config), backend_(backend), arena_(std::move(arena)) {
  const size_t L = config_.hidden.size() + 1;
  for (size_t l = 0; l < L; ++l) {
    linears_.emplace_back(arena_, "fc" + std::to_string(l + 1));
    if (l + 1 < L) relus_.emplace_back(backend_->pool());
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
  z_.clear(), dz_.clear(), a_.clear(), da_.clear();
  for (size_t l = 0; l < linears_.size(); ++l) {
    const Shape s{B, linears_[l].out_features()};
    z_.push_back(backend_->AllocateTensor(s));
    dz_.push_back(backend_->AllocateTensor(s));
    if (l + 1 < linears_.size()) {
      a_.push_back(backend_->AllocateTensor(s));
      da_.push_back(backend_->AllocateTensor(s));
    }
  }
  probs_ = backend_->AllocateTensor(Shape{B});
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
                                   " floats, want slots x B x dim = " +
                                   std::to_string(B * S * D));
  }
  if (static_cast<int64_t>(dense.size()) != B * config_.num_dense) {
    return Status::InvalidArgument("dense features have " + std::to_string(dense.size()) +
                                   " floats, want B x num_dense = " +
                                   std::to_string(B * config_.num_dense));
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
  std::copy(pooled.begin(), pooled.end(), pooled_.data());
  std::copy(dense.begin(), dense.end(), dense_.data());
  labels_.assign(labels.begin(), labels.end());

  std::vector<Tensor> parts;
  for (int s = 0; s < S; ++s) {
    parts.emplace_back(pooled_.data() + s * B * D, Shape{B, D});
  }
  parts.push_back(dense_);
  concat_.Forward(parts, &input_);

  const size_t L = linears_.size();
  const Tensor* in_act = &input_;
  for (size_t l = 0; l < L; ++l) {
    linears_[l].Forward(*in_act, &z_[l]);
    if (l + 1 < L) {
      relus_[l].Forward(z_[l], &a_[l]);
      in_act = &a_[l];
    }
  }
  const float loss = loss_.Forward(z_[L - 1], labels_.data(), &probs_);
  forward_done_ = true;
  return loss;
}

void CtrDnn::Backward(const GradReadyFn& on_grads_ready) {
  CHECK(forward_done_) << "CtrDnn::Backward without a successful Forward";
  forward_done_ = false;
  const size_t L = linears_.size();
  const auto zero = [this](Tensor& t) { backend_->Fill(t.data(), t.numel(), 0.0f); };
  for (size_t l = 0; l < L; ++l) {
    zero(dz_[l]);
    if (l + 1 < L) zero(da_[l]);
  }
  zero(dinput_);
  zero(dpooled_);
  loss_.Backward(1.0f, &dz_[L - 1]);
  for (size_t l = L; l-- > 0;) {
    Tensor* dx = l > 0 ? &da_[l - 1] : &dinput_;
    linears_[l].Backward(dz_[l], dx);
    if (on_grads_ready) on_grads_ready(2 * l, 2 * l + 2);
    if (l > 0) relus_[l - 1].Backward(da_[l - 1], &dz_[l - 1]);
  }
  // Split the input gradient back into the slots; dense features get none.
  const int S = config_.num_slots;
  std::vector<Tensor> slot_grads;
  for (int s = 0; s < S; ++s) slot_grads.push_back(pooled_grad(s));
  std::vector<Tensor*> dins;
  for (Tensor& t : slot_grads) dins.push_back(&t);
  dins.push_back(nullptr);
  concat_.Backward(dinput_, dins);
}

}  // namespace fleet::trainer
