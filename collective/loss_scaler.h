// DynamicLossScaler: float16 training's dynamic loss scaling (Micikevicius et
// al. 2018; Paddle's AMP decorator with use_dynamic_loss_scaling). The loss is
// multiplied by scale() before backward so that small gradients survive in
// float16; after backward the gradients are checked: any inf or NaN means the
// scale was too large and the step is skipped; after decr_every_n_overflows
// such steps in a row the scale halves; after incr_every_n_steps clean
// steps in a row it doubles, to use float16's range. A static scale
// (dynamic false: DeepSpeed's fixed loss_scale) never moves; overflowing
// steps are still skipped.
// bfloat16 has float32's range and needs none of this (scale 1).
//
// Use per optimizer step (gradient accumulation: every micro-batch's
// grad_scale is scale() / k):
//   forward with GptForwardOptions::grad_scale = scaler.scale() (/ k); backward
//   LossScaleDecision d = scaler.Check(kernels, grads, n);   // or Update(sum)
//   if (d.apply) AdamW step with grad_scale = d.inv_scale * ClipFactor(
//                    sqrt(d.grad_sum_of_squares), clip_norm)
//   else         skip the step (zero the gradients; the batch is lost)
// With data parallelism, sum the ranks' SumOfSquares (an all-reduce) and call
// Update(total): every rank then takes the same decision.
//
// The overflow check reuses the sum of squares that global-norm clipping
// needs anyway (a sum with an inf or NaN term is not finite), so it costs no
// extra pass over the gradients.
//
// Thread safety: none; one thread drives it (it is host logic only).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/status.h"
#include "trainer/kernels/gpt_kernels.h"

namespace fleet::trainer {

struct LossScalerConfig {
  // The first scale: `Engine.mix_precision.scale_loss` (default 32768 = 2^15,
  // Paddle's). Too large costs a few skipped steps at the start; too small
  // loses small gradients until it has doubled up.
  double init_scale = 32768.0;
  // Clean steps in a row before the scale grows (Paddle's
  // incr_every_n_steps, default 1000). Smaller tracks the largest safe scale
  // more closely at the price of more overflowing (skipped) steps.
  int64_t incr_every_n_steps = 1000;
  // Growth on a clean run and shrink on overflows (Paddle's incr_ratio 2.0
  // and decr_ratio 0.5).
  double incr_ratio = 2.0;
  double decr_ratio = 0.5;
  // Overflowing steps in a row before the scale shrinks (Paddle's
  // decr_every_n_nan_or_inf, default 2; DeepSpeed's hysteresis). 1 shrinks
  // on every overflow, which skips fewer steps after a spike; more rides
  // out a single spike without losing the scale. The count restarts on a
  // clean step (and on resume).
  int64_t decr_every_n_overflows = 1;
  // False: the scale stays init_scale (DeepSpeed's static loss_scale > 0).
  bool dynamic = true;
  // The scale stays within [min_scale, max_scale]. At min_scale an overflow
  // still skips the step (gradients with inf are unusable at any scale).
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24

  // InvalidArgument naming the field unless: all values finite,
  // 0 < min_scale <= init_scale <= max_scale, incr_every_n_steps >= 1,
  // decr_every_n_overflows >= 1, incr_ratio > 1, 0 < decr_ratio < 1.
  Status Validate() const;
};

// What to do with one step's gradients.
struct LossScaleDecision {
  // False: the gradients overflowed; do not update the parameters.
  bool apply = false;
  // Multiply the gradients by this to undo the loss scale (1 / the scale the
  // step was computed with), e.g. as AdamWStep::grad_scale.
  float inv_scale = 1.0f;
  // Sum of squares of the unscaled gradients (for global-norm clipping);
  // not finite when apply is false.
  double grad_sum_of_squares = 0.0;
};

class DynamicLossScaler {
 public:
  // InvalidArgument from config.Validate().
  static Result<DynamicLossScaler> Create(const LossScalerConfig& config);

  // The factor for this step's loss (GptForwardOptions::grad_scale).
  float scale() const { return static_cast<float>(scale_); }
  // Clean steps since the last change of scale or overflow.
  int64_t clean_steps() const { return clean_steps_; }
  const LossScalerConfig& config() const { return config_; }

  // Decides from the sum of squares of this step's scaled gradients (all
  // ranks' sums added) and moves the scale for the next step.
  LossScaleDecision Update(double scaled_grad_sum_of_squares);
  // Update(kernels->SumOfSquares(grads, n)): one process's gradients
  // `grads` [n] on kernels->device(). Blocks for the sum (a CUDA twin waits
  // for backward to finish).
  LossScaleDecision Check(GptKernels* kernels, const float* grads, size_t n);

  // Resumes from a checkpoint's scale() and clean_steps(). InvalidArgument
  // (nothing changed) for a scale outside [min_scale, max_scale] or a
  // negative or too large count.
  Status Restore(double scale, int64_t clean_steps);

 private:
  explicit DynamicLossScaler(const LossScalerConfig& config)
      : config_(config), scale_(config.init_scale) {}

  LossScalerConfig config_;
  double scale_;
  int64_t clean_steps_ = 0;
  int64_t overflows_ = 0;  // overflowing steps in a row
};

}  // namespace fleet::trainer
