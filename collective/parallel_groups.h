// The process groups of a hybrid job: dp_degree x pp_degree x
// sharding_degree x mp_degree ranks, as FleetX lays them out.
//
// Rank layout (FleetX's CommunicateTopology order [data, pipe, sharding,
// model]): the model-parallel index varies fastest, then the sharding
// index, then the pipeline stage,
//   rank = ((dp_index * pp_degree + stage) * sharding_degree + sharding_index)
//          * mp_degree + mp_index,
// so a model-parallel (tensor-parallel) group is mp_degree consecutive ranks
// (as Megatron places them, inside a node), a sharding group takes the ranks
// of one dp index holding the same model part, and a data-parallel group the
// ranks holding the same shard of it. With 4 ranks, dp 2 x sharding 2:
//   sharding groups {0, 1} and {2, 3}; data-parallel groups {0, 2} and {1, 3};
// with mp 2 x dp 2: model-parallel groups {0, 1} and {2, 3}, data-parallel
// groups {0, 2} and {1, 3}; with pp 2 x dp 2: stage 0 on {0, 2}, stage 1 on
// {1, 3}, pipelines {0, 1} and {2, 3}.
// The ranks of one replica (its stages and tensor-parallel ranks) read the
// same data; the data slice of a rank is its data rank, dp_index x
// sharding_degree + sharding_index, in the "data world" of the dp_degree x
// sharding_degree ranks holding the same model part (stage and
// tensor-parallel rank).
//
// Groups are joined through a GroupFactory (rank_setup.h RankGroupFactory
// for programs: from the KV store, as the world group is; tests: their own
// in-process store). Each subgroup has its own name, so their rendezvous keys
// never meet. In the order a rank joins them (every rank in the same
// order, so the rendezvous cannot wait in a cycle), with <d> its data rank,
// <p> its stage, <m> its tensor-parallel index and <part> ".p<p>" with
// pp_degree > 1 followed by ".m<m>" with mp_degree > 1:
//   "mp<d>[.p<p>]"        its model-parallel group (mp_degree > 1)
//   "pipe<d>[.m<m>].l<l>" the link between stages l and l + 1 (pp_degree >
//                         1): stage l is its rank 0; a rank joins the link
//                         below it, then the one above
//   "embed<d>[.m<m>]"     the first and last stage (pp_degree > 2; with 2
//                         the link is that group): the tied wte's gradient
//   "model<d>"            the pp_degree x mp_degree ranks of one replica,
//                         rank stage x mp_degree + m (pp and mp > 1; one of
//                         them > 1: the mp group or, with pp 2, the link)
//   "data<part>"          the data world of the part (not the whole job)
//   "sharding<dp><part>", "dp<s><part>"  inside it, when both dp_degree and
//                         sharding_degree exceed 1.
// A subgroup equal to the world is the world itself; one of a single rank is
// none.
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
  int pp_degree = 1;

  int world_size() const { return dp_degree * pp_degree * sharding_degree * mp_degree; }
  int data_world_size() const { return dp_degree * sharding_degree; }
  int mp_index(int rank) const { return rank % mp_degree; }
  int sharding_index(int rank) const { return rank / mp_degree % sharding_degree; }
  int pp_index(int rank) const { return rank / (mp_degree * sharding_degree) % pp_degree; }
  int dp_index(int rank) const { return rank / (mp_degree * sharding_degree * pp_degree); }
  int data_rank(int rank) const { return dp_index(rank) * sharding_degree + sharding_index(rank); }
  int RankOf(int dp_index, int sharding_index, int mp_index = 0, int pp_index = 0) const {
    return ((dp_index * pp_degree + pp_index) * sharding_degree + sharding_index) * mp_degree +
           mp_index;
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
  // The links to the previous and next stage (null on the first and the
  // last stage; both null with pp_degree 1): 2 ranks, the lower stage's
  // rank 0.
  Collective* pipeline_prev() const { return prev_; }
  Collective* pipeline_next() const { return next_; }
  // The first and last stage's group (their rank 0 and 1) on those two
  // stages with pp_degree > 1; null elsewhere.
  Collective* embedding() const { return embedding_; }
  // All the ranks of this replica's model: pp_degree x mp_degree, rank
  // stage x mp_degree + m (null when that is one rank).
  Collective* model() const { return model_; }

 private:
  HybridGroups() = default;

  // Owned when neither the world nor none.
  std::unique_ptr<Collective> mp_, link_below_, link_above_, embed_, model_own_, data_, sharding_,
      dp_;
  Collective* mp_group_ = nullptr;
  Collective* prev_ = nullptr;
  Collective* next_ = nullptr;
  Collective* embedding_ = nullptr;
  Collective* model_ = nullptr;
  DataParallelGroups groups_;
};

}  // namespace fleet::trainer::collective
