// Storage for the rows of one local shard: fixed-width slots in chunks of a
// power-of-two number of rows, reused through a free list. Chunks never
// move, so a row pointer stays valid until its slot is freed, and growth
// never copies rows (unlike a std::vector arena, whose doubling would cost
// up to 2x memory and a copy).
//
// Internal to SparseTable. Thread safety: none; the shard lock protects it.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace fleet::ps {

// Slots per chunk as a shift: chunks of about kChunkBytes of the widest
// column, between 1 and 1024 rows. Sized in bytes so a table of 4 KiB rows
// does not reserve 128 of them per shard, and a table of 4-byte rows does
// not allocate a chunk every few rows.
inline constexpr size_t kChunkBytes = 64 << 10;
inline uint32_t ChunkShiftFor(size_t widest_row_bytes) {
  const size_t rows = std::clamp<size_t>(kChunkBytes / std::max<size_t>(widest_row_bytes, 1), 1, 1024);
  return static_cast<uint32_t>(std::bit_width(rows) - 1);  // floor(log2(rows))
}

// `width` Ts per slot, allocated a chunk of 1 << shift slots at a time.
template <typename T>
class ChunkedColumn {
 public:
  ChunkedColumn(size_t width, uint32_t shift) : width_(width), shift_(shift) {}

  size_t width() const { return width_; }
  void AddChunk() {
    if (width_ == 0) return;
    chunks_.push_back(std::make_unique_for_overwrite<T[]>((size_t{1} << shift_) * width_));
    bases_.push_back(chunks_.back().get());
  }
  T* at(uint32_t slot) const {
    return chunks_[slot >> shift_].get() + (slot & ((uint32_t{1} << shift_) - 1)) * width_;
  }
  size_t bytes() const { return chunks_.size() * (size_t{1} << shift_) * width_ * sizeof(T); }

  // The column's layout in a value a loop keeps in registers (the members
  // would be reloaded after each store the loop makes): slot s is at
  // bases[s >> shift] + (s & mask) * width. Valid until the next AddChunk.
  struct View {
    T* const* bases;
    uint32_t shift;
    uint32_t mask;
    size_t width;
  };
  View view() const { return {bases_.data(), shift_, (uint32_t{1} << shift_) - 1, width_}; }

 private:
  const size_t width_;
  const uint32_t shift_;
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::vector<T*> bases_;  // chunks_[i].get()
};

// A slot's key and row side by side: [u64 key][row_floats floats]. A
// lookup confirms the key on the cache line where the row starts, so in a
// table far larger than the caches it costs one cache miss fewer than a
// key column beside a row column.
class KeyedRowColumn {
 public:
  static constexpr size_t kKeyFloats = sizeof(uint64_t) / sizeof(float);

  KeyedRowColumn(size_t row_floats, uint32_t shift)
      : column_(kKeyFloats + row_floats, shift) {}

  // Bytes of one slot (key and row), for sizing chunks.
  static size_t SlotBytes(size_t row_floats) { return (kKeyFloats + row_floats) * sizeof(float); }

  void AddChunk() { column_.AddChunk(); }
  // A slot's record: its key, then its row. Finding it is the chunk
  // arithmetic; callers that read both key and row find it once.
  float* record(uint32_t slot) const { return column_.at(slot); }
  using View = ChunkedColumn<float>::View;  // of the records (width: key and row)
  View view() const { return column_.view(); }
  // Records are 4-byte aligned only, hence memcpy (one plain load on x86).
  static uint64_t KeyOf(const float* record) {
    uint64_t k;
    std::memcpy(&k, record, sizeof k);
    return k;
  }
  static float* RowOf(float* record) { return record + kKeyFloats; }
  uint64_t key(uint32_t slot) const { return KeyOf(record(slot)); }
  void set_key(uint32_t slot, uint64_t key) { std::memcpy(record(slot), &key, sizeof key); }
  float* row(uint32_t slot) const { return RowOf(record(slot)); }
  size_t bytes() const { return column_.bytes(); }

 private:
  ChunkedColumn<float> column_;
};

// Hands out slot numbers; `grew` says when callers must add a chunk to each
// of their columns (the new slot is the first of the new chunk).
class SlotAllocator {
 public:
  // Slot ids are uint32; UINT32_MAX is the tables' "no slot" marker.
  static constexpr uint32_t kMaxSlots = UINT32_MAX;

  // `capacity`: slots this allocator may hand out at most (tests lower it).
  explicit SlotAllocator(uint32_t shift, uint32_t capacity = kMaxSlots)
      : shift_(shift), capacity_(capacity) {}

  // A free slot, or nullopt when all `capacity` slots are in use: a flood of
  // new keys from a peer must become an error reply, never an abort.
  std::optional<uint32_t> Allocate(bool* grew) {
    *grew = false;
    if (!free_.empty()) {
      const uint32_t s = free_.back();
      free_.pop_back();
      return s;
    }
    if (high_ >= capacity_) return std::nullopt;
    if ((high_ & ((uint32_t{1} << shift_) - 1)) == 0) *grew = true;
    return high_++;
  }
  void Free(uint32_t slot) { free_.push_back(slot); }
  size_t live() const { return high_ - free_.size(); }
  size_t bytes() const { return free_.capacity() * sizeof(uint32_t); }

 private:
  const uint32_t shift_;
  const uint32_t capacity_;
  std::vector<uint32_t> free_;
  uint32_t high_ = 0;
};

// The row quota of one table on one server (max_rows_per_server), shared
// by the table's local shards; it also counts the rows stored (a disk tier
// reads that to know when to write rows down). Without a quota (0) every
// row is taken. Thread-safe.
class RowQuota {
 public:
  explicit RowQuota(uint64_t max_rows) : max_(max_rows) {}

  uint64_t max() const { return max_; }
  uint64_t rows() const { return rows_.load(std::memory_order_relaxed); }
  // Reserves one row; false when the quota is full.
  bool Take() {
    if (rows_.fetch_add(1, std::memory_order_relaxed) >= max_ && max_ != 0) {
      rows_.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  // Counts a row even above the quota (a checkpoint being loaded).
  void Force() { rows_.fetch_add(1, std::memory_order_relaxed); }
  // Returns a row taken or forced.
  void Give() { rows_.fetch_sub(1, std::memory_order_relaxed); }

 private:
  const uint64_t max_;
  std::atomic<uint64_t> rows_{0};
};

}  // namespace fleet::ps
