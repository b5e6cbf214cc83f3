// The one byte codec of FleetPS's files: ByteWriter appends fixed-layout
// little-endian records (PODs, float arrays, u32-length strings) to a
// string; ByteReader reads them back and never reads past its input: every
// Get* returns false on truncation, consumes nothing then, and the caller
// turns that into a Corruption status naming the file and field. Used by PS
// checkpoints, the push log, trainer checkpoints and sharded optimizer state.
//
// Thread safety: plain values; one object per thread.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace fleet {

static_assert(std::endian::native == std::endian::little,
              "FleetPS files are little-endian and written with memcpy");

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void PutFloats(std::span<const float> v) {
    out_->append(reinterpret_cast<const char*>(v.data()), v.size_bytes());
  }
  void PutBytes(std::string_view s) { out_->append(s); }
  // u32 length, then the bytes.
  void PutString(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_->append(s);
  }

 private:
  std::string* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetFloats(std::span<float> v) {
    if (in_.size() - pos_ < v.size_bytes()) return false;
    std::memcpy(v.data(), in_.data() + pos_, v.size_bytes());
    pos_ += v.size_bytes();
    return true;
  }
  bool GetBytes(size_t n, std::string_view* v) {
    if (in_.size() - pos_ < n) return false;
    *v = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n;
    std::string_view v;
    if (!Get(&n) || !GetBytes(n, &v)) return false;
    s->assign(v);
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  size_t position() const { return pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace fleet
