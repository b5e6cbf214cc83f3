// Storage for the rows of one sparse shard: fixed-width slots in chunks of
// kChunkRows, reused through a free list. Chunks never move, so a row pointer
// stays valid until its slot is freed, and growth never copies rows (unlike a
// std::vector arena, whose doubling would cost up to 2x memory and a copy).
//
// Internal to SparseTable. Thread safety: none; the shard lock protects it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <glog/logging.h>

namespace fleet::ps {

inline constexpr uint32_t kChunkRows = 128;

// `width` Ts per slot, allocated a chunk at a time.
template <typename T>
class ChunkedColumn {
 public:
  explicit ChunkedColumn(size_t width) : width_(width) {}

  size_t width() const { return width_; }
  void AddChunk() {
    if (width_ == 0) return;
    chunks_.push_back(std::make_unique_for_overwrite<T[]>(kChunkRows * width_));
  }
  T* at(uint32_t slot) const { return chunks_[slot / kChunkRows].get() + (slot % kChunkRows) * width_; }
  size_t bytes() const { return chunks_.size() * kChunkRows * width_ * sizeof(T); }

 private:
  const size_t width_;
  std::vector<std::unique_ptr<T[]>> chunks_;
};

// Hands out slot numbers; `grew` says when callers must add a chunk to each
// of their columns (the new slot is the first of the new chunk).
class SlotAllocator {
 public:
  uint32_t Allocate(bool* grew) {
    *grew = false;
    if (!free_.empty()) {
      const uint32_t s = free_.back();
      free_.pop_back();
      return s;
    }
    CHECK_LT(high_, UINT32_MAX) << "shard slot space exhausted";
    if (high_ % kChunkRows == 0) *grew = true;
    return high_++;
  }
  void Free(uint32_t slot) { free_.push_back(slot); }
  size_t live() const { return high_ - free_.size(); }
  size_t bytes() const { return free_.capacity() * sizeof(uint32_t); }

 private:
  std::vector<uint32_t> free_;
  uint32_t high_ = 0;
};

}  // namespace fleet::ps
