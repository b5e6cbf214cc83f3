// CopyFloats: copies a row of floats. Rows of sparse tables are mostly a few
// floats wide; for those a plain loop beats a memmove call (which
// std::copy_n becomes for a runtime length), and wide rows still get memcpy.
//
// Thread safety: a pure function.
#pragma once

#include <cstddef>
#include <cstring>

namespace fleet::ps {

inline void CopyFloats(const float* src, size_t n, float* dst) {
  if (n > 32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace fleet::ps
