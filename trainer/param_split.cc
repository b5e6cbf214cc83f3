#include "trainer/param_split.h"

#include <glog/logging.h>

#include <algorithm>

namespace fleet::trainer {

Status GatherWholeParams(const ParamSplit& split, const float* local, Backend* backend,
                         std::vector<float>* whole) {
  whole->assign(split.whole_size, 0.0f);
  const size_t largest = *std::max_element(split.local_size.begin(), split.local_size.end());
  const size_t mine = split.local_size[split.rank];
  std::vector<float> gathered;
  if (split.group == nullptr) {
    gathered.resize(mine);
    backend->CopyToHost(gathered.data(), local, mine * sizeof(float));
  } else {
    // Parts differ in size (the vocabulary may split unevenly): each rank
    // sends `largest` floats, its part first.
    std::shared_ptr<float> send = backend->AllocateFloats(largest);
    std::shared_ptr<float> recv = backend->AllocateFloats(largest * split.degree);
    backend->Fill(send.get(), largest, 0.0f);
    backend->CopyOnDevice(send.get(), local, mine * sizeof(float));
    FLEET_RETURN_IF_ERROR(split.group->AllGather(send.get(), recv.get(), largest));
    gathered.resize(largest * split.degree);
    backend->CopyToHost(gathered.data(), recv.get(), gathered.size() * sizeof(float));
  }
  for (int r = 0; r < split.degree; ++r) {
    if (split.group == nullptr && r != split.rank) continue;
    const float* part = gathered.data() + (split.group ? size_t(r) * largest : 0);
    for (const ArenaSegment& s : split.segments[r]) {
      if (s.replicated) continue;  // the owner's copy is as good as any
      std::copy(part + s.local, part + s.local + s.size, whole->begin() + s.whole);
    }
  }
  return Status::OK();
}

void TakePart(const ParamSplit& split, std::span<const float> whole, std::span<float> part) {
  CHECK_EQ(whole.size(), split.whole_size);
  CHECK_EQ(part.size(), split.local_size[split.rank]);
  for (const ArenaSegment& s : split.mine()) {
    std::copy(whole.begin() + s.whole, whole.begin() + s.whole + s.size, part.begin() + s.local);
  }
}

}  // namespace fleet::trainer
