#include "trainer/models/init.h"

#include <cmath>
#include <string>

#include <glog/logging.h>

namespace fleet::trainer {
namespace {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 random bits (exact in float).
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }

 private:
  uint64_t state_;
};

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<float> LinearUniformInit(const ParamTable& table, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> host;
  int64_t last_fan_in = 0;
  for (const ParamSpec& spec : table) {
    int64_t fan_in = 0;
    if (EndsWith(spec.name, ".weight")) {
      CHECK_EQ(spec.shape.ndim(), 2) << spec.name;
      fan_in = last_fan_in = spec.shape[1];
    } else {
      CHECK(EndsWith(spec.name, ".bias")) << "no init rule for " << spec.name;
      CHECK_GT(last_fan_in, 0) << spec.name << " must follow its weight";
      fan_in = last_fan_in;
    }
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    for (int64_t i = 0; i < spec.shape.numel(); ++i) {
      host.push_back((2.0f * rng.Uniform() - 1.0f) * bound);
    }
  }
  return host;
}

}  // namespace fleet::trainer
