// Local optimizers over a ParamArena. One class per rule; the constructor
// binds the arena and allocates the state (in arenas of the same layout, on
// the same backend); Step() only moves data: one update over the whole
// arena using arena->grads().
//
// Thread safety: none; Step() runs on the thread that drives the model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "trainer/kernel_types.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // "sgd" or "adam": stored in checkpoints and checked on load.
  virtual std::string_view name() const = 0;
  // params -= update(grads); then step() += 1.
  virtual void Step() = 0;
  virtual float learning_rate() const = 0;
  virtual void set_learning_rate(float lr) = 0;

  // Steps taken so far (Adam's bias correction uses step() + 1 next).
  int64_t step() const { return step_; }
  // Optimizer state, each buffer [arena()->size()] with the arena's layout
  // (Adam: first and second moments; SGD: none).
  const std::vector<Tensor>& state() const { return state_; }
  ParamArena* arena() const { return arena_; }

  // For checkpoint loading only: sets the step counter (the state buffers
  // are written through state()).
  void RestoreStep(int64_t step) { step_ = step; }

 protected:
  explicit Optimizer(ParamArena* arena) : arena_(arena) { CHECK(arena != nullptr); }

  ParamArena* const arena_;  // not owned
  std::vector<Tensor> state_;
  int64_t step_ = 0;
};

// p -= lr * (g + weight_decay * p).
class Sgd final : public Optimizer {
 public:
  Sgd(ParamArena* arena, float lr, float weight_decay = 0.0f)
      : Optimizer(arena), lr_(lr), weight_decay_(weight_decay) {}
  std::string_view name() const override { return "sgd"; }
  void Step() override;
  float learning_rate() const override { return lr_; }
  void set_learning_rate(float lr) override { lr_ = lr; }

 private:
  float lr_;
  const float weight_decay_;
};

// Bias-corrected Adam (PyTorch's torch.optim.Adam with amsgrad=False);
// see kernels::AdamUpdate for the formula.
class Adam final : public Optimizer {
 public:
  Adam(ParamArena* arena, const kernels::AdamHyper& hyper);
  std::string_view name() const override { return "adam"; }
  void Step() override;
  float learning_rate() const override { return hyper_.lr; }
  void set_learning_rate(float lr) override { hyper_.lr = lr; }

 private:
  kernels::AdamHyper hyper_;
};

// Config of an optimizer, as read from the job config (Optimizer.*).
struct OptimizerConfig {
  // "sgd" or "adam".
  std::string type = "adam";
  // Step size. Default 1e-3 suits Adam on the MLP; SGD usually wants ~0.1.
  float lr = 1e-3f;
  // Adam's moment decay rates and denominator epsilon; the defaults are
  // PyTorch's and rarely need changing.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  // L2 penalty added to the gradient. 0 = none.
  float weight_decay = 0.0f;
};

// InvalidArgument for an unknown type, lr <= 0, betas outside [0, 1),
// eps <= 0 or weight_decay < 0; the message names the key.
Result<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerConfig& config,
                                                   ParamArena* arena);

}  // namespace fleet::trainer
