// BufferPool: reuses the large payload buffers of requests and replies (a
// pull reply gathered on a server, a push's gradients gathered on a
// client) instead of allocating each one afresh. A fresh multi-MiB buffer
// comes from mmap or a trimmed heap: every one of its pages faults and is
// zeroed by the kernel on first write, and freeing it unmaps the pages
// again (a TLB shootdown on every core). On a 4 MiB request that costs
// about as much as copying the buffer.
//
// Get() hands out an SArray whose memory goes back to the pool when the
// last SArray (or ZeroMQ message) referring to it is released, on whatever
// thread that happens. The pool keeps at most Options::max_buffers
// buffers and Options::max_cached_bytes bytes; anything beyond is freed.
// Buffers may outlive the pool (they are then freed on release).
//
// Thread safety: every method is thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "comm/sarray.h"

namespace fleet {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  struct Options {
    // Smaller requests are left to malloc, which serves them from its
    // caches without faults.
    size_t min_bytes = size_t{64} << 10;
    // What the pool may hold while no request uses it.
    size_t max_cached_bytes = size_t{64} << 20;
    size_t max_buffers = 8;
  };

  static std::shared_ptr<BufferPool> Create(Options options) {
    return std::shared_ptr<BufferPool>(new BufferPool(options));
  }
  static std::shared_ptr<BufferPool> Create() { return Create(Options()); }

  ~BufferPool() {
    for (const Block& b : free_) Free(b.data);
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // n elements, not initialised. Below min_bytes: a plain
  // SArray::Uninitialized.
  template <typename T>
  SArray<T> Get(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < options_.min_bytes) return SArray<T>::Uninitialized(n);
    Block block = Take(bytes);
    if (block.data == nullptr) block = {Allocate(bytes), bytes};
    std::shared_ptr<void> owner(block.data, Return{weak_from_this(), block.bytes});
    return SArray<T>(static_cast<T*>(block.data), n, std::move(owner));
  }

  // Buffers held for reuse now, and their bytes (for tests and stats).
  size_t cached_buffers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return free_.size();
  }
  size_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

 private:
  struct Block {
    void* data = nullptr;
    size_t bytes = 0;
  };
  // The deleter of a handed-out buffer.
  struct Return {
    std::weak_ptr<BufferPool> pool;
    size_t bytes;
    void operator()(void* data) const {
      if (auto p = pool.lock()) {
        p->Put({data, bytes});
      } else {
        Free(data);
      }
    }
  };

  explicit BufferPool(Options options) : options_(options) {}

  // 64-byte aligned, as SArray's own buffers: any view may be reinterpreted.
  static void* Allocate(size_t bytes) { return ::operator new(bytes, std::align_val_t{64}); }
  static void Free(void* data) { ::operator delete(data, std::align_val_t{64}); }

  // The smallest cached buffer of at least `bytes` and at most twice that
  // (a much larger one would sit idle under a small request); none: {}.
  Block Take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const size_t b = free_[i].bytes;
      if (b >= bytes && b / 2 <= bytes && (best == free_.size() || b < free_[best].bytes)) best = i;
    }
    if (best == free_.size()) return {};
    const Block block = free_[best];
    free_[best] = free_.back();
    free_.pop_back();
    cached_bytes_ -= block.bytes;
    return block;
  }

  void Put(Block block) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_.size() < options_.max_buffers &&
          cached_bytes_ + block.bytes <= options_.max_cached_bytes) {
        free_.push_back(block);
        cached_bytes_ += block.bytes;
        return;
      }
    }
    Free(block.data);
  }

  const Options options_;
  mutable std::mutex mu_;
  std::vector<Block> free_;  // guarded by mu_
  size_t cached_bytes_ = 0;  // guarded by mu_
};

}  // namespace fleet
