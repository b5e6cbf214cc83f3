// Server-side optimizer rules. Each rule is one small class: it says how many
// floats of state it keeps next to a value of a given width, how to
// initialise that state, and how to apply one gradient. Tables own one rule
// object per value part and call it with spans into their row storage.
//
// Gradient preprocessing is shared by all rules and happens in this order:
//   1. clipping (OptimizerConfig::clip_mode): by value, each element clamped
//      to [-t, t]; or by norm, the whole gradient span (one row of one push)
//      scaled by t / ||g||_2 when ||g||_2 > t;
//   2. L2 decay: g += l2_decay * w.
//
// State layout for a value of width d is
//   [per-element slot 0: d floats] ... [per-element slot k-1: d floats] [row scalars]
// so a dense table can split state by element ranges when re-sharding
// (see per_element_slots() / row_scalars()).
//
// Thread safety: rule objects are immutable after construction; Update may
// be called from many threads at once on disjoint spans.
#pragma once

#include <cmath>
#include <memory>
#include <span>

#include "comm/status.h"
#include "ps/table/table_config.h"

namespace fleet::ps {

class OptimizerRule {
 public:
  explicit OptimizerRule(const OptimizerConfig& config) : config_(config) {}
  virtual ~OptimizerRule() = default;
  OptimizerRule(const OptimizerRule&) = delete;
  OptimizerRule& operator=(const OptimizerRule&) = delete;

  // Floats of state per value element, and per row regardless of width.
  virtual int per_element_slots() const = 0;
  virtual int row_scalars() const = 0;
  // Floats of state kept for a value of width `dim`.
  size_t state_size(size_t dim) const { return per_element_slots() * dim + row_scalars(); }

  // Writes the initial state for a value of width value_dim.
  // REQUIRES: state.size() == state_size(value_dim).
  virtual void InitState(size_t value_dim, std::span<float> state) const = 0;

  // Clips grad, adds L2 decay, then applies the rule to value and state.
  // REQUIRES: grad.size() == value.size(), state.size() == state_size(value.size()).
  // (Sizes are checked by the table against the request before calling.)
  void Update(std::span<float> value, std::span<float> state, std::span<const float> grad) const;

  // Update of rows[k] (value of `dim` floats, then its state) with grads[k],
  // for every k in order (a row may appear twice). One call per batch of
  // rows instead of two virtual calls per row: for rows of a few floats the
  // calls cost as much as the arithmetic.
  void UpdateRows(std::span<float* const> rows, std::span<const float* const> grads,
                  size_t dim) const;

  const OptimizerConfig& config() const { return config_; }

  // Whether Update clips or decays a gradient before the rule's step; when
  // not, a caller holding the final rule type (SgdRule, ...) may run its
  // Apply in a loop of its own (inlined, no virtual call per row).
  bool preprocesses() const {
    return config_.clip_mode != ClipMode::kNone || config_.l2_decay != 0.0f;
  }

 protected:
  // Applies an already preprocessed gradient.
  virtual void Step(std::span<float> value, std::span<float> state, std::span<const float> grad) const = 0;
  // Step of every row; each rule's override runs its own Apply inline.
  virtual void StepRows(std::span<float* const> rows, std::span<const float* const> grads,
                        size_t dim) const = 0;
  // The loop of StepRows for rule R (R is final: its Apply inlines).
  template <typename R>
  static void StepEach(const R& rule, std::span<float* const> rows,
                       std::span<const float* const> grads, size_t dim) {
    for (size_t k = 0; k < rows.size(); ++k) rule.Apply(rows[k], rows[k] + dim, grads[k], dim);
  }

  const OptimizerConfig config_;
};

// w -= lr * g. No state.
class SgdRule final : public OptimizerRule {
 public:
  using OptimizerRule::OptimizerRule;
  int per_element_slots() const override { return 0; }
  int row_scalars() const override { return 0; }
  void InitState(size_t, std::span<float>) const override {}

  // Step on `dim` values and their state (state_size(dim) floats after
  // them in a row), inline: see preprocesses().
  void Apply(float* __restrict w, float* /*state*/, const float* __restrict g, size_t dim) const {
    const float lr = config_.learning_rate;
    if (dim == 1) {
      w[0] -= lr * g[0];
      return;
    }
    for (size_t i = 0; i < dim; ++i) w[i] -= lr * g[i];
  }

 protected:
  void Step(std::span<float> value, std::span<float> state,
            std::span<const float> grad) const override {
    Apply(value.data(), state.data(), grad.data(), value.size());
  }
  void StepRows(std::span<float* const> rows, std::span<const float* const> grads,
                size_t dim) const override {
    StepEach(*this, rows, grads, dim);
  }
};

// g2 += g*g;  w -= lr * g / (sqrt(g2) + epsilon);  g2 starts at initial_g2sum.
// State: one accumulator per element.
class AdagradRule final : public OptimizerRule {
 public:
  using OptimizerRule::OptimizerRule;
  int per_element_slots() const override { return 1; }
  int row_scalars() const override { return 0; }
  void InitState(size_t value_dim, std::span<float> state) const override;

  void Apply(float* __restrict w, float* __restrict g2, const float* __restrict g,
             size_t dim) const {
    const float lr = config_.learning_rate;
    const float eps = config_.epsilon;
    for (size_t i = 0; i < dim; ++i) {
      g2[i] += g[i] * g[i];
      w[i] -= lr * g[i] / (std::sqrt(g2[i]) + eps);
    }
  }

 protected:
  void Step(std::span<float> value, std::span<float> state,
            std::span<const float> grad) const override {
    Apply(value.data(), state.data(), grad.data(), value.size());
  }
  void StepRows(std::span<float* const> rows, std::span<const float* const> grads,
                size_t dim) const override {
    StepEach(*this, rows, grads, dim);
  }
};

// Bias-corrected Adam with a per-row step count. The step count t is kept as
// the two powers beta1^t and beta2^t (row scalars, starting at 1), which is
// what the bias correction needs and avoids a pow() per update:
//   p1 *= b1; p2 *= b2;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   w -= lr * (m / (1-p1)) / (sqrt(v / (1-p2)) + epsilon).
// State: m and v per element, then p1, p2.
class AdamRule final : public OptimizerRule {
 public:
  using OptimizerRule::OptimizerRule;
  int per_element_slots() const override { return 2; }
  int row_scalars() const override { return 2; }
  void InitState(size_t value_dim, std::span<float> state) const override;

  void Apply(float* __restrict w, float* state, const float* __restrict g, size_t d) const {
    float* __restrict m = state;
    float* __restrict v = m + d;
    float& p1 = state[2 * d];
    float& p2 = state[2 * d + 1];
    const float b1 = config_.beta1, b2 = config_.beta2;
    p1 *= b1;
    p2 *= b2;
    const float c1 = 1.0f - p1, c2 = 1.0f - p2;
    const float lr = config_.learning_rate, eps = config_.epsilon;
    for (size_t i = 0; i < d; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }

 protected:
  void Step(std::span<float> value, std::span<float> state,
            std::span<const float> grad) const override {
    Apply(value.data(), state.data(), grad.data(), value.size());
  }
  void StepRows(std::span<float* const> rows, std::span<const float* const> grads,
                size_t dim) const override {
    StepEach(*this, rows, grads, dim);
  }
};

// Builds the rule named by config.rule.
// REQUIRES: the config passed ValidateTableConfig.
std::unique_ptr<OptimizerRule> MakeOptimizerRule(const OptimizerConfig& config);

}  // namespace fleet::ps
