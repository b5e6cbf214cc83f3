// The CTR model kinds (model.kind) and the CtrModel parts each turns on.
// A new model that combines existing parts is one entry here; one with a
// new interaction adds a layer and a part to CtrModel (CONTRIBUTING.md,
// "Adding a CTR model").
#include "trainer/models/ctr_model.h"

namespace fleet::trainer {
namespace {

constexpr CtrModelKind kKinds[] = {
    {.name = "dnn",
     .wide = false,
     .fm = false,
     .cross = false,
     .deep = true,
     .about = "pooled embeddings and dense features into an MLP (CTR-DNN)"},
    {.name = "wide_deep",
     .wide = true,
     .fm = false,
     .cross = false,
     .deep = true,
     .about = "a linear part over the sparse features beside the MLP (Wide&Deep)"},
    {.name = "deepfm",
     .wide = true,
     .fm = true,
     .cross = false,
     .deep = true,
     .about = "first-order weights, FM's pairwise term and the MLP (DeepFM)"},
    {.name = "dcn",
     .wide = false,
     .fm = false,
     .cross = true,
     .deep = true,
     .about = "full-rank cross layers beside the MLP (DCN-v2, parallel)"},
};

}  // namespace

std::span<const CtrModelKind> CtrModelKinds() { return kKinds; }

const CtrModelKind* FindCtrModelKind(std::string_view name) {
  for (const CtrModelKind& k : kKinds) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

}  // namespace fleet::trainer
