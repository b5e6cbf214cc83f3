// ParamSplit: how the arenas of a tensor-parallel group's ranks are parts of
// one whole parameter table (the model as one process holds it, the layout
// checkpoints are written in).
//
// Each rank's arena is cut into segments, in its own order, each a run of
// floats that is also contiguous in the whole table. Every range of the
// whole table is owned by exactly one rank's segment; other ranks may hold
// copies of it (the tensors every tensor-parallel rank holds identically:
// LayerNorms, position embeddings, the biases of row-parallel layers; a
// last pipeline stage's copy of the tied wte), marked `replicated`. Rank
// r's segments cover its arena exactly; the owned segments of all ranks
// cover the whole table exactly.
//
// Thread safety: a value, fixed after construction; the functions below are
// collective over the group where they say so.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

struct ArenaSegment {
  size_t local = 0;  // offset in the rank's arena
  size_t whole = 0;  // offset in the whole table
  size_t size = 0;   // floats
  bool replicated = false;  // a copy another rank owns: not saved, not counted twice
};

struct ParamSplit {
  // The group whose ranks hold the parts (null: one rank holds the whole).
  Collective* group = nullptr;
  int rank = 0;
  int degree = 1;
  ParamTable whole_table;
  size_t whole_size = 0;
  // segments[r]: rank r's segments in its arena's order; local_size[r] its
  // arena's floats.
  std::vector<std::vector<ArenaSegment>> segments;
  std::vector<size_t> local_size;

  const std::vector<ArenaSegment>& mine() const { return segments[rank]; }
};

// Every rank of split.group calls it (collective): `whole` becomes the whole
// table's parameters, host, on every rank; `local` is this rank's parameters
// on its device (split.local_size[rank] floats; `backend` is theirs). Moves
// degree x the largest part through one all-gather. The group's errors.
Status GatherWholeParams(const ParamSplit& split, const float* local, Backend* backend,
                         std::vector<float>* whole);

// This rank's part of a whole table (host to host): part[s.local + i] =
// whole[s.whole + i] for each of its segments.
void TakePart(const ParamSplit& split, std::span<const float> whole, std::span<float> part);

}  // namespace fleet::trainer
