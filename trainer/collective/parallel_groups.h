// The process groups of a hybrid job: dp_degree x sharding_degree ranks, as
// FleetX lays them out.
//
// Rank layout (FleetX's CommunicateTopology order [data, pipe, sharding,
// model], with pipe = model = 1): the sharding index varies fastest,
//   rank = dp_index * sharding_degree + sharding_index,
// so a sharding group is sharding_degree consecutive ranks and a
// data-parallel group takes one rank from each sharding group (the ranks
// holding the same shard). With 4 ranks, dp 2 x sharding 2:
//   sharding groups {0, 1} and {2, 3}; data-parallel groups {0, 2} and {1, 3}.
// Every rank reads distinct data (the loop's slice is by world rank).
//
// Groups are joined through a GroupFactory (rank_setup.h RankGroupFactory
// for programs: from the KV store, as the world group is; tests: their own
// in-process store). Each subgroup has its own name, so their rendezvous keys
// never meet: "sharding<d>" for the sharding group of dp index d and
// "dp<s>" for the data-parallel group of sharding index s. A rank joins its
// sharding group first and its data-parallel group second; every rank does
// the same, so the rendezvous cannot wait in a cycle.
//
// Thread safety: HybridLayout is a value; HybridGroups is used by one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/data_parallel.h"

namespace fleet::trainer::collective {

struct HybridLayout {
  int dp_degree = 1;
  int sharding_degree = 1;

  int world_size() const { return dp_degree * sharding_degree; }
  int dp_index(int rank) const { return rank / sharding_degree; }
  int sharding_index(int rank) const { return rank % sharding_degree; }
  int RankOf(int dp_index, int sharding_index) const {
    return dp_index * sharding_degree + sharding_index;
  }
};

// Joins subgroup `name` as `rank` of `size` (size >= 2). Blocks for the
// rendezvous, bounded by the group timeout; the collective's errors.
using GroupFactory =
    std::function<Result<std::unique_ptr<Collective>>(const std::string& name, int rank, int size)>;

class HybridGroups {
 public:
  // This rank's groups for `layout` in `world` (null for one process; not
  // owned, outlives this). A subgroup equal to the world is the world
  // itself; one of a single rank is none. `join` is called only when both
  // degrees exceed 1. InvalidArgument when the layout does not fill the
  // world or `join` is needed and empty; join's errors.
  static Result<std::unique_ptr<HybridGroups>> Create(const HybridLayout& layout, Collective* world,
                                                      const GroupFactory& join);

  // For DataParallel / ShardedAdamWUpdater: world, sharding group (shard) and
  // data-parallel group (replica); pointers valid while this lives.
  DataParallelGroups groups() const { return groups_; }

 private:
  HybridGroups() = default;

  std::unique_ptr<Collective> sharding_;  // owned when neither the world nor none
  std::unique_ptr<Collective> dp_;
  DataParallelGroups groups_;
};

}  // namespace fleet::trainer::collective
