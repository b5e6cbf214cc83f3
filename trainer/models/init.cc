#include "trainer/models/init.h"

#include <cmath>
#include <string>

#include <glog/logging.h>

#include "comm/splitmix.h"

namespace fleet::trainer {
namespace {

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
      host.push_back((2.0f * rng.UniformFloat() - 1.0f) * bound);
    }
  }
  return host;
}

}  // namespace fleet::trainer
