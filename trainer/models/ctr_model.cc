#include "trainer/models/ctr_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "trainer/models/init.h"

namespace fleet::trainer {
namespace {

constexpr int kMaxCrossLayers = 16;

std::string Fc(size_t l) { return "fc" + std::to_string(l); }
std::string CrossName(size_t l) { return "cross" + std::to_string(l); }

int InputWidth(const CtrModelConfig& c) { return c.num_slots * c.embedding_dim + c.num_dense; }

int HeadInputs(const CtrModelConfig& c) {
  const int cross = c.cross_layers > 0 ? InputWidth(c) : 0;
  const int deep = c.hidden.empty() ? 0 : c.hidden.back();
  return cross + deep > 0 ? cross + deep : InputWidth(c);
}

}  // namespace

ParamTable CtrModelParamTable(const CtrModelConfig& c) {
  ParamTable table;
  int in = InputWidth(c);
  for (size_t l = 0; l < c.hidden.size(); ++l) {
    AddLinearParams(&table, Fc(l + 1), in, c.hidden[l]);
    in = c.hidden[l];
  }
  for (int l = 0; l < c.cross_layers; ++l) {
    AddLinearParams(&table, CrossName(l + 1), InputWidth(c), InputWidth(c));
  }
  AddLinearParams(&table, Fc(c.hidden.size() + 1), HeadInputs(c), 1);
  return table;
}

Result<std::unique_ptr<CtrModel>> CtrModel::Create(const CtrModelConfig& c, Backend* backend) {
  CHECK(backend != nullptr);
  if (c.num_slots < 0 || c.embedding_dim <= 0 || c.num_dense < 0 || InputWidth(c) <= 0) {
    return Status::InvalidArgument(
        "a CTR model needs num_slots >= 0, embedding_dim > 0, num_dense >= 0 and some input");
  }
  if ((c.wide || c.fm) && c.num_slots < 1) {
    return Status::InvalidArgument("the wide and fm parts need sparse fields");
  }
  if (c.fm && c.embedding_dim < 2) {
    return Status::InvalidArgument(
        "fm takes each field's float 0 as its first-order weight and the rest as its embedding: "
        "the pull width must be >= 2 (e.g. accessor ctr: embed_dim 1 + dim), got " +
        std::to_string(c.embedding_dim));
  }
  if (c.cross_layers < 0 || c.cross_layers > kMaxCrossLayers) {
    return Status::InvalidArgument("model.cross_layers must be in [0, " +
                                   std::to_string(kMaxCrossLayers) + "], got " +
                                   std::to_string(c.cross_layers));
  }
  for (int h : c.hidden) {
    if (h <= 0)
      return Status::InvalidArgument("Model.hidden entries must be > 0, got", std::to_string(h));
  }
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(CtrModelParamTable(c), backend));
  FLEET_RETURN_IF_ERROR(arena.ParamsFromHost(LinearUniformInit(arena.table(), c.seed)));
  return std::unique_ptr<CtrModel>(new CtrModel(c, backend, std::move(arena)));
}

CtrModel::CtrModel(const CtrModelConfig& config, Backend* backend, ParamArena arena)
    : config_(config),
      backend_(backend),
      arena_(std::move(arena)),
      fields_{config.num_slots, config.embedding_dim, InputWidth(config)},
      concat_(backend),
      head_concat_(backend),
      head_(arena_, Fc(config.hidden.size() + 1)),
      wide_(backend, fields_, /*offset=*/0, /*width=*/1),
      fm_(backend, fields_, /*offset=*/1, config.embedding_dim - 1),
      loss_(backend) {
  for (size_t l = 0; l < config_.hidden.size(); ++l) {
    deep_.emplace_back(arena_, Fc(l + 1), kernels::Activation::kRelu);
  }
  for (int l = 0; l < config_.cross_layers; ++l) cross_.emplace_back(arena_, CrossName(l + 1));
}

int CtrModel::head_inputs() const { return HeadInputs(config_); }

