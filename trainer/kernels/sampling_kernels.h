// Row kernels over one sequence's logits x [n], for choosing its next token
// (trainer/models/gpt_sampling.h) and for the log-probabilities serving
// reports (serve/sampling.h). Each is O(n) and never sorts the row: a
// GPT-2 vocabulary has 50,257 entries and a server draws one token per
// sequence per step.
//
// Same bits on every CPU: exponentials are ExpF (element-wise, no FMA
// contraction, in whichever target clone the CPU runs) and sums run in a
// fixed order (blocks of kSampleBlock entries, 8 double lanes each), so a
// seeded draw picks the same token on every machine given the same logits.
// Non-finite entries (-inf masks, NaN) weigh nothing and are never chosen.
//
// Thread safety: plain functions over their arguments.
#pragma once

#include <cstdint>
#include <vector>

namespace fleet::trainer {

inline constexpr int64_t kSampleBlock = 64;
inline int64_t SampleBlocks(int64_t n) { return (n + kSampleBlock - 1) / kSampleBlock; }

struct IndexedLogit {
  int32_t index;
  float value;
};

// The largest finite x[i] and the lowest i holding it; index -1 (value
// -inf) when no entry is finite.
IndexedLogit MaxFinite(const float* x, int64_t n);

// w[i] = exp(scale * (x[i] - max)) for finite x[i], else 0 (w [n]);
// block_sums[b] = the sum of w over block b ([SampleBlocks(n)]). Returns the
// sum of the block sums. With max the largest finite entry every weight is
// in (0, 1] (ExpF never underflows to 0: a far entry weighs ~1e-38).
// REQUIRES: scale > 0 and finite; max finite.
double ExpWeights(const float* x, int64_t n, float scale, float max, float* w, double* block_sums);

// Recomputes block_sums ([SampleBlocks(n)]) after weights changed; returns
// their sum.
double BlockSums(const float* w, int64_t n, double* block_sums);

// The draw for `target` in [0, total): the first i at which the running sum
// of w passes target (whole blocks by their block sums, then the entries of
// the block in order). When rounding leaves target at or above the running
// sum's end, the last i with w[i] > 0. -1 when every weight is 0.
int64_t FindByRunningWeight(const float* w, const double* block_sums, int64_t n, double target);

// log(sum over finite x[i] of exp(x[i])), computed as m + log sum exp(x - m)
// with m the largest finite entry; -inf when none is finite. w [n] and
// block_sums [SampleBlocks(n)] are scratch.
double LogSumExp(const float* x, int64_t n, float* w, double* block_sums);

// The k largest finite entries, best first (ties: lower index first); all
// finite ones when fewer. O(n + k log k) by partial selection; `scratch` is
// reused between calls.
void TopK(const float* x, int64_t n, int64_t k, std::vector<IndexedLogit>* scratch,
          std::vector<IndexedLogit>* out);

// Better in the order sampling keeps candidates by: higher value, then lower
// index.
inline bool MoreLikely(const IndexedLogit& a, const IndexedLogit& b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

}  // namespace fleet::trainer
