#include "ps/table/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fleet::ps {

void OptimizerRule::Update(std::span<float> value, std::span<float> state,
                           std::span<const float> grad) const {
  if (!preprocesses()) {
    Step(value, state, grad);
    return;
  }
  // Per-thread scratch: the caller's gradient is const (it may be a view of
  // a received message) and rows are small, so this never reallocates in
  // steady state.
  thread_local std::vector<float> scratch;
  scratch.assign(grad.begin(), grad.end());
  const float t = config_.clip_threshold;
  if (config_.clip_mode == ClipMode::kValue) {
    for (float& g : scratch) g = std::clamp(g, -t, t);
  } else if (config_.clip_mode == ClipMode::kNorm) {
    double sq = 0;
    for (float g : scratch) sq += double(g) * g;
    const double norm = std::sqrt(sq);
    if (norm > t) {
      const float scale = static_cast<float>(t / norm);
      for (float& g : scratch) g *= scale;
    }
  }
  if (config_.l2_decay != 0.0f) {
    for (size_t i = 0; i < scratch.size(); ++i) scratch[i] += config_.l2_decay * value[i];
  }
  Step(value, state, scratch);
}

void OptimizerRule::UpdateRows(std::span<float* const> rows, std::span<const float* const> grads,
                               size_t dim) const {
  if (!preprocesses()) {
    StepRows(rows, grads, dim);
    return;
  }
  const size_t state = state_size(dim);
  for (size_t k = 0; k < rows.size(); ++k)
    Update({rows[k], dim}, {rows[k] + dim, state}, {grads[k], dim});
}

void AdagradRule::InitState(size_t value_dim, std::span<float> state) const {
  std::fill(state.begin(), state.begin() + value_dim, config_.initial_g2sum);
}

void AdamRule::InitState(size_t d, std::span<float> state) const {
  std::fill(state.begin(), state.begin() + 2 * d, 0.0f);
  state[2 * d] = 1.0f;
  state[2 * d + 1] = 1.0f;
}

std::unique_ptr<OptimizerRule> MakeOptimizerRule(const OptimizerConfig& config) {
  switch (config.rule) {
    case OptimizerKind::kSgd: return std::make_unique<SgdRule>(config);
    case OptimizerKind::kAdagrad: return std::make_unique<AdagradRule>(config);
    case OptimizerKind::kAdam: return std::make_unique<AdamRule>(config);
  }
  LOG(FATAL) << "unhandled optimizer rule " << static_cast<int>(config.rule);
}

}  // namespace fleet::ps
