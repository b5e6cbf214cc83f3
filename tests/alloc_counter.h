// Counts heap allocations made by one thread, for tests that hold a hot path
// to "allocates nothing once warm". Linking fleet_test_alloc_counter replaces
// the global operator new (all forms) with one that counts the calls a
// thread makes while that thread has counting on; other threads (the test
// framework's, a pool's) are not counted.
#pragma once

namespace fleet::testing {

// Zeroes this thread's count and starts counting.
void StartCountingAllocations();
// Stops counting and returns the allocations since the last Start.
long StopCountingAllocations();

// Counts from construction to Stop() (or destruction).
class AllocationCounter {
 public:
  AllocationCounter() { StartCountingAllocations(); }
  ~AllocationCounter() { StopCountingAllocations(); }
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;
  long Stop() { return StopCountingAllocations(); }
};

}  // namespace fleet::testing
