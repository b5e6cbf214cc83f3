// The workload ps_bench puts on a parameter server, shared by its FleetPS
// and bare-ZeroMQ drivers and by the ps-lite driver (bench/pslite_driver.cc,
// built against ps-lite itself), so both systems get the same keys in the
// same order, the same gradients, the same window of requests in flight and
// the same optimizer arithmetic. Standard C++ only: the ps-lite driver
// includes it next to ps-lite's headers.
//
// Thread safety: none of these objects is shared between threads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace fleet::bench {

// The key of row index i: spread over the whole uint64 range, so ps-lite's
// range partitioning splits them evenly over servers like FleetPS's hash.
inline uint64_t KeyOf(uint64_t index) { return index * 0x9E3779B97F4A7C15ull + 0x5bd1e995ull; }

// The keys of a worker's consecutive requests: it walks the row indices
// [0, universe) from `start` with a stride coprime to the universe, so one
// request's keys are distinct, they scatter over shards and rows, and over
// time every row is touched.
class KeyStream {
 public:
  KeyStream(uint64_t universe, uint64_t start) : universe_(universe), pos_(start % universe) {
    stride_ = 2654435761ull % universe_;
    if (stride_ == 0) stride_ = 1;
    while (std::gcd(stride_, universe_) != 1) ++stride_;
  }
  void Fill(uint64_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      out[i] = KeyOf(pos_);
      pos_ += stride_;
      if (pos_ >= universe_) pos_ -= universe_;
    }
  }

 private:
  uint64_t universe_;
  uint64_t stride_;
  uint64_t pos_;
};

// The key sets of a worker's requests, made before anything is timed and
// each sorted (ps-lite's KVWorker requires sorted keys), then handed out in
// turn. The stream repeats after universe / gcd(universe, keys) requests;
// at most `max_bytes` of sets are kept, and a longer cycle is cut short (the
// sets still cover max_bytes / 8 draws of the universe).
class KeySets {
 public:
  KeySets(uint64_t universe, uint64_t start, size_t keys, size_t max_bytes = size_t{64} << 20) {
    const uint64_t period = universe / std::gcd(universe, static_cast<uint64_t>(keys));
    const uint64_t fit = std::max<uint64_t>(1, max_bytes / (keys * sizeof(uint64_t)));
    sets_.resize(std::min(period, fit));
    KeyStream stream(universe, start);
    for (auto& set : sets_) {
      set.resize(keys);
      stream.Fill(set.data(), keys);
      std::sort(set.begin(), set.end());
    }
  }
  // The next request's keys; valid as long as this object.
  std::span<const uint64_t> Next() {
    const std::vector<uint64_t>& set = sets_[next_];
    next_ = next_ + 1 == sets_.size() ? 0 : next_ + 1;
    return set;
  }

 private:
  std::vector<std::vector<uint64_t>> sets_;
  size_t next_ = 0;
};

// The gradient every timed push sends (small, so values stay finite).
inline std::vector<float> TimedGradients(size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = 1e-4f * static_cast<float>(1 + i % 7);
  return g;
}

// The two gradient steps the verification pushes (element i of step 0, 1).
inline float VerifyGradient(size_t i, int step) {
  return 0.05f * static_cast<float>(static_cast<int>((i * 7 + step * 3) % 11) - 5);
}

// An optimizer rule of the workload, applied as FleetPS's SgdRule and
// AdagradRule do (ps/table/optimizer.cc): the ps-lite driver's server runs
// it, and verification computes what a table must hold from it.
struct TableRule {
  enum Kind { kSgd, kAdagrad } kind = kSgd;
  float learning_rate = 0.01f;
  float initial_g2sum = 0.0f;  // adagrad
  float epsilon = 1e-8f;       // adagrad

  // Floats a row holds: the value, then adagrad's squared-gradient sums.
  size_t row_floats(size_t dim) const { return kind == kAdagrad ? 2 * dim : dim; }
  // A new row: zero value, initial_g2sum state.
  void InitRow(float* row, size_t dim) const {
    std::fill(row, row + dim, 0.0f);
    if (kind == kAdagrad) std::fill(row + dim, row + 2 * dim, initial_g2sum);
  }
  // row (row_floats(dim) floats) -= the rule's step for gradient g.
  void Apply(float* row, const float* g, size_t dim) const {
    const float lr = learning_rate;
    if (kind == kSgd) {
      for (size_t j = 0; j < dim; ++j) row[j] -= lr * g[j];
      return;
    }
    float* g2 = row + dim;
    for (size_t j = 0; j < dim; ++j) {
      g2[j] += g[j] * g[j];
      row[j] -= lr * g[j] / (std::sqrt(g2[j]) + epsilon);
    }
  }
};

// Keeps `window` requests in flight: Issue(slot) starts one, Wait(slot)
// completes the oldest (slots are reused in issue order).
class Driver {
 public:
  virtual ~Driver() = default;
  virtual void Issue(int slot) = 0;
  virtual void Wait(int slot) = 0;
};

// Runs `ops` requests with `window` in flight; appends each one's issue to
// completion time (us) to *lat when given.
inline void RunWindow(Driver& d, int window, int64_t ops, std::vector<double>* lat) {
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> start(window);
  int64_t issued = 0, done = 0;
  for (; issued < std::min<int64_t>(window, ops); ++issued) {
    start[issued] = Clock::now();
    d.Issue(static_cast<int>(issued));
  }
  while (done < ops) {
    const int slot = static_cast<int>(done % window);
    d.Wait(slot);
    if (lat)
      lat->push_back(std::chrono::duration<double, std::micro>(Clock::now() - start[slot]).count());
    ++done;
    if (issued < ops) {
      start[slot] = Clock::now();
      d.Issue(slot);
      ++issued;
    }
  }
}

}  // namespace fleet::bench
