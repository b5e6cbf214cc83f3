#include "trainer/optimizer.h"

namespace fleet::trainer {

void Sgd::Step() {
  arena_->backend()->SgdUpdate(arena_->params().data(), arena_->grads().data(), arena_->size(),
                               lr_, weight_decay_);
  ++step_;
}

Adam::Adam(ParamArena* arena, const kernels::AdamHyper& hyper)
    : Optimizer(arena), hyper_(hyper) {
  const Shape flat{static_cast<int64_t>(arena->size())};
  state_.push_back(arena->backend()->AllocateTensor(flat));  // m
  state_.push_back(arena->backend()->AllocateTensor(flat));  // v
}

void Adam::Step() {
  ++step_;
  arena_->backend()->AdamUpdate(arena_->params().data(), state_[0].data(), state_[1].data(),
                                arena_->grads().data(), arena_->size(), hyper_, step_);
}

Result<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerConfig& c, ParamArena* arena) {
  if (!(c.lr > 0.0f)) {
    return Status::InvalidArgument("Optimizer.lr must be > 0, got " + std::to_string(c.lr));
  }
  if (!(c.weight_decay >= 0.0f)) {
    return Status::InvalidArgument("Optimizer.weight_decay must be >= 0, got " +
                                   std::to_string(c.weight_decay));
  }
  if (c.type == "sgd") return std::unique_ptr<Optimizer>(std::make_unique<Sgd>(arena, c.lr, c.weight_decay));
  if (c.type == "adam") {
    if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f) || !(c.beta2 >= 0.0f && c.beta2 < 1.0f)) {
      return Status::InvalidArgument("Optimizer.beta1 and Optimizer.beta2 must be in [0, 1)");
    }
    if (!(c.eps > 0.0f)) return Status::InvalidArgument("Optimizer.eps must be > 0");
    const kernels::AdamHyper h{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
    return std::unique_ptr<Optimizer>(std::make_unique<Adam>(arena, h));
  }
  return Status::InvalidArgument("Optimizer.type must be \"sgd\" or \"adam\"", c.type);
}

}  // namespace fleet::trainer
