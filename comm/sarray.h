// SArray<T>: a shared, typed view of contiguous memory, the unit of zero-copy
// payloads. Copying an SArray copies a pointer and a reference count, never
// the elements; the memory lives while any SArray (or ZeroMQ message being
// sent) still refers to it.
//
// Thread safety: the reference count is atomic, so copies may be handed to
// other threads; writing the elements while another thread reads them needs
// the caller's own synchronisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include <glog/logging.h>

namespace fleet {

template <typename T>
class SArray {
  static_assert(std::is_trivially_copyable_v<T>, "SArray holds plain numbers");

 public:
  SArray() = default;

  // Allocates n value-initialised elements.
  explicit SArray(size_t n) { Allocate(n, /*zero=*/true); }

  // Copies [data, data + n).
  SArray(const T* data, size_t n) {
    Allocate(n, /*zero=*/false);
    if (n) std::memcpy(data_, data, n * sizeof(T));
  }

  // Takes the vector's storage without copying the elements.
  explicit SArray(std::vector<T>&& v) {
    auto holder = std::make_shared<std::vector<T>>(std::move(v));
    data_ = holder->data();
    size_ = holder->size();
    owner_ = std::move(holder);
  }

  // Wraps memory owned by `owner`; the view stays valid while owner lives.
  SArray(T* data, size_t n, std::shared_ptr<void> owner)
      : owner_(std::move(owner)), data_(data), size_(n) {}

  // Allocates n elements without initialising them (for buffers about to be
  // overwritten, e.g. a pull response).
  static SArray Uninitialized(size_t n) {
    SArray a;
    a.Allocate(n, /*zero=*/false);
    return a;
  }

  // Reinterprets another SArray's bytes, sharing its memory.
  // REQUIRES: the byte size is a multiple of sizeof(T) and the data is
  // aligned for T (CHECKed: callers validate sizes from the wire first and
  // use AlignedCopyOf for received bytes of unknown alignment).
  template <typename U>
  static SArray Reinterpret(const SArray<U>& other) {
    const size_t bytes = other.size() * sizeof(U);
    CHECK_EQ(bytes % sizeof(T), 0u) << "byte size " << bytes << " not a multiple of " << sizeof(T);
    CHECK_EQ(reinterpret_cast<uintptr_t>(other.data()) % alignof(T), 0u) << "misaligned SArray";
    return SArray(reinterpret_cast<T*>(const_cast<U*>(other.data())), bytes / sizeof(T),
                  other.owner());
  }

  T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) const { return data_[i]; }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }
  std::span<T> span() const { return {data_, size_}; }
  const std::shared_ptr<void>& owner() const { return owner_; }

  // A view of [begin, end) sharing this array's memory.
  SArray Segment(size_t begin, size_t end) const {
    CHECK_LE(begin, end);
    CHECK_LE(end, size_);
    return SArray(data_ + begin, end - begin, owner_);
  }

 private:
  void Allocate(size_t n, bool zero) {
    // operator new's default alignment (16 bytes) lets any SArray<char>
    // made here be reinterpreted as any numeric type. Not more: glibc's
    // aligned allocation takes a larger block and splits it on every call
    // (callgrind, allocation alone: 890 against 640 instructions for 2 KB,
    // 3,270 against 2,270 for 14 KB), and the PS allocates a few arrays a
    // request.
    static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= alignof(std::max_align_t));
    std::shared_ptr<T[]> p(static_cast<T*>(::operator new[](std::max<size_t>(n, 1) * sizeof(T))),
                           [](T* q) { ::operator delete[](q); });
    if (zero && n) std::memset(p.get(), 0, n * sizeof(T));
    data_ = p.get();
    size_ = n;
    owner_ = std::shared_ptr<void>(p, p.get());
  }

  std::shared_ptr<void> owner_;
  T* data_ = nullptr;
  size_t size_ = 0;
};

using Bytes = SArray<char>;

}  // namespace fleet
