// Deterministic parameter initialisation from a seed.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/param_arena.h"

namespace fleet::trainer {

// Host values for every tensor of `table`, laid out like the arena: each
// "<p>.weight" [out, in] and its "<p>.bias" [out] drawn uniformly from
// [-1/sqrt(in), 1/sqrt(in)] (PyTorch's nn.Linear default). Tensors are
// filled in table order from one SplitMix64 stream seeded with `seed`, so
// the same seed and table give the same bits on every machine.
// REQUIRES: every tensor is a Linear weight or bias (CHECK: tables are code).
std::vector<float> LinearUniformInit(const ParamTable& table, uint64_t seed);

}  // namespace fleet::trainer
