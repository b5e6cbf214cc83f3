#include "collective/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <utility>

namespace fleet::trainer {

Status LossScalerConfig::Validate() const {
  auto bad = [](std::string_view field, double value) {
    return Status::InvalidArgument("loss scaler: bad " + std::string(field),
                                   std::to_string(value));
  };
  for (auto [field, value] : {std::pair<std::string_view, double>{"init_scale", init_scale},
                              {"incr_ratio", incr_ratio},
                              {"decr_ratio", decr_ratio},
                              {"min_scale", min_scale},
                              {"max_scale", max_scale}}) {
    if (!std::isfinite(value)) return bad(field, value);
  }
  if (!(min_scale > 0.0)) return bad("min_scale (must be > 0)", min_scale);
  if (!(max_scale >= min_scale)) return bad("max_scale (must be >= min_scale)", max_scale);
  if (!(init_scale >= min_scale && init_scale <= max_scale)) {
    return bad("init_scale (Engine.mix_precision.scale_loss; must be in [min_scale, max_scale])",
               init_scale);
  }
  if (decr_every_n_overflows < 1) {
    return bad("decr_every_n_overflows (must be >= 1)",
               static_cast<double>(decr_every_n_overflows));
  }
  if (incr_every_n_steps < 1) {
    return bad("incr_every_n_steps (must be >= 1)", static_cast<double>(incr_every_n_steps));
  }
  if (!(incr_ratio > 1.0)) return bad("incr_ratio (must be > 1)", incr_ratio);
  if (!(decr_ratio > 0.0 && decr_ratio < 1.0)) return bad("decr_ratio (must be in (0, 1))", decr_ratio);
  return Status::OK();
}

Result<DynamicLossScaler> DynamicLossScaler::Create(const LossScalerConfig& config) {
  FLEET_RETURN_IF_ERROR(config.Validate());
  return DynamicLossScaler(config);
}

LossScaleDecision DynamicLossScaler::Update(double scaled_grad_sum_of_squares) {
  LossScaleDecision d;
  d.inv_scale = static_cast<float>(1.0 / scale_);
  // A finite sum of squares of float32 values cannot overflow a double
  // (n FLT_MAX^2 < DBL_MAX for any n that fits in memory), so a non-finite
  // sum means an inf or NaN gradient.
  if (!std::isfinite(scaled_grad_sum_of_squares)) {
    d.apply = false;
    d.grad_sum_of_squares = scaled_grad_sum_of_squares;
    clean_steps_ = 0;
    if (config_.dynamic && ++overflows_ >= config_.decr_every_n_overflows) {
      scale_ = std::max(config_.min_scale, scale_ * config_.decr_ratio);
      overflows_ = 0;
    }
    return d;
  }
  d.apply = true;
  d.grad_sum_of_squares = scaled_grad_sum_of_squares / (scale_ * scale_);
  overflows_ = 0;
  if (config_.dynamic && ++clean_steps_ >= config_.incr_every_n_steps) {
    scale_ = std::min(config_.max_scale, scale_ * config_.incr_ratio);
    clean_steps_ = 0;
  }
  return d;
}

LossScaleDecision DynamicLossScaler::Check(GptKernels* kernels, const float* grads, size_t n) {
  return Update(kernels->SumOfSquares(grads, n));
}

Status DynamicLossScaler::Restore(double scale, int64_t clean_steps) {
  if (!(scale >= config_.min_scale && scale <= config_.max_scale)) {
    return Status::InvalidArgument("loss scale out of [min_scale, max_scale]",
                                   std::to_string(scale));
  }
  if (clean_steps < 0 || clean_steps >= config_.incr_every_n_steps) {
    return Status::InvalidArgument("loss scaler clean step count out of range",
                                   std::to_string(clean_steps));
  }
  scale_ = scale;
  clean_steps_ = clean_steps;
  return Status::OK();
}

}  // namespace fleet::trainer
