// Training and evaluation metrics: pure functions of labels and predictions.
//
// Everything a worker accumulates is exposed as plain arrays of doubles
// (MeanMetric::sums(), BucketedAuc::positives()/negatives()) so the caller
// can all-reduce them with a sum over workers (Gloo, or a PS dense table)
// and compute the global value from the merged arrays. Doubles count
// exactly up to 2^53 samples.
//
// Labels: a label > 0.5 is positive. Predictions are probabilities in
// [0, 1]; a value outside is clamped, and NaN counts as 0.
//
// Thread safety: the classes are plain values; use one per thread and merge.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace fleet::data {

// Running weighted mean (e.g. of the loss, or of 0/1 correctness for
// accuracy).
class MeanMetric {
 public:
  // Adds `count` samples whose values sum to `sum` (a batch at once).
  void Add(double sum, double count) {
    sums_[0] += sum;
    sums_[1] += count;
  }
  void Merge(const MeanMetric& other) { Add(other.sums_[0], other.sums_[1]); }
  // 0 when nothing was added.
  double Mean() const { return sums_[1] > 0 ? sums_[0] / sums_[1] : 0.0; }
  double count() const { return sums_[1]; }
  void Reset() { sums_ = {0.0, 0.0}; }
  // {sum, count}: all-reduce this in place (sum), then Mean() is global.
  std::array<double, 2>& sums() { return sums_; }

 private:
  std::array<double, 2> sums_{0.0, 0.0};
};

// Number of samples whose prediction lands on the label's side of 0.5.
// REQUIRES: probs.size() == labels.size().
int64_t CountCorrectBinary(std::span<const float> probs, std::span<const float> labels);

// Number of rows whose highest score (first one on ties) is at the label.
// scores: [B, num_classes] row-major; labels: [B], a label outside
// [0, num_classes) never counts as correct.
// REQUIRES: scores.size() == labels.size() * num_classes, num_classes >= 1.
int64_t CountCorrectArgmax(std::span<const float> scores, int num_classes,
                           std::span<const int32_t> labels);

// Sum over samples of the binary log loss -[y log p + (1-y) log(1-p)], with
// p clamped to [1e-7, 1 - 1e-7]. REQUIRES: probs.size() == labels.size().
double LogLossSum(std::span<const float> probs, std::span<const float> labels);

// Exact ROC AUC by sorting: the probability that a random positive scores
// above a random negative, a tie counting one half (the average-rank rule).
// O(n log n). Returns NaN when there is no positive or no negative (AUC is
// undefined then). REQUIRES: probs.size() == labels.size().
double ExactAuc(std::span<const float> probs, std::span<const float> labels);

// AUC over a histogram of predicted probability: bucket b holds the counts of
// positives and negatives with min(floor(p * n), n - 1) == b. Samples in one
// bucket count as ties, so the error against ExactAuc is at most the share of
// positive-negative pairs that fall in a common bucket (~1e-4 with 2^16
// buckets on spread-out predictions).
class BucketedAuc {
 public:
  static constexpr int kDefaultBuckets = 1 << 16;

  // REQUIRES: num_buckets >= 1.
  explicit BucketedAuc(int num_buckets = kDefaultBuckets);

  // REQUIRES: probs.size() == labels.size().
  void Add(std::span<const float> probs, std::span<const float> labels);
  // REQUIRES: other has the same number of buckets.
  void Merge(const BucketedAuc& other);
  void Reset();

  // NaN when there is no positive or no negative.
  double Auc() const;

  int num_buckets() const { return static_cast<int>(positives_.size()); }
  // Per-bucket counts: all-reduce both in place (sum), then Auc() is global.
  std::vector<double>& positives() { return positives_; }
  std::vector<double>& negatives() { return negatives_; }
  const std::vector<double>& positives() const { return positives_; }
  const std::vector<double>& negatives() const { return negatives_; }

 private:
  std::vector<double> positives_;
  std::vector<double> negatives_;
};

// AUC from per-bucket counts merged by any means (bucket 0 = lowest
// predictions). NaN when there is no positive or no negative.
// REQUIRES: positives.size() == negatives.size().
double AucFromBuckets(std::span<const double> positives, std::span<const double> negatives);

}  // namespace fleet::data
