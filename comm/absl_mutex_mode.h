// Process start-up setting for programs that take absl::Mutex locks on hot
// paths (the parameter server's sparse tables).
//
// Thread safety: call once at start-up, before other threads exist.
#pragma once

#include "absl/synchronization/mutex.h"

namespace fleet {

// The system libabsl is compiled without NDEBUG, so its debug-only mutex
// deadlock detector is on by default: every shard lock taken under the
// table lock then updates a global lock graph under a global spinlock
// (bench/ps_bench: server CPU per 1000-key pull 430-700 us with it,
// 280-350 us without). An optimized build turns it off, as absl's own
// NDEBUG default would; debug builds and tests keep it.
inline void UseReleaseMutexChecksInOptimizedBuilds() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace fleet
