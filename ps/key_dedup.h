// KeyDeduper: the distinct keys of one request, each with a value the caller
// chose at its first occurrence (PsClient stores the key's position in its
// server's key list).
//
// Open addressing with linear probing over a power-of-two array at most half
// full, indexed by the top bits of Mix64(key) (which the caller has computed
// anyway to route the key). A request's table is not cleared: every slot
// carries the number of the request that filled it, so Reset is O(1) and a
// deduper kept per thread neither allocates nor faults pages once warm. (In
// a micro-benchmark, key generation included, an absl::flat_hash_map made
// per request took 38 and 106 ns per key for 1000 and 131072 keys, this
// table 11 and 17.)
//
// Thread safety: none; one request at a time.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fleet::ps {

class KeyDeduper {
 public:
  // Empties the table and sizes it for up to `n` distinct keys.
  void Reset(size_t n) {
    const size_t capacity = std::max<size_t>(16, std::bit_ceil(2 * n));
    if (capacity > slots_.size()) slots_.resize(capacity);
    shift_ = 64 - std::countr_zero(capacity);
    mask_ = capacity - 1;
    if (++request_ == 0) {  // wrapped: old marks could look current
      for (Slot& s : slots_) s.request = 0;
      request_ = 1;
    }
  }

  // `hash` must be Mix64(key).
  void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[hash >> shift_]); }

  // The value stored with `key`; when the key is new, stores `value_if_new`
  // and sets *inserted. REQUIRES: fewer than n distinct keys so far.
  uint32_t FindOrInsert(uint64_t key, uint64_t hash, uint32_t value_if_new, bool* inserted) {
    for (size_t i = hash >> shift_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.request != request_) {
        s = Slot{key, value_if_new, request_};
        *inserted = true;
        return value_if_new;
      }
      if (s.key == key) {
        *inserted = false;
        return s.value;
      }
    }
  }

  // Bytes held between requests.
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }
  // Frees the table (after an unusually large request).
  void Release() { slots_ = {}; }

 private:
  struct Slot {
    uint64_t key;
    uint32_t value;
    uint32_t request;  // filled during request number `request`
  };

  std::vector<Slot> slots_;
  uint32_t request_ = 0;
  uint32_t shift_ = 64;
  size_t mask_ = 0;
};

}  // namespace fleet::ps