void CtrModel::EnsureBatch(int B) {
  if (B == batch_) return;
  batch_ = B;
  const int S = config_.num_slots, D = config_.embedding_dim, in = input_width();
  pooled_ = backend_->AllocateTensor(Shape{S, B, D});
  dpooled_ = backend_->AllocateTensor(Shape{S, B, D});
  dense_ = backend_->AllocateTensor(Shape{B, config_.num_dense});
  input_ = backend_->AllocateTensor(Shape{B, in});
  dinput_ = backend_->AllocateTensor(Shape{B, in});
  h_.clear(), dh_.clear(), c_.clear(), dc_.clear();
  for (const Linear& l : deep_) {
    h_.push_back(backend_->AllocateTensor(Shape{B, l.out_features()}));
    dh_.push_back(backend_->AllocateTensor(Shape{B, l.out_features()}));
  }
  for (size_t l = 0; l < cross_.size(); ++l) {
    c_.push_back(backend_->AllocateTensor(Shape{B, in}));
    dc_.push_back(backend_->AllocateTensor(Shape{B, in}));
  }
  head_parts_.clear(), head_grad_ptrs_.clear();
  if (!cross_.empty() && !deep_.empty()) {
    head_in_ = backend_->AllocateTensor(Shape{B, head_inputs()});
    dhead_in_ = backend_->AllocateTensor(Shape{B, head_inputs()});
    head_parts_ = {c_.back(), h_.back()};
    head_grad_ptrs_ = {&dc_.back(), &dh_.back()};
  }
  logits_ = backend_->AllocateTensor(Shape{B, 1});
  dlogits_ = backend_->AllocateTensor(Shape{B, 1});
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

void CtrModel::ProbabilitiesToHost(std::span<float> out) const {
  CHECK_EQ(static_cast<int64_t>(out.size()), probs_.numel());
  backend_->CopyToHost(out.data(), probs_.data(), out.size() * sizeof(float));
}

void CtrModel::PooledGradToHost(std::span<float> out) const {
  CHECK_EQ(static_cast<int64_t>(out.size()), dpooled_.numel());
  backend_->CopyToHost(out.data(), dpooled_.data(), out.size() * sizeof(float));
}

Tensor CtrModel::pooled_grad(int slot) const {
  CHECK(slot >= 0 && slot < config_.num_slots);
  const int64_t n = int64_t{batch_} * config_.embedding_dim;
  return Tensor(dpooled_.data() + slot * n, Shape{batch_, config_.embedding_dim});
}

Result<float> CtrModel::Forward(std::span<const float> pooled, std::span<const float> dense,
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
  for (size_t l = 0; l < deep_.size(); ++l) deep_[l].Forward(l == 0 ? input_ : h_[l - 1], &h_[l]);
  for (size_t l = 0; l < cross_.size(); ++l) {
    cross_[l].Forward(input_, l == 0 ? input_ : c_[l - 1], &c_[l]);
  }
  const Tensor* head_in = &input_;
  if (!cross_.empty() && !deep_.empty()) {
    head_concat_.Forward(head_parts_, &head_in_);
    head_in = &head_in_;
  } else if (!cross_.empty()) {
    head_in = &c_.back();
  } else if (!deep_.empty()) {
    head_in = &h_.back();
  }
  head_.Forward(*head_in, &logits_);
  if (config_.wide) wide_.Forward(input_, &logits_, /*beta=*/1.0f);
  if (config_.fm) fm_.Forward(input_, &logits_, /*beta=*/1.0f);
  const float loss = loss_.Forward(logits_, labels_.data(), &probs_);
  forward_done_ = true;
  return loss;
}

void CtrModel::Backward(const GradReadyFn& on_grads_ready) {
  CHECK(forward_done_) << "CtrModel::Backward without a successful Forward";
  forward_done_ = false;
  const auto zero = [this](Tensor& t) { backend_->Fill(t.data(), t.numel(), 0.0f); };
  const auto ready = [&](size_t first_tensor) {
    if (on_grads_ready) on_grads_ready(first_tensor, first_tensor + 2);
  };
  const size_t H = deep_.size(), L = cross_.size();
  // The loss, the sums over fields, the concatenations and the cross
  // layers add into their gradient outputs; the other buffers are
  // overwritten by the layer producing them.
  zero(dlogits_);
  zero(dinput_);
  zero(dpooled_);
  for (Tensor& t : dc_) zero(t);
  loss_.Backward(1.0f, &dlogits_);
  if (config_.fm) fm_.Backward(dlogits_, &dinput_);
  if (config_.wide) wide_.Backward(dlogits_, &dinput_);
  if (L > 0 && H > 0) {
    zero(dh_.back());
    head_.Backward(dlogits_, &dhead_in_, GradMode::kOverwrite);
    head_concat_.Backward(dhead_in_, head_grad_ptrs_);
  } else if (L > 0) {
    head_.Backward(dlogits_, &dc_.back(), GradMode::kAdd);
  } else if (H > 0) {
    head_.Backward(dlogits_, &dh_.back(), GradMode::kOverwrite);
  } else {
    head_.Backward(dlogits_, &dinput_, GradMode::kAdd);
  }
  ready(2 * (H + L));
  for (size_t l = H; l-- > 0;) {
    deep_[l].Backward(dh_[l], l > 0 ? &dh_[l - 1] : &dinput_,
                      l > 0 ? GradMode::kOverwrite : GradMode::kAdd);
    ready(2 * l);
  }
  for (size_t l = L; l-- > 0;) {
    cross_[l].Backward(dc_[l], &dinput_, l > 0 ? &dc_[l - 1] : &dinput_);
    ready(2 * (H + l));
  }
  // Split the input gradient back into the slots.
  concat_.Backward(dinput_, slot_grad_ptrs_);
}

}  // namespace fleet::trainer
