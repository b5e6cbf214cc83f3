// ExpF: exp(x) for loops that must vectorise (the GPT CPU kernels' softmax,
// GELU and cross-entropy; the sampling kernels' weights).
//
// Include it only from files built with -O3 -fno-math-errno -fopenmp-simd
// -ffp-contract=off (trainer/CMakeLists.txt): without -ffp-contract=off GCC
// would fuse the polynomial into FMAs in some target clones and not in
// others, and the same input would give other bits on another CPU.
#pragma once

#include <cstdint>

#define FLEET_INLINE inline __attribute__((always_inline))

namespace fleet::trainer {

// exp(x), branch-free so that loops over it vectorise: x = n ln2 + r with
// |r| <= ln2 / 2, exp(r) by its degree-6 Taylor polynomial (error < 2 ulp),
// 2^n built in the exponent bits. n is rounded with the 1.5 * 2^23 trick
// (no floor call, which would not vectorise without SSE4.1). Inputs are
// clamped to [-87.3, 88.7]: exp(-inf) gives ~1e-38 rather than 0, which no
// caller can tell apart. (No std:: calls in here: GCC does not inline them
// into the target clones, and a call stops vectorisation.)
FLEET_INLINE float ExpF(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * __builtin_bit_cast(float, bits);
}

}  // namespace fleet::trainer
