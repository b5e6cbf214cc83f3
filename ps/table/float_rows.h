// Row-of-floats helpers for the per-key loops of tables and clients. Rows of
// sparse tables are mostly a few floats wide; for those a plain loop beats
// a memmove call (which std::copy_n becomes for a runtime length), and wide
// rows still get memcpy or a loop the compiler vectorises.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstring>

namespace fleet::ps {

// dst[0, n) = src[0, n). The ranges must not overlap.
inline void CopyFloats(const float* src, size_t n, float* dst) {
  if (n > 32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}

// dst[0, n) += src[0, n). The ranges must not overlap.
inline void AddFloats(const float* __restrict src, size_t n, float* __restrict dst) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace fleet::ps
