// AdamW with decoupled weight decay (Loshchilov & Hutter 2019), global-norm
// gradient clipping, and the learning-rate schedule GPT pretraining uses
// (linear warmup, then cosine decay to a minimum).
//
// The pieces are separate so that a sharded optimizer can reuse them:
//   * AdamWRule holds the math and which parameters decay; Update() runs one
//     step over any contiguous range [begin, end) of the flat arena, given
//     pointers to that range's params, grads and moments. A rank owning the
//     shard ShardRange(arena.size(), degree, rank) (ZeRO stage 1 or 2) keeps
//     m and v for its shard only and calls Update on it after the gradient
//     reduce-scatter; the shard may start and end inside a tensor.
//   * Global-norm clipping is a factor (ClipFactor) applied inside the update
//     as grad_scale, so it costs no extra pass over the gradients. The norm
//     is sqrt of a sum of squares: a sharded optimizer sums its shard's
//     squares (GptKernels::SumOfSquares), all-reduces the sums, then calls
//     ClipFactor.
//   * AdamW (the Optimizer) is the unsharded composition over the whole
//     arena, checkpointable like Sgd and Adam (trainer/checkpoint.h).
//
// Thread safety: none; everything runs on the thread that drives the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "trainer/kernels/gpt_kernels.h"
#include "trainer/optimizer.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

// The Optimizer section of a GPT job (FleetX's keys).
struct AdamWConfig {
  // Optimizer.beta1 / beta2: moment decay rates. 0.9 / 0.999 are FleetX's
  // and PyTorch's defaults; GPT-3 used beta2 = 0.95 for stability at scale.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  // Optimizer.epsilon: added to sqrt(v); larger values damp updates of
  // parameters with tiny gradients.
  float eps = 1e-8f;
  // Optimizer.weight_decay: decoupled decay rate (p -= lr * wd * p), applied
  // to weight matrices and embeddings only (never biases or LayerNorm).
  // FleetX's GPT configs use 0.01; GPT-3 used 0.1.
  float weight_decay = 0.01f;
  // Optimizer.grad_clip.clip_norm: gradients are scaled so that their global
  // L2 norm is at most this (Paddle's ClipGradByGlobalNorm); 0 = no clipping.
  float clip_norm = 1.0f;

  // InvalidArgument naming the key for betas outside [0, 1), eps <= 0, or a
  // negative weight_decay or clip_norm (or any non-finite value).
  Status Validate() const;
};

// Optimizer.lr: warmup to max_lr, then a decay to min_lr at decay_steps,
// min_lr after. FleetX's CosineAnnealingWithWarmupDecay by default;
// Megatron's --lr-decay-style and DeepSpeed's WarmupLR / WarmupDecayLR
// (collective/config/megatron_args.h) choose the other shapes.
enum class LrDecay {
  kCosine,    // min_lr + (max_lr - min_lr) (1 + cos(pi r)) / 2
  kLinear,    // min_lr + (max_lr - min_lr) (1 - r)
  kConstant,  // max_lr
};
enum class LrWarmup {
  kLinear,     // max_lr (u + 1) / warmup: FleetPS's (no step at lr 0)
  kLinearMin,  // warmup_min_lr + (max_lr - warmup_min_lr) u / warmup: DeepSpeed's "linear"
  kLog,  // warmup_min_lr + (max_lr - warmup_min_lr) log(u + 1) / log(warmup): DeepSpeed's "log"
};
struct LrScheduleConfig {
  // Optimizer.lr.max_lr: the peak learning rate. Optimizer.lr.min_lr: the
  // floor after decay (FleetX's 345M config: 1e-4 and 1e-5).
  float max_lr = 1e-4f;
  float min_lr = 1e-5f;
  // Warmup units (FleetX gives Optimizer.lr.warmup_rate; units = rate *
  // decay_steps) and the unit at which the decay reaches min_lr.
  int64_t warmup_steps = 0;
  int64_t decay_steps = 360000;
  LrDecay decay = LrDecay::kCosine;
  LrWarmup warmup = LrWarmup::kLinear;
  // Where kLinearMin and kLog warmups start (DeepSpeed's warmup_min_lr).
  float warmup_min_lr = 0.0f;
  // Units the schedule advances per optimizer step: 1 (steps), or the
  // global batch for FleetX's Optimizer.lr.use_increments (warmup and
  // decay_steps then count samples).
  int64_t step_increment = 1;

