#include "collective/parallel_groups.h"

#include "absl/strings/str_cat.h"

namespace fleet::trainer::collective {

Result<std::unique_ptr<HybridGroups>> HybridGroups::Create(const HybridLayout& layout,
                                                           Collective* world,
                                                           const GroupFactory& join) {
  const int size = world ? world->size() : 1;
  if (layout.dp_degree < 1 || layout.sharding_degree < 1 || layout.mp_degree < 1 ||
      layout.world_size() != size) {
    return Status::InvalidArgument(
        absl::StrCat("dp_degree x sharding_degree x mp_degree must equal the ranks in the job (",
                     size, ")"),
        absl::StrCat(layout.dp_degree, " x ", layout.sharding_degree, " x ", layout.mp_degree));
  }
  std::unique_ptr<HybridGroups> g(new HybridGroups());
  if (world == nullptr) return g;
  const int rank = world->rank();
  const int data_size = layout.data_world_size();
  const bool both = layout.dp_degree > 1 && layout.sharding_degree > 1;
  const bool need_join = both || (layout.mp_degree > 1 && data_size > 1);
  if (need_join && !join) {
    return Status::InvalidArgument(
        "this split needs a way to join subgroups (GroupFactory)",
        absl::StrCat(layout.dp_degree, " x ", layout.sharding_degree, " x ", layout.mp_degree));
  }
  // The model-parallel group, then the data world of this rank's part.
  const int m = layout.mp_index(rank);
  const std::string part = layout.mp_degree > 1 ? absl::StrCat(".m", m) : "";
  Collective* data_world = world;
  if (layout.mp_degree > 1) {
    if (data_size == 1) {
      g->mp_group_ = world;
      data_world = nullptr;
    } else {
      FLEET_ASSIGN_OR_RETURN(g->mp_,
                             join(absl::StrCat("mp", layout.data_rank(rank)), m, layout.mp_degree));
      g->mp_group_ = g->mp_.get();
      FLEET_ASSIGN_OR_RETURN(g->data_, join("data" + part, layout.data_rank(rank), data_size));
      data_world = g->data_.get();
    }
  }
  g->groups_.world = data_world;
  if (data_world == nullptr) return g;
  if (!both) {
    // One kind of group only, and it is the data world.
    g->groups_.shard = layout.sharding_degree > 1 ? data_world : nullptr;
    return g;
  }
  const int d = layout.dp_index(rank);
  const int s = layout.sharding_index(rank);
  FLEET_ASSIGN_OR_RETURN(g->sharding_,
                         join(absl::StrCat("sharding", d) + part, s, layout.sharding_degree));
  FLEET_ASSIGN_OR_RETURN(g->dp_, join(absl::StrCat("dp", s) + part, d, layout.dp_degree));
  g->groups_.shard = g->sharding_.get();
  g->groups_.replica = g->dp_.get();
  return g;
}

}  // namespace fleet::trainer::collective
