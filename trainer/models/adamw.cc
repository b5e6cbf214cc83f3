#include "trainer/models/adamw.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include <glog/logging.h>

namespace fleet::trainer {

namespace {

Status CheckFinite(float value, std::string_view key) {
  if (std::isfinite(value)) return Status::OK();
  return Status::InvalidArgument("must be finite, got " + std::to_string(value), key);
}

}  // namespace

Status AdamWConfig::Validate() const {
  for (auto [value, key] : {std::pair{beta1, "Optimizer.beta1"},
                            {beta2, "Optimizer.beta2"},
                            {eps, "Optimizer.epsilon"},
                            {weight_decay, "Optimizer.weight_decay"},
                            {clip_norm, "Optimizer.grad_clip.clip_norm"}}) {
    FLEET_RETURN_IF_ERROR(CheckFinite(value, key));
  }
  if (beta1 < 0.0f || beta1 >= 1.0f) {
    return Status::InvalidArgument("must be in [0, 1), got " + std::to_string(beta1),
                                   "Optimizer.beta1");
  }
  if (beta2 < 0.0f || beta2 >= 1.0f) {
    return Status::InvalidArgument("must be in [0, 1), got " + std::to_string(beta2),
                                   "Optimizer.beta2");
  }
  if (eps <= 0.0f) {
    return Status::InvalidArgument("must be > 0, got " + std::to_string(eps), "Optimizer.epsilon");
  }
  if (weight_decay < 0.0f) {
    return Status::InvalidArgument("must be >= 0, got " + std::to_string(weight_decay),
                                   "Optimizer.weight_decay");
  }
  if (clip_norm < 0.0f) {
    return Status::InvalidArgument(
        "must be >= 0 (0 = no clipping), got " + std::to_string(clip_norm),
        "Optimizer.grad_clip.clip_norm");
  }
  return Status::OK();
}

Status LrScheduleConfig::Validate() const {
  FLEET_RETURN_IF_ERROR(CheckFinite(max_lr, "Optimizer.lr.max_lr"));
  FLEET_RETURN_IF_ERROR(CheckFinite(min_lr, "Optimizer.lr.min_lr"));
  if (max_lr <= 0.0f) {
    return Status::InvalidArgument("must be > 0, got " + std::to_string(max_lr),
                                   "Optimizer.lr.max_lr");
  }
  if (min_lr < 0.0f || min_lr > max_lr) {
    return Status::InvalidArgument(
        "must be in [0, max_lr = " + std::to_string(max_lr) + "], got " + std::to_string(min_lr),
        "Optimizer.lr.min_lr");
  }
  if (decay_steps < 1) {
    return Status::InvalidArgument("must be >= 1, got " + std::to_string(decay_steps),
                                   "Optimizer.lr.decay_steps");
  }
  FLEET_RETURN_IF_ERROR(CheckFinite(warmup_min_lr, "Optimizer.lr.warmup_min_lr"));
  if (warmup_min_lr < 0.0f || warmup_min_lr > max_lr) {
    return Status::InvalidArgument("must be in [0, max_lr = " + std::to_string(max_lr) + "], got " +
                                       std::to_string(warmup_min_lr),
                                   "Optimizer.lr.warmup_min_lr");
  }
  if (step_increment < 1) {
    return Status::InvalidArgument("must be >= 1, got " + std::to_string(step_increment),
                                   "Optimizer.lr.use_increments");
  }
  if (warmup_steps < 0 || warmup_steps > decay_steps) {
    return Status::InvalidArgument(
        "warmup steps must be in [0, decay_steps = " + std::to_string(decay_steps) + "], got " +
            std::to_string(warmup_steps),
        "Optimizer.lr.warmup_rate");
  }
  return Status::OK();
}

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) {
  CHECK(config.Validate().ok()) << config.Validate().ToString();
}