  // InvalidArgument naming the key unless 0 <= min_lr <= max_lr, max_lr > 0,
  // 0 <= warmup_min_lr <= max_lr, 0 <= warmup_steps <= decay_steps,
  // decay_steps >= 1, step_increment >= 1.
  Status Validate() const;
};

class LrSchedule {
 public:
  // REQUIRES: config.Validate().ok().
  explicit LrSchedule(const LrScheduleConfig& config);
  // The learning rate of the optimizer step taken after `step` steps (0 for
  // the first step), at unit u = step * step_increment:
  //   u < warmup_steps:   the warmup (LrWarmup)
  //   u >= decay_steps:   min_lr (max_lr for kConstant)
  //   otherwise:          the decay (LrDecay) at r = (u - warmup_steps) /
  //                       (decay_steps - warmup_steps)
  // (FleetX's CosineAnnealingWithWarmupDecay starts warmup at lr 0 for the
  // first step; kLinear starts at max_lr / warmup_steps, so no step is
  // wasted; afterwards they agree.)
  float At(int64_t step) const;

 private:
  const LrScheduleConfig config_;
};

// Paddle's ClipGradByGlobalNorm: clip_norm / max(global_norm, clip_norm),
// i.e. 1 when the norm is within bounds. clip_norm 0 means no clipping (1).
// A non-finite norm gives a non-finite factor, so the step's NaN/Inf shows
// in the parameters and the loss rather than being hidden.
float ClipFactor(double global_norm, float clip_norm);

// The contiguous shard [begin, end) of n elements that rank `rank` of
// `degree` owns: shards of ceil(n / degree) elements in rank order, the
// last ones shorter or empty. REQUIRES: 0 <= rank < degree.
struct ElementRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};
ElementRange ShardRange(size_t n, int degree, int rank);

class AdamWRule {
 public:
  // Decay flags from the table (Decays()); `config` as validated.
  AdamWRule(const ParamTable& table, const AdamWConfig& config);

  // Weight decay applies to tensors of 2 or more dims (weight matrices and
  // embeddings), never to 1-dim ones (biases, LayerNorm weights and biases).
  static bool Decays(const ParamSpec& spec) { return spec.shape.ndim() >= 2; }

  // One AdamW step number t (>= 1) over arena elements [begin, end). `p`,
  // `g`, `m`, `v` point at element `begin` of the params, grads and moments
  // (m and v may be a shard's own buffers). grad_scale multiplies every
  // gradient first (the clip factor, or 1). Runs on `kernels`.
  // REQUIRES: begin <= end <= arena size.
  void Update(GptKernels* kernels, float* p, const float* g, float* m, float* v, size_t begin,
              size_t end, int64_t t, float lr, float grad_scale) const;

  const AdamWConfig& config() const { return config_; }

 private:
  struct Segment {
    size_t begin, end;  // arena elements
    bool decay;
  };
  const AdamWConfig config_;
  std::vector<Segment> segments_;  // consecutive tensors with the same flag merged
};

// The unsharded AdamW over a whole arena. Step() clips by the global norm
// (when clip_norm > 0), then updates every parameter; the learning rate is
// set before each step (set_learning_rate, from a LrSchedule).
class AdamW final : public Optimizer {
 public:
  // `arena` and `kernels` are not owned and must outlive this (kernels on
  // the arena's device). Allocates m and v (zeros) on the arena's backend.
  AdamW(ParamArena* arena, GptKernels* kernels, const AdamWConfig& config, float lr);

  std::string_view name() const override { return "adamw"; }
  void Step() override;
  float learning_rate() const override { return lr_; }
  void set_learning_rate(float lr) override { lr_ = lr; }

  // The global gradient norm measured by the last Step() (before clipping);
  // 0 before the first step or when clipping is off.
  double last_grad_norm() const { return last_grad_norm_; }
  const AdamWRule& rule() const { return rule_; }

 private:
  GptKernels* const kernels_;
  const AdamWRule rule_;
  float lr_;
  double last_grad_norm_ = 0.0;
};

}  // namespace fleet::trainer
