#include "trainer/kernels/sampling_kernels.h"

#include <algorithm>
#include <cmath>

#include "comm/vector_clones.h"
#include "trainer/kernels/fast_exp.h"

// Built like gpt_cpu_kernels.cc (-O3 -fno-math-errno -fopenmp-simd
// -ffp-contract=off): the row loops vectorise, and an element's weight has
// the same bits in every target clone.

namespace fleet::trainer {
namespace {

// An exponent argument for entries that weigh nothing: far below ExpF's
// clamp, and never NaN (a NaN would reach ExpF's integer conversion).
constexpr float kNoWeight = -200.0f;

FLEET_INLINE bool Finite(float v) { return (v - v) == 0.0f; }  // false for inf and NaN

FLEET_VECTOR_CLONES float MaxFiniteValue(const float* __restrict x, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    m = Finite(v) && v > m ? v : m;
  }
  return m;
}

FLEET_VECTOR_CLONES void ExpRange(const float* __restrict x, int64_t n, float scale, float max,
                                  float* __restrict w) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const bool finite = Finite(v);
    const float e = ExpF(finite ? (v - max) * scale : kNoWeight);
    w[i] = finite ? e : 0.0f;
  }
}

// The sum of w[begin, end) in 8 double lanes (lane j takes begin + j,
// begin + j + 8, ...), the lanes added pairwise: one fixed order, whatever
// the vector width.
double BlockSum(const float* w, int64_t begin, int64_t end) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += w[i + j];
  }
  for (int j = 0; i < end; ++i, ++j) lanes[j] += w[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

IndexedLogit MaxFinite(const float* x, int64_t n) {
  const float m = MaxFiniteValue(x, n);
  if (!Finite(m)) return {-1, -INFINITY};
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == m) return {static_cast<int32_t>(i), m};
  }
  return {-1, -INFINITY};  // unreachable: m is one of x
}

double BlockSums(const float* w, int64_t n, double* block_sums) {
  double total = 0.0;
  for (int64_t b = 0, begin = 0; begin < n; ++b, begin += kSampleBlock) {
    block_sums[b] = BlockSum(w, begin, std::min(n, begin + kSampleBlock));
    total += block_sums[b];
  }
  return total;
}

double ExpWeights(const float* x, int64_t n, float scale, float max, float* w, double* block_sums) {
  ExpRange(x, n, scale, max, w);
  return BlockSums(w, n, block_sums);
}

int64_t FindByRunningWeight(const float* w, const double* block_sums, int64_t n, double target) {
  double running = 0.0;
  for (int64_t b = 0, begin = 0; begin < n; ++b, begin += kSampleBlock) {
    if (running + block_sums[b] > target) {
      // Inside this block. Its entries summed in order may fall short of its
      // (lane-ordered) block sum by rounding: then its last weighted entry.
      double inside = running;
      int64_t last = -1;
      for (int64_t i = begin; i < std::min(n, begin + kSampleBlock); ++i) {
        if (w[i] <= 0.0f) continue;
        inside += w[i];
        last = i;
        if (inside > target) return i;
      }
      if (last >= 0) return last;
    }
    running += block_sums[b];
  }
  for (int64_t i = n - 1; i >= 0; --i) {
    if (w[i] > 0.0f) return i;
  }
  return -1;
}

double LogSumExp(const float* x, int64_t n, float* w, double* block_sums) {
  const IndexedLogit top = MaxFinite(x, n);
  if (top.index < 0) return -INFINITY;
  return top.value + std::log(ExpWeights(x, n, 1.0f, top.value, w, block_sums));
}

void TopK(const float* x, int64_t n, int64_t k, std::vector<IndexedLogit>* scratch,
          std::vector<IndexedLogit>* out) {
  scratch->clear();
  for (int64_t i = 0; i < n; ++i) {
    if (Finite(x[i])) scratch->push_back({static_cast<int32_t>(i), x[i]});
  }
  out->clear();
  const auto keep = static_cast<size_t>(std::clamp<int64_t>(k, 0, scratch->size()));
  if (keep == 0) return;
  std::nth_element(scratch->begin(), scratch->begin() + (keep - 1), scratch->end(), MoreLikely);
  out->assign(scratch->begin(), scratch->begin() + keep);
  std::sort(out->begin(), out->end(), MoreLikely);
}

}  // namespace fleet::trainer
