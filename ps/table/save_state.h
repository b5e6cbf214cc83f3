// SaveState: what a table remembers about its checkpoints — where it last
// saved (deltas must go on top of exactly that) and whether an earlier save
// ended with an unknown outcome, after which every save is refused, as
// LevelDB refuses writes after a failed manifest write.
//
// Thread-safe (own mutex). Used by SparseTable and DenseTable; driven by
// Checkpointer.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "comm/status.h"

namespace fleet::ps {

enum class SaveMode { kBase, kDelta };

class SaveState {
 public:
  struct Last {
    std::string dir;
    uint32_t generation = 0;
  };

  // OK, or FailedPrecondition with the reason recorded by Poison.
  Status CheckWritable() const {
    std::lock_guard<std::mutex> l(mu_);
    if (poison_.empty()) return Status::OK();
    return Status::FailedPrecondition(
        "an earlier checkpoint save ended with an unknown outcome; saves are refused until a "
        "successful Load",
        poison_);
  }
  void Poison(std::string reason) {
    std::lock_guard<std::mutex> l(mu_);
    poison_ = std::move(reason);
  }
  // Records a completed save or load of generation `generation` in dir and
  // clears any poison.
  void SetLast(std::string dir, uint32_t generation) {
    std::lock_guard<std::mutex> l(mu_);
    last_ = Last{std::move(dir), generation};
    poison_.clear();
  }
  std::optional<Last> last() const {
    std::lock_guard<std::mutex> l(mu_);
    return last_;
  }

 private:
  mutable std::mutex mu_;
  std::string poison_;        // guarded by mu_; empty: saves allowed
  std::optional<Last> last_;  // guarded by mu_
};

}  // namespace fleet::ps
