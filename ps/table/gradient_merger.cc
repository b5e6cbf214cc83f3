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
                                 std::span<const float> values, const AddOptions& options) {
  // A step's slots are allocated up front: bound what a request may ask for.
  constexpr int kMaxContributors = 1 << 16;
  if (options.contributors < 0 || options.contributors > kMaxContributors)
    return Status::InvalidArgument(
        absl::StrCat("contributors must be in [0, ", kMaxContributors, "]"),
        std::to_string(options.contributors));
  const int contributors = options.contributors > 0 ? options.contributors : num_workers_;
  if (rank < 0 || rank >= contributors)
    return Status::InvalidArgument("worker rank out of range",
                                   absl::StrCat(rank, " of ", contributors));
  const size_t expect = keyed_ ? keys.size() * width_ : width_;
  if ((!keyed_ && !keys.empty()) || values.size() != expect)
    return Status::InvalidArgument(absl::StrCat("gradient of step ", step, " from rank ", rank, " has ",
                                                keys.size(), " keys and ", values.size(),
                                                " floats, expected ", expect, " floats"));
  if (step < 0) {
    return Status::InvalidArgument(absl::StrCat("step ", step, " from rank ", rank, " is negative"));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (step > applied_below_ + kMaxStepsAhead) {
    return Status::InvalidArgument(absl::StrCat(
        "step ", step, " from rank ", rank, " is more than ", kMaxStepsAhead,
        " step ahead of step ", applied_below_,
        ", the next one to apply (a worker pushes a step only after its previous one was applied)"));
  }
  if (step < applied_below_) {
    if (options.idempotent) return true;  // a resend of a contribution already applied
    return Status::InvalidArgument(
        absl::StrCat("step ", step, " from rank ", rank, " was already applied"));
  }
  auto it = pending_.find(step);
  if (it != pending_.end() && it->second.expected != contributors) {
    return Status::InvalidArgument(absl::StrCat("step ", step, " waits for ", it->second.expected,
                                                " contributions, rank ", rank, "'s push says ",
                                                contributors));
  }
  if (it != pending_.end() && it->second.arrived[rank]) {
    if (options.idempotent) return false;  // a resend: answered with the step
    return Status::InvalidArgument(absl::StrCat("rank ", rank, " sent step ", step, " twice"));
  }
  Pending& p = pending_[step];
  if (p.arrived.empty()) {
    p.expected = contributors;
    p.arrived.assign(contributors, false);
    p.keys.resize(contributors);
    p.values.resize(contributors);
  }
  p.arrived[rank] = true;
  ++p.count;
  p.keys[rank].assign(keys.begin(), keys.end());
  p.values[rank].assign(values.begin(), values.end());
  if (p.count < p.expected) return false;
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
    for (int r = 1; r < p.expected; ++r)
      for (size_t i = 0; i < width_; ++i) sum[i] += p.values[r][i];
    return apply_({}, sum);
  }
  std::vector<uint64_t> keys;
  std::vector<float> sum;
  absl::flat_hash_map<uint64_t, size_t> pos;
  for (int r = 0; r < p.expected; ++r) {
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

int64_t GradientMerger::next_step() const {
  std::lock_guard<std::mutex> l(mu_);
  return applied_below_;
}

std::vector<int> GradientMerger::Missing(int64_t step, int* contributors) const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<int> missing;
  auto it = pending_.find(step);
  if (it == pending_.end()) return missing;
  *contributors = it->second.expected;
  for (int r = 0; r < it->second.expected; ++r) {
    if (!it->second.arrived[r]) missing.push_back(r);
  }
  return missing;
}

void GradientMerger::Abandon(int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  pending_.erase(step);
}

size_t GradientMerger::pending_steps() const {
  std::lock_guard<std::mutex> l(mu_);
  return pending_.size();
}

void GradientMerger::RestoreNextStep(int64_t next) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(pending_.empty() && next >= 0) << "RestoreNextStep(" << next << ") with "
                                       << pending_.size() << " steps pending";
  applied_below_ = next;
}

}  // namespace fleet::ps
