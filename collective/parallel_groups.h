// The process groups of a hybrid job: dp_degree x sharding_degree x
// mp_degree ranks, as FleetX lays them out.
//
// Rank layout (FleetX's CommunicateTopology order [data, pipe, sharding,
// model], with pipe = 1): the model-parallel index varies fastest, then the
// sharding index,
//   rank = (dp_index * sharding_degree + sharding_index) * mp_degree + mp_index,
// so a model-parallel (tensor-parallel) group is mp_degree consecutive ranks
// (as Megatron places them, inside a node), a sharding group takes the ranks
// of one dp index holding the same model part, and a data-parallel group the
// ranks holding the same shard of it. With 4 ranks, dp 2 x sharding 2:
//   sharding groups {0, 1} and {2, 3}; data-parallel groups {0, 2} and {1, 3};
// with mp 2 x dp 2: model-parallel groups {0, 1} and {2, 3}, data-parallel
// groups {0, 2} and {1, 3}.
// The ranks of one model-parallel group read the same data; the data slice
// of a rank is its data rank, rank / mp_degree, in the "data world" of the
// dp_degree x sharding_degree ranks holding the same model part.
//
// Groups are joined through a GroupFactory (rank_setup.h RankGroupFactory
// for programs: from the KV store, as the world group is; tests: their own
// in-process store). Each subgroup has its own name, so their rendezvous keys
// never meet: "sharding<d>" for the sharding group of dp index d and
// "dp<s>" for the data-parallel group of sharding index s. A rank joins its
// sharding group first and its data-parallel group second; every rank does
// the same, so the rendezvous cannot wait in a cycle. With mp_degree > 1 a
// rank first joins "mp<d>" (its model-parallel group, d its data rank),
// then "data.m<m>" (the data world of part m), then the sharding and
// data-parallel groups inside it, named as above with ".m<m>" appended.
//
// Thread safety: HybridLayout is a value; HybridGroups is used by one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/collective.h"
#include "comm/status.h"
#include "collective/data_parallel.h"

namespace fleet::trainer::collective {

struct HybridLayout {
  int dp_degree = 1;
  int sharding_degree = 1;
  int mp_degree = 1;

  int world_size() const { return dp_degree * sharding_degree * mp_degree; }
  int data_world_size() const { return dp_degree * sharding_degree; }
  int mp_index(int rank) const { return rank % mp_degree; }
  int data_rank(int rank) const { return rank / mp_degree; }
  int dp_index(int rank) const { return data_rank(rank) / sharding_degree; }
  int sharding_index(int rank) const { return data_rank(rank) % sharding_degree; }
  int RankOf(int dp_index, int sharding_index, int mp_index = 0) const {
    return (dp_index * sharding_degree + sharding_index) * mp_degree + mp_index;
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
  // itself; one of a single rank is none. `join` is called only for groups
  // that are neither. InvalidArgument when the layout does not fill the
  // world or `join` is needed and empty; join's errors.
  static Result<std::unique_ptr<HybridGroups>> Create(const HybridLayout& layout, Collective* world,
                                                      const GroupFactory& join);

  // For DataParallel / ShardedAdamWUpdater: the data world (the ranks
  // holding this rank's model part; the world without tensor parallelism),
  // sharding group (shard) and data-parallel group (replica); pointers valid
  // while this lives.
  DataParallelGroups groups() const { return groups_; }
  // This rank's model-parallel group (null with mp_degree 1).
  Collective* model_parallel() const { return mp_group_; }

 private:
  HybridGroups() = default;

  // Owned when neither the world nor none.
  std::unique_ptr<Collective> mp_, data_, sharding_, dp_;
  Collective* mp_group_ = nullptr;
  DataParallelGroups groups_;
};

}  // namespace fleet::trainer::collective
