#include "collective/parallel_groups.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace fleet::trainer::collective {

Result<std::unique_ptr<HybridGroups>> HybridGroups::Create(const HybridLayout& layout,
                                                           Collective* world,
                                                           const GroupFactory& join) {
  const int size = world ? world->size() : 1;
  const std::string degrees = absl::StrCat(layout.dp_degree, " x ", layout.pp_degree, " x ",
                                           layout.sharding_degree, " x ", layout.mp_degree);
  if (layout.dp_degree < 1 || layout.sharding_degree < 1 || layout.mp_degree < 1 ||
      layout.pp_degree < 1 || layout.world_size() != size) {
    return Status::InvalidArgument(
        absl::StrCat("dp_degree x pp_degree x sharding_degree x mp_degree must equal the ranks in "
                     "the job (",
                     size, ")"),
        degrees);
  }
  std::unique_ptr<HybridGroups> g(new HybridGroups());
  if (world == nullptr) return g;
  const int rank = world->rank();
  // Group `name` of `members` ranks as `sub_rank`: none for one rank, the
  // world for all of them, else joined into `*own`.
  auto group = [&](const std::string& name, int sub_rank, int members,
                   std::unique_ptr<Collective>* own) -> Result<Collective*> {
    if (members == 1) return nullptr;
    if (members == size) {
      CHECK_EQ(sub_rank, rank) << "group " << name << " is the world in another order";
      return world;
    }
    if (!join) {
      return Status::InvalidArgument("this split needs a way to join subgroups (GroupFactory)",
                                     degrees);
    }
    FLEET_ASSIGN_OR_RETURN(*own, join(name, sub_rank, members));
    return own->get();
  };
  const int P = layout.pp_degree, M = layout.mp_degree;
  const int d = layout.data_rank(rank), p = layout.pp_index(rank), m = layout.mp_index(rank);
  const std::string stage = P > 1 ? absl::StrCat(".p", p) : "";
  const std::string tp = M > 1 ? absl::StrCat(".m", m) : "";
  FLEET_ASSIGN_OR_RETURN(g->mp_group_, group(absl::StrCat("mp", d) + stage, m, M, &g->mp_));
  // The pipeline: the link below, then the one above (stage l is rank 0 of
  // link l), so the links' rendezvous run up the pipeline.
  const std::string pipe = absl::StrCat("pipe", d) + tp;
  if (p > 0) {
    FLEET_ASSIGN_OR_RETURN(g->prev_, group(absl::StrCat(pipe, ".l", p - 1), 1, 2, &g->link_below_));
  }
  if (p < P - 1) {
    FLEET_ASSIGN_OR_RETURN(g->next_, group(absl::StrCat(pipe, ".l", p), 0, 2, &g->link_above_));
  }
  if (P == 2) {
    g->embedding_ = p == 0 ? g->next_ : g->prev_;
  } else if (P > 2 && (p == 0 || p == P - 1)) {
    FLEET_ASSIGN_OR_RETURN(g->embedding_,
                           group(absl::StrCat("embed", d) + tp, p == 0 ? 0 : 1, 2, &g->embed_));
  }
  if (P == 1) {
    g->model_ = g->mp_group_;
  } else if (M == 1 && P == 2) {
    g->model_ = g->embedding_;
  } else {
    FLEET_ASSIGN_OR_RETURN(g->model_,
                           group(absl::StrCat("model", d), p * M + m, P * M, &g->model_own_));
  }
  // The data world of this rank's part, then the sharding and data-parallel
  // groups inside it.
  const std::string part = stage + tp;
  FLEET_ASSIGN_OR_RETURN(Collective * data_world,
                         group("data" + part, d, layout.data_world_size(), &g->data_));
  g->groups_.world = data_world;
  if (data_world == nullptr) return g;
  if (layout.dp_degree == 1 || layout.sharding_degree == 1) {
    // One kind of group only, and it is the data world.
    g->groups_.shard = layout.sharding_degree > 1 ? data_world : nullptr;
    return g;
  }
  const int dp = layout.dp_index(rank), s = layout.sharding_index(rank);
  FLEET_ASSIGN_OR_RETURN(g->groups_.shard, group(absl::StrCat("sharding", dp) + part, s,
                                                 layout.sharding_degree, &g->sharding_));
  FLEET_ASSIGN_OR_RETURN(g->groups_.replica,
                         group(absl::StrCat("dp", s) + part, dp, layout.dp_degree, &g->dp_));
  return g;
}

}  // namespace fleet::trainer::collective
