#include "trainer/collective/parallel_groups.h"

#include "absl/strings/str_cat.h"

namespace fleet::trainer::collective {

Result<std::unique_ptr<HybridGroups>> HybridGroups::Create(const HybridLayout& layout,
                                                           Collective* world,
                                                           const GroupFactory& join) {
  const int size = world ? world->size() : 1;
  if (layout.dp_degree < 1 || layout.sharding_degree < 1 || layout.world_size() != size) {
    return Status::InvalidArgument(
        absl::StrCat("dp_degree x sharding_degree must equal the ranks in the job (", size, ")"),
        absl::StrCat(layout.dp_degree, " x ", layout.sharding_degree));
  }
  std::unique_ptr<HybridGroups> g(new HybridGroups());
  g->groups_.world = world;
  if (world == nullptr) return g;
  if (layout.dp_degree == 1 || layout.sharding_degree == 1) {
    // One kind of group only, and it is the world.
    g->groups_.shard = layout.sharding_degree > 1 ? world : nullptr;
    return g;
  }
  if (!join) {
    return Status::InvalidArgument(
        "dp_degree and sharding_degree both above 1 need a way to join subgroups (GroupFactory)",
        absl::StrCat(layout.dp_degree, " x ", layout.sharding_degree));
  }
  const int rank = world->rank();
  const int d = layout.dp_index(rank);
  const int s = layout.sharding_index(rank);
  FLEET_ASSIGN_OR_RETURN(g->sharding_,
                         join(absl::StrCat("sharding", d), s, layout.sharding_degree));
  FLEET_ASSIGN_OR_RETURN(g->dp_, join(absl::StrCat("dp", s), d, layout.dp_degree));
  g->groups_.shard = g->sharding_.get();
  g->groups_.replica = g->dp_.get();
  return g;
}

}  // namespace fleet::trainer::collective
