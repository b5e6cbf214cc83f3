// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2,
// 3", SC11): a counter-based random number generator. Its output is a pure
// function of a 128-bit counter and a 64-bit key, so any element's random
// bits are computed where they are needed, in any order, on any device, and
// computed again later (dropout's backward and activation recompute) with no
// state stored in between. The same header compiles for the host (CPU
// kernels, the CUDA emulation) and for nvcc's device code, and the three
// give the same bits (integer arithmetic only).
//
// Dropout keeps or drops element `index` of the stream `stream` (a sequence
// of the batch, named by its sample) of dropout site `site` (which dropout
// of the model) of the step whose key is `seed`:
//   bits = Philox4x32-10(counter = {index / 4, lane, stream, site},
//                        key = {seed low 32, seed high 32})[index % 4]
//   kept  <=> bits >= DropoutThreshold(p)
// `lane` separates streams of one sequence that a kernel indexes on its own
// (attention: the head, so that a tensor-parallel rank holding heads
// [h0, h1) draws the whole model's bits for them; 0 elsewhere).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLEET_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLEET_HOST_DEVICE inline
#endif

namespace fleet::trainer::philox {

struct Bits4 {
  uint32_t v[4];
};

FLEET_HOST_DEVICE void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Random123's philox4x32 with 10 rounds (its known-answer vectors are in
// tests/trainer/dropout_test.cc).
FLEET_HOST_DEVICE Bits4 Philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                   uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(0xD2511F53u, c0, &hi0, &lo0);
    MulHiLo(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Bits4{{c0, c1, c2, c3}};
}

// The bits of elements [4 group, 4 group + 4) of a dropout stream.
// REQUIRES: group < 2^32 (a stream of up to 2^34 elements).
FLEET_HOST_DEVICE Bits4 DropoutGroupBits(uint64_t seed, uint32_t site, uint32_t stream,
                                         uint32_t lane, uint64_t group) {
  return Philox4x32(static_cast<uint32_t>(group), lane, stream, site, static_cast<uint32_t>(seed),
                    static_cast<uint32_t>(seed >> 32));
}

// Elements whose bits are below this are dropped: round(p 2^32), capped.
// REQUIRES: 0 <= p < 1.
FLEET_HOST_DEVICE uint32_t DropoutThreshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0 + 0.5;
  return t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

// Whether element `index` of the stream is kept.
FLEET_HOST_DEVICE bool DropoutKeep(uint64_t seed, uint32_t site, uint32_t stream, uint32_t lane,
                                   uint64_t index, uint32_t threshold) {
  return DropoutGroupBits(seed, site, stream, lane, index >> 2).v[index & 3] >= threshold;
}

}  // namespace fleet::trainer::philox
