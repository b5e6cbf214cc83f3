#include "data/metrics.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace fleet::data {
namespace {

bool IsPositive(float label) { return label > 0.5f; }

// NaN becomes 0; everything else is clamped to [0, 1].
float CleanProb(float p) {
  if (!(p >= 0.0f)) return 0.0f;  // NaN and negatives
  return p > 1.0f ? 1.0f : p;
}

// Sweeps groups of tied predictions from lowest to highest: each positive in
// a group beats every negative in lower groups and half of those tied with it.
class AucSweep {
 public:
  void AddGroup(double positives, double negatives) {
    area_ += positives * (negatives_below_ + 0.5 * negatives);
    negatives_below_ += negatives;
    positives_ += positives;
  }
  double Auc() const {
    if (positives_ == 0 || negatives_below_ == 0) return std::numeric_limits<double>::quiet_NaN();
    return area_ / (positives_ * negatives_below_);
  }

 private:
  double area_ = 0;
  double negatives_below_ = 0;
  double positives_ = 0;
};

}  // namespace

int64_t CountCorrectBinary(std::span<const float> probs, std::span<const float> labels) {
  CHECK_EQ(probs.size(), labels.size());
  int64_t correct = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    correct += (CleanProb(probs[i]) >= 0.5f) == IsPositive(labels[i]);
  }
  return correct;
}

int64_t CountCorrectArgmax(std::span<const float> scores, int num_classes,
                           std::span<const int32_t> labels) {
  CHECK_GE(num_classes, 1);
  CHECK_EQ(scores.size(), labels.size() * static_cast<size_t>(num_classes));
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const float* row = scores.data() + i * num_classes;
    const int best = static_cast<int>(std::max_element(row, row + num_classes) - row);
    correct += best == labels[i];
  }
  return correct;
}

double LogLossSum(std::span<const float> probs, std::span<const float> labels) {
  CHECK_EQ(probs.size(), labels.size());
  constexpr double kEps = 1e-7;
  double sum = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp(static_cast<double>(CleanProb(probs[i])), kEps, 1.0 - kEps);
    sum -= IsPositive(labels[i]) ? std::log(p) : std::log(1.0 - p);
  }
  return sum;
}

double ExactAuc(std::span<const float> probs, std::span<const float> labels) {
  CHECK_EQ(probs.size(), labels.size());
  const size_t n = probs.size();
  std::vector<std::pair<float, bool>> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = {CleanProb(probs[i]), IsPositive(labels[i])};
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  AucSweep sweep;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double pos = 0;
    double neg = 0;
    for (; j < n && v[j].first == v[i].first; ++j) (v[j].second ? pos : neg) += 1;
    sweep.AddGroup(pos, neg);
    i = j;
  }
  return sweep.Auc();
}

BucketedAuc::BucketedAuc(int num_buckets) : positives_(num_buckets), negatives_(num_buckets) {
  CHECK_GE(num_buckets, 1);
}

void BucketedAuc::Add(std::span<const float> probs, std::span<const float> labels) {
  CHECK_EQ(probs.size(), labels.size());
  const int n = num_buckets();
  for (size_t i = 0; i < probs.size(); ++i) {
    const int b = std::min(static_cast<int>(CleanProb(probs[i]) * n), n - 1);
    (IsPositive(labels[i]) ? positives_ : negatives_)[b] += 1;
  }
}

void BucketedAuc::Merge(const BucketedAuc& other) {
  CHECK_EQ(num_buckets(), other.num_buckets());
  for (size_t b = 0; b < positives_.size(); ++b) {
    positives_[b] += other.positives_[b];
    negatives_[b] += other.negatives_[b];
  }
}

void BucketedAuc::Reset() {
  std::fill(positives_.begin(), positives_.end(), 0.0);
  std::fill(negatives_.begin(), negatives_.end(), 0.0);
}

double BucketedAuc::Auc() const { return AucFromBuckets(positives_, negatives_); }

double AucFromBuckets(std::span<const double> positives, std::span<const double> negatives) {
  CHECK_EQ(positives.size(), negatives.size());
  AucSweep sweep;
  for (size_t b = 0; b < positives.size(); ++b) sweep.AddGroup(positives[b], negatives[b]);
  return sweep.Auc();
}

}  // namespace fleet::data
