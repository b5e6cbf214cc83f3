#include "ps/table/gradient_merger.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include <glog/logging.h>

namespace fleet::ps {

GradientMerger::GradientMerger(int num_workers, size_t width, bool keyed, ApplyFn apply)
    : num_workers_(num_workers), width_(width), keyed_(keyed), apply_(std::move(apply)) {
  CHECK_GE(num_workers, 1);
  CHECK_GE(width, 1u);
  CHECK(apply_);
}

Result<bool> GradientMerger::Add(int64_t step, int rank, std::span<const uint64_t> keys,
                                 std::span<const float> values) {
  if (rank < 0 || rank >= num_workers_)
    return Status::InvalidArgument("worker rank out of range", absl::StrCat(rank, " of ", num_workers_));
  const size_t expect = keyed_ ? keys.size() * width_ : width_;
  if ((!keyed_ && !keys.empty()) || values.size() != expect)
    return Status::InvalidArgument(absl::StrCat("gradient of step ", step, " from rank ", rank, " has ",
                                                keys.size(), " keys and ", values.size(),
                                                " floats, expected ", expect, " floats"));
  std::lock_guard<std::mutex> l(mu_);
  if (step < applied_below_)
    return Status::InvalidArgument(absl::StrCat("step ", step, " from rank ", rank, " was already applied"));
  Pending& p = pending_[step];
  if (p.arrived.empty()) {
    p.arrived.assign(num_workers_, false);
    p.keys.resize(num_workers_);
    p.values.resize(num_workers_);
  }
  if (p.arrived[rank]) {
    return Status::InvalidArgument(absl::StrCat("rank ", rank, " sent step ", step, " twice"));
  }
  p.arrived[rank] = true;
  ++p.count;
  p.keys[rank].assign(keys.begin(), keys.end());
  p.values[rank].assign(values.begin(), values.end());
  if (p.count < num_workers_) return false;
  Status st = Merge(p);
  pending_.erase(step);
  // Steps are applied in the order they complete; a straggler's earlier
  // step would otherwise be applied after a later one.
  applied_below_ = std::max(applied_below_, step + 1);
  if (!st.ok()) return st;
  return true;
}

Status GradientMerger::Merge(Pending& p) {
  if (!keyed_) {
    std::vector<float> sum = std::move(p.values[0]);
    for (int r = 1; r < num_workers_; ++r)
      for (size_t i = 0; i < width_; ++i) sum[i] += p.values[r][i];
    return apply_({}, sum);
  }
  std::vector<uint64_t> keys;
  std::vector<float> sum;
  absl::flat_hash_map<uint64_t, size_t> pos;
  for (int r = 0; r < num_workers_; ++r) {
    for (size_t k = 0; k < p.keys[r].size(); ++k) {
      auto [it, fresh] = pos.try_emplace(p.keys[r][k], keys.size());
      if (fresh) {
        keys.push_back(p.keys[r][k]);
        sum.resize(sum.size() + width_, 0.0f);
      }
      float* dst = sum.data() + it->second * width_;
      const float* src = p.values[r].data() + k * width_;
      for (size_t i = 0; i < width_; ++i) dst[i] += src[i];
    }
  }
  return apply_(keys, sum);
}

size_t GradientMerger::pending_steps() const {
  std::lock_guard<std::mutex> l(mu_);
  return pending_.size();
}

}  // namespace fleet::ps
