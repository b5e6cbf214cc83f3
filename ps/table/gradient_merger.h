// GradientMerger: sync-mode determinism. Collects each worker's gradient for
// a step; when all W workers have contributed it sums them in worker-rank
// order (rank 0 first), whatever order they arrived in, and applies the sum
// once through the callback. Float addition is not associative, so a fixed
// order is what makes sync training bit-reproducible.
//
// Keyed (sparse) contributions are (keys, values with `width` floats per
// key); the merged gradient lists each key once, in order of first
// appearance scanning ranks 0..W-1, with the rank-ordered sum of its values.
// Unkeyed (dense) contributions are `width` floats each, summed elementwise.
//
// Thread safety: thread-safe. The Add that completes a step runs the apply
// callback on the calling thread while holding the merger's lock, so steps
// are applied one at a time and in completion order; other Adds only copy
// their contribution and return.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "comm/status.h"

namespace fleet::ps {

class GradientMerger {
 public:
  // Applies one merged step. keys is empty for an unkeyed merger.
  using ApplyFn = std::function<Status(std::span<const uint64_t> keys, std::span<const float> values)>;

  // REQUIRES: num_workers >= 1, width >= 1, apply callable.
  GradientMerger(int num_workers, size_t width, bool keyed, ApplyFn apply);

  struct AddOptions {
    // Contributions the step waits for; 0 = num_workers. Every contribution
    // of a step must say the same.
    int contributors = 0;
    // A second contribution of the same rank to a step is dropped: Add
    // returns false while the step waits and true once it was applied,
    // instead of an error (a resent micro-batch).
    bool idempotent = false;
  };

  // Steps more than this ahead of next_step() are refused: a worker pushes
  // step k + 1 only after its push of step k was answered, i.e. applied, so
  // only a forged or broken push can be further ahead (and would otherwise
  // mark every real step below it as applied).
  static constexpr int64_t kMaxStepsAhead = 1;

  // Records rank's gradient for step. Returns true when the step is applied
  // (this was the last contribution and the merged step was applied now; the
  // Status of a failed apply is returned instead), false when it still waits
  // for others. Ranks are in [0, contributors) and summed in that order.
  // Errors: InvalidArgument for a rank out of range, a contributor count
  // that differs from the step's, a second contribution of a rank to a
  // step or one to a step already applied (unless idempotent), a negative
  // step or one more than kMaxStepsAhead beyond next_step(), or sizes that
  // do not match width (keys.size() * width values when keyed, width when
  // not); the pending step is then unchanged.
  Result<bool> Add(int64_t step, int rank, std::span<const uint64_t> keys,
                   std::span<const float> values, const AddOptions& options);
  Result<bool> Add(int64_t step, int rank, std::span<const uint64_t> keys,
                   std::span<const float> values) {
    return Add(step, rank, keys, values, AddOptions{});
  }

  // Steps with some but not all contributions (for stats and tests).
  size_t pending_steps() const;
  // The lowest step not applied yet (0 at first): steps are numbered from 0.
  int64_t next_step() const;
  // The ranks (in [0, contributors)) whose contribution to a pending step
  // has not arrived, with the step's contributor count; empty when the
  // step is not pending.
  std::vector<int> Missing(int64_t step, int* contributors) const;
  // A restarted server (crash recovery): steps below `next` count as
  // applied. REQUIRES: no step pending, next >= 0.
  void RestoreNextStep(int64_t next);
  // Drops a pending step's contributions (its waiters were answered with an
  // error); the step is not applied and may be pushed again.
  void Abandon(int64_t step);

 private:
  struct Pending {
    int expected = 0;  // contributions the step waits for
    std::vector<bool> arrived;
    int count = 0;
    std::vector<std::vector<uint64_t>> keys;  // per rank
    std::vector<std::vector<float>> values;   // per rank
  };
  Status Merge(Pending& p);

  // Fixed after construction.
  const int num_workers_;
  const size_t width_;
  const bool keyed_;
  const ApplyFn apply_;

  mutable std::mutex mu_;
  std::map<int64_t, Pending> pending_;  // guarded by mu_
  int64_t applied_below_ = 0;  // guarded by mu_; steps < this were applied
};

}  // namespace fleet::ps
