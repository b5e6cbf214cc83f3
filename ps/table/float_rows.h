// Row-of-floats helpers for the per-key loops of tables and clients. Rows of
// sparse tables are mostly a few floats wide; for those a plain loop beats
// a memmove call (which std::copy_n becomes for a runtime length), and wide
// rows still get memcpy or a loop the compiler vectorises.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace fleet::ps {

// dst[0, n) = src[0, n). The ranges must not overlap.
inline void CopyFloats(const float* src, size_t n, float* dst) {
  if (n > 32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}

// Row k of dst = row index[k] of src, k in [0, count), rows of dim floats.
inline void GatherRows(const float* src, size_t dim, const uint32_t* index, size_t count,
                       float* dst) {
  if (dim == 1) {  // one float a key: a load and a store, no per-row call
    for (size_t k = 0; k < count; ++k) dst[k] = src[index[k]];
    return;
  }
  for (size_t k = 0; k < count; ++k) CopyFloats(src + size_t{index[k]} * dim, dim, dst + k * dim);
}

// Row index[k] of dst = row k of src, k in [0, count), rows of dim floats.
inline void ScatterRows(const float* src, size_t dim, const uint32_t* index, size_t count,
                        float* dst) {
  if (dim == 1) {
    for (size_t k = 0; k < count; ++k) dst[index[k]] = src[k];
    return;
  }
  for (size_t k = 0; k < count; ++k) CopyFloats(src + k * dim, dim, dst + size_t{index[k]} * dim);
}

// dst[0, n) += src[0, n). The ranges must not overlap.
inline void AddFloats(const float* __restrict src, size_t n, float* __restrict dst) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

// True when no element is NaN or +-Inf. One pass without a branch per
// element (requests are checked on the hot path): a float is not finite
// when its exponent bits are all ones, and adding one to such an exponent
// carries into the sign bit. Blocks of 16 have a fixed trip count, so GCC
// vectorises them at -O2 too.
inline bool AllFinite(std::span<const float> v) {
  constexpr uint32_t kExponent = 0x7f800000u, kExponentOne = 0x00800000u;
  auto bits = [&](size_t i) {
    uint32_t b;
    std::memcpy(&b, v.data() + i, sizeof b);
    return (b & kExponent) + kExponentOne;
  };
  // 16 lanes kept apart until the end, so the block loop is vector ORs only.
  uint32_t lanes[16] = {};
  size_t i = 0;
  for (; i + 16 <= v.size(); i += 16) {
#pragma GCC unroll 16
    for (size_t j = 0; j < 16; ++j) lanes[j] |= bits(i + j);
  }
  uint32_t carry = 0;
  for (uint32_t lane : lanes) carry |= lane;
  for (; i < v.size(); ++i) carry |= bits(i);
  return (carry & 0x80000000u) == 0;
}

// The index of the first NaN or +-Inf of v, or v.size(). For error messages.
inline size_t FirstNonFinite(std::span<const float> v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!AllFinite(v.subspan(i, 1))) return i;
  }
  return v.size();
}

}  // namespace fleet::ps
