#include "ps/table/initializer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "comm/splitmix.h"
#include "ps/table/partition.h"

namespace fleet::ps {

void Initializer::Fill(uint64_t key, uint32_t stream, std::span<float> out) const {
  switch (config_.kind) {
    case InitializerKind::kZeros:
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    case InitializerKind::kUniform: {
      SplitMix64 rng(Mix64(config_.seed) ^ Mix64(key) ^ (uint64_t{stream} << 32));
      const float r = config_.range;
      for (float& v : out) v = -r + 2.0f * r * rng.UniformFloat();
      return;
    }
    case InitializerKind::kGaussian: {
      SplitMix64 rng(Mix64(config_.seed) ^ Mix64(key) ^ (uint64_t{stream} << 32));
      for (size_t i = 0; i < out.size(); i += 2) {
        // Box-Muller; 1 - u keeps the log argument in (0, 1].
        const double u1 = 1.0 - rng.UniformFloat();
        const double u2 = rng.UniformFloat();
        const double r = std::sqrt(-2.0 * std::log(u1)) * config_.stddev;
        out[i] = static_cast<float>(r * std::cos(2 * std::numbers::pi * u2));
        if (i + 1 < out.size()) out[i + 1] = static_cast<float>(r * std::sin(2 * std::numbers::pi * u2));
      }
      return;
    }
  }
}

void Initializer::FillDense(uint64_t first, std::span<float> out) const {
  if (config_.kind == InitializerKind::kZeros) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  for (size_t i = 0; i < out.size(); ++i) Fill(first + i, 0, out.subspan(i, 1));
}

}  // namespace fleet::ps
