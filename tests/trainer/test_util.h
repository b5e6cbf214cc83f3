// Helpers shared by the trainer tests: tolerance comparison naming the worst
// mismatch, seeded random fills, and the golden-file reader.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/status.h"
#include "trainer/param_arena.h"

namespace fleet::trainer::testing {

// Passes when |got[i] - want[i]| <= abs_tol + rel_tol * |want[i]| for every
// i; otherwise names the tensor, the index with the largest excess, both
// values and the number of elements out of tolerance.
inline ::testing::AssertionResult AllClose(const std::string& name, std::span<const float> got,
                                           std::span<const float> want, double abs_tol,
                                           double rel_tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " vs expected "
                                         << want.size();
  }
  double worst = 0.0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double{got[i]} - double{want[i]});
    const double excess = err - (abs_tol + rel_tol * std::fabs(double{want[i]}));
    if (!(excess <= 0.0)) {  // also catches NaN
      ++bad;
      if (!(excess <= worst)) {
        worst = std::isnan(excess) ? INFINITY : excess;
        worst_i = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << bad << " of " << got.size()
         << " elements out of tolerance (abs " << abs_tol << " + rel " << rel_tol
         << "); worst at index " << worst_i << ": got " << got[worst_i] << ", want "
         << want[worst_i];
}

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

struct GoldenTensor {
  std::vector<uint32_t> shape;
  std::vector<float> data;
};

// Reads a file written by golden/make_golden.py. Fails the current test
// (and returns an empty map) when the file is missing or malformed.
inline std::map<std::string, GoldenTensor> ReadGolden(const std::string& path) {
  std::map<std::string, GoldenTensor> out;
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    ADD_FAILURE() << "cannot open golden file " << path;
    return out;
  }
  char magic[8];
  uint32_t count = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&count), 4);
  if (!f || std::memcmp(magic, "FGLD0001", 8) != 0) {
    ADD_FAILURE() << "bad golden header in " << path;
    return out;
  }
  for (uint32_t t = 0; t < count; ++t) {
    uint32_t len = 0, ndim = 0;
    f.read(reinterpret_cast<char*>(&len), 4);
    std::string name(len, '\0');
    f.read(name.data(), len);
    f.read(reinterpret_cast<char*>(&ndim), 4);
    GoldenTensor g;
    g.shape.resize(ndim);
    size_t n = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      f.read(reinterpret_cast<char*>(&g.shape[d]), 4);
      n *= g.shape[d];
    }
    g.data.resize(n);
    f.read(reinterpret_cast<char*>(g.data.data()), static_cast<std::streamsize>(n * 4));
    if (!f) {
      ADD_FAILURE() << "golden file " << path << " truncated at tensor " << t;
      return {};
    }
    out.emplace(std::move(name), std::move(g));
  }
  return out;
}

using Golden = std::map<std::string, GoldenTensor>;

// The data of golden tensor `name`. Fails the current test (and returns an
// empty vector) when the file has no such tensor.
inline const std::vector<float>& GoldenData(const Golden& g, const std::string& name) {
  static const std::vector<float> kEmpty;
  auto it = g.find(name);
  if (it == g.end()) {
    ADD_FAILURE() << "golden file has no tensor " << name;
    return kEmpty;
  }
  return it->second.data;
}

// Params of `arena` set from the golden tensors of the same names.
inline void LoadGoldenParams(const Golden& g, ParamArena* arena) {
  std::vector<float> host(arena->size());
  for (size_t i = 0; i < arena->num_tensors(); ++i) {
    const ParamSpec& spec = arena->table()[i];
    const auto& v = GoldenData(g, spec.name);
    ASSERT_EQ(v.size(), static_cast<size_t>(spec.shape.numel())) << spec.name;
    std::copy(v.begin(), v.end(), host.begin() + arena->offset(i));
  }
  ASSERT_TRUE(arena->ParamsFromHost(host).ok());
}

// Every tensor of `host` (laid out like `arena`) vs golden "<prefix><name>".
inline void ExpectArenaGolden(const Golden& g, const ParamArena& arena,
                              const std::vector<float>& host, const std::string& prefix,
                              double abs_tol, double rel_tol) {
  for (size_t i = 0; i < arena.num_tensors(); ++i) {
    const std::string name = prefix + arena.table()[i].name;
    std::span<const float> got(host.data() + arena.offset(i), arena.table()[i].shape.numel());
    EXPECT_TRUE(AllClose(name, got, GoldenData(g, name), abs_tol, rel_tol));
  }
}

// Passes when `status` is InvalidArgument and its message contains `needle`
// (the key, file or value a user must be told about).
inline ::testing::AssertionResult IsInvalidArgumentNaming(const Status& status,
                                                          const std::string& needle) {
  if (status.IsInvalidArgument() && status.message().find(needle) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "expected InvalidArgument naming \"" << needle << "\", got " << status.ToString();
}

// Directory of the golden files: $FLEET_SOURCE_DIR/tests/trainer/golden
// (set by ctest), else relative to the source tree this test was built from.
inline std::string GoldenDir() {
  const char* src = std::getenv("FLEET_SOURCE_DIR");
  return std::string(src ? src : FLEET_TEST_SOURCE_DIR) + "/tests/trainer/golden";
}

}  // namespace fleet::trainer::testing
