// LocalCommunicator: a Communicator that keeps the parameters in local memory, for measuring
// and testing a worker task's own step without servers: rows are created on
// first use (filled with 0.001), and Push applies plain SGD, so a step moves
// as much memory as a real one. Used by bench/train_bench ("compute only")
// and the worker's allocation test. Not thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "worker/communicator.h"

namespace fleet::worker {

class LocalCommunicator final : public Communicator {
 public:
  // dim: floats per sparse row (pull and push); dense: the dense table's size.
  LocalCommunicator(size_t dim, size_t dense) : dim_(dim), dense_(dense, 0.01f) {}
  Status Pull(const PullRequest& r) override {
    for (size_t i = 0; i < r.sparse_keys.size(); ++i) {
      auto& row = rows_[r.sparse_keys[i]];
      row.resize(dim_, 0.001f);
      std::copy(row.begin(), row.end(), r.sparse_values.begin() + i * dim_);
    }
    if (!r.dense_values.empty()) std::copy(dense_.begin(), dense_.end(), r.dense_values.begin());
    return Status::OK();
  }
  Status Push(const PushRequest& r) override {
    for (size_t i = 0; i < r.sparse_keys.size(); ++i) {
      auto& row = rows_[r.sparse_keys[i]];
      for (size_t j = 0; j < dim_; ++j) row[j] -= 0.01f * r.sparse_grads[i * dim_ + j];
    }
    for (size_t j = 0; j < r.dense_grads.size(); ++j) dense_[j] -= 0.001f * r.dense_grads[j];
    return Status::OK();
  }
  Status Flush() override { return Status::OK(); }
  double GradientScale(size_t) const override { return 1.0; }
  const char* name() const override { return "local"; }

 private:
  const size_t dim_;
  std::vector<float> dense_;
  std::unordered_map<uint64_t, std::vector<float>> rows_;
};

}  // namespace fleet::worker
