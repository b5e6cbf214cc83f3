// splitmix64 (Steele, Lea, Flood 2014): the one 64-bit mixer and small
// random generator FleetPS uses everywhere it needs bits that are the same
// on every platform (std:: distributions leave their algorithms open).
// Mix64 is part of stored formats (it places keys in checkpoint shards):
// never change it.
//
// Thread safety: Mix64 is a pure function; a SplitMix64 object is not
// shared between threads.
#pragma once

#include <cstdint>

namespace fleet {

// The splitmix64 finaliser (constants from Stafford's "Mix13"). A bijection
// on uint64 whose output bits each depend on every input bit.
constexpr uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The splitmix64 generator: state += golden gamma, output Mix64(state).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return Mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0, 1) from 24 bits: exactly representable as a float.
  float UniformFloat() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [0, 1) from 53 bits: exactly representable as a double.
  double UniformDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

}  // namespace fleet
