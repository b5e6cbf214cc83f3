// Initializer: the initial value of a parameter, a pure function of
// (config.seed, key, stream, element index). Used for new sparse rows (key =
// the row's key), for values of keys not yet admitted, for the extended
// embedding of a CTR row (its own stream), and for dense tables (key = the
// global element index), so the value never depends on which server computes
// it, on the number of servers, or on the order of requests.
//
// Random numbers come from splitmix64 and our own uniform/Box-Muller
// transforms rather than <random> distributions, whose output differs between
// standard libraries.
//
// Thread safety: immutable; Fill may run concurrently.
#pragma once

#include <cstdint>
#include <span>

#include "ps/table/table_config.h"

namespace fleet::ps {

class Initializer {
 public:
  explicit Initializer(const InitializerConfig& config) : config_(config) {}

  // Writes the initial values of `key`'s elements for `stream` into out.
  void Fill(uint64_t key, uint32_t stream, std::span<float> out) const;

  // Writes the initial values of dense elements [first, first + out.size()):
  // element i gets the first value of key i.
  void FillDense(uint64_t first, std::span<float> out) const;

  const InitializerConfig& config() const { return config_; }

 private:
  const InitializerConfig config_;
};

}  // namespace fleet::ps