float LrSchedule::At(int64_t step) const {
  const LrScheduleConfig& c = config_;
  const int64_t u = step * c.step_increment;
  if (u < c.warmup_steps) {
    const double w = static_cast<double>(c.warmup_steps);
    switch (c.warmup) {
      case LrWarmup::kLinear:
        return static_cast<float>(double{c.max_lr} * static_cast<double>(u + c.step_increment) / w);
      case LrWarmup::kLinearMin:
        return static_cast<float>(c.warmup_min_lr + (double{c.max_lr} - c.warmup_min_lr) *
                                                        static_cast<double>(u) / w);
      case LrWarmup::kLog:
        return static_cast<float>(c.warmup_min_lr + (double{c.max_lr} - c.warmup_min_lr) *
                                                        std::log(static_cast<double>(u) + 1.0) /
                                                        std::log(std::max(w, 2.0)));
    }
  }
  if (c.decay == LrDecay::kConstant) return c.max_lr;
  if (u >= c.decay_steps) return c.min_lr;
  const double ratio =
      static_cast<double>(u - c.warmup_steps) / static_cast<double>(c.decay_steps - c.warmup_steps);
  const double coeff =
      c.decay == LrDecay::kLinear ? 1.0 - ratio : 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return static_cast<float>(c.min_lr + coeff * (double{c.max_lr} - c.min_lr));
}

float ClipFactor(double global_norm, float clip_norm) {
  if (clip_norm <= 0.0f) return 1.0f;
  if (!std::isfinite(global_norm)) return static_cast<float>(global_norm);
  return static_cast<float>(clip_norm / std::max(global_norm, double{clip_norm}));
}

ElementRange ShardRange(size_t n, int degree, int rank) {
  CHECK_GE(degree, 1);
  CHECK(rank >= 0 && rank < degree) << "rank " << rank << " of " << degree;
  const size_t shard = (n + degree - 1) / degree;
  const size_t begin = std::min(n, shard * rank);
  return ElementRange{begin, std::min(n, begin + shard)};
}

AdamWRule::AdamWRule(const ParamTable& table, const AdamWConfig& config) : config_(config) {
  size_t offset = 0;
  for (const ParamSpec& spec : table) {
    const size_t n = static_cast<size_t>(spec.shape.numel());
    const bool decay = Decays(spec);
    if (!segments_.empty() && segments_.back().decay == decay) {
      segments_.back().end += n;
    } else {
      segments_.push_back(Segment{offset, offset + n, decay});
    }
    offset += n;
  }
}

void AdamWRule::Update(GptKernels* kernels, float* p, const float* g, float* m, float* v,
                       size_t begin, size_t end, int64_t t, float lr, float grad_scale) const {
  CHECK_GE(t, 1);
  CHECK_LE(begin, end);
  CHECK(segments_.empty() || end <= segments_.back().end) << end << " beyond the arena";
  AdamWStep step;
  step.lr = lr;
  step.beta1 = config_.beta1;
  step.beta2 = config_.beta2;
  step.eps = config_.eps;
  step.bias_correction1 = static_cast<float>(1.0 - std::pow(double{config_.beta1}, double(t)));
  step.bias_correction2 = static_cast<float>(1.0 - std::pow(double{config_.beta2}, double(t)));
  step.grad_scale = grad_scale;
  for (const Segment& s : segments_) {
    const size_t lo = std::max(s.begin, begin), hi = std::min(s.end, end);
    if (lo >= hi) continue;
    step.weight_decay = s.decay ? config_.weight_decay : 0.0f;
    const size_t at = lo - begin;
    kernels->AdamWUpdate(p + at, g + at, m + at, v + at, hi - lo, step);
  }
}

AdamW::AdamW(ParamArena* arena, GptKernels* kernels, const AdamWConfig& config, float lr)
    : Optimizer(arena), kernels_(kernels), rule_(arena->table(), config), lr_(lr) {
  CHECK(kernels != nullptr);
  CHECK(kernels->device() == arena->backend()->device());
  const Shape flat{static_cast<int64_t>(arena->size())};
  state_.push_back(arena->backend()->AllocateTensor(flat));  // m
  state_.push_back(arena->backend()->AllocateTensor(flat));  // v
}

void AdamW::Step() {
  float* grads = arena_->grads().data();
  float scale = 1.0f;
  if (rule_.config().clip_norm > 0.0f) {
    last_grad_norm_ = std::sqrt(kernels_->SumOfSquares(grads, arena_->size()));
    scale = ClipFactor(last_grad_norm_, rule_.config().clip_norm);
  }
  rule_.Update(kernels_, arena_->params().data(), grads, state_[0].data(), state_[1].data(), 0,
               arena_->size(), step_ + 1, lr_, scale);
  ++step_;
}

}  // namespace fleet::trainer
