#include <glog/logging.h>

#include <algorithm>
#include <future>
#include <string>
#include <unordered_map>

#include "worker/communicator.h"

namespace fleet::worker {

AsyncCommunicator::AsyncCommunicator(ps::PsClient* client, CommunicatorOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.sparse_table) push_dim_ = client_->PushDim(*options_.sparse_table);
  if (options_.dense_table) dense_dim_ = client_->job().table(*options_.dense_table)->dim;
  sender_ = std::thread([this] { SenderLoop(); });
}

AsyncCommunicator::~AsyncCommunicator() {
  if (Status s = Flush(); !s.ok()) {
    LOG(WARNING) << "async communicator: gradients lost at shutdown: " << s.ToString();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  sender_.join();
}

int64_t AsyncCommunicator::sends() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sends_;
}

Status AsyncCommunicator::Pull(const PullRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    FLEET_RETURN_IF_ERROR(error_);  // surface a failed send at the next step
  }
  return PullFromServers(*client_, options_, request);
}

Status AsyncCommunicator::Push(const PushRequest& request) {
  if (request.sparse_keys.size() * push_dim_ != request.sparse_grads.size()) {
    return Status::InvalidArgument("async push: sparse grads must be keys * push dim",
                                   std::to_string(request.sparse_grads.size()));
  }
  if (!request.dense_grads.empty() && request.dense_grads.size() != dense_dim_) {
    return Status::InvalidArgument("async push: dense grads must have the table's dim",
                                   std::to_string(request.dense_grads.size()));
  }
  FLEET_RETURN_IF_ERROR(CheckCounts(request, "async push"));
  Batch b;
  b.keys.assign(request.sparse_keys.begin(), request.sparse_keys.end());
  b.sparse.assign(request.sparse_grads.begin(), request.sparse_grads.end());
  b.shows.assign(request.sparse_shows.begin(), request.sparse_shows.end());
  b.clicks.assign(request.sparse_clicks.begin(), request.sparse_clicks.end());
  b.dense.assign(request.dense_grads.begin(), request.dense_grads.end());

  std::unique_lock<std::mutex> lock(mu_);
  // Back pressure: a worker that computes faster than the servers absorb
  // waits here rather than growing the queue without bound.
  const bool room = cv_.wait_for(lock, options_.timeout, [&] {
    return !error_.ok() || static_cast<int>(queue_.size()) < options_.queue_capacity;
  });
  FLEET_RETURN_IF_ERROR(error_);
  if (!room) {
    return Status::Timeout("async push: gradient queue stayed full (" +
                               std::to_string(options_.queue_capacity) + " batches) for " +
                               std::to_string(options_.timeout.count()) + " ms",
                           "sender thread");
  }
  queue_.push_back(std::move(b));
  lock.unlock();
  cv_.notify_all();
  return Status::OK();
}

Status AsyncCommunicator::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  // Each send is bounded by the timeout itself, so the deadline is on
  // progress: twice the timeout between two sends finishing (the send in
  // flight may have started just before this call).
  while (true) {
    const int64_t sends_before = sends_;
    const bool progressed = cv_.wait_for(lock, 2 * options_.timeout, [&] {
      return !error_.ok() || (queue_.empty() && in_flight_ == 0) || sends_ != sends_before;
    });
    FLEET_RETURN_IF_ERROR(error_);
    if (queue_.empty() && in_flight_ == 0) return Status::OK();
    if (!progressed) {
      return Status::Timeout("async flush: " + std::to_string(queue_.size() + in_flight_) +
                                 " batches still unsent, no send finished for " +
                                 std::to_string(2 * options_.timeout.count()) + " ms",
                             "sender thread");
    }
  }
}

void AsyncCommunicator::SenderLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // The wait is bounded only so a lost wake-up can never park the thread
    // for good; stop_ and the queue are re-checked each time.
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    // Take what is there, up to max_merge: never wait for a full merge, so a
    // slow worker's gradients are not held back.
    std::vector<Batch> batches;
    while (!queue_.empty() && static_cast<int>(batches.size()) < options_.max_merge) {
      batches.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    in_flight_ = static_cast<int>(batches.size());
    lock.unlock();
    cv_.notify_all();  // room in the queue
    Status s = error_.ok() ? Send(batches) : Status::OK();
    lock.lock();
    in_flight_ = 0;
    ++sends_;
    if (!s.ok() && error_.ok()) {
      error_ = s.WithContext("async communicator send");
      // Nothing queued after a failure can be applied in order; drop it so
      // Flush and Push report the error instead of waiting.
      queue_.clear();
    }
    cv_.notify_all();
  }
}

Status AsyncCommunicator::Send(std::vector<Batch>& batches) {
  // Per-key sums, keys in order of first appearance; shows and clicks too
  // when any batch has them (a batch without counts adds show 1, click 0
  // per key, what the servers assume for it).
  const bool counts =
      std::any_of(batches.begin(), batches.end(), [](const Batch& b) { return !b.shows.empty(); });
  std::vector<uint64_t> keys;
  std::vector<float> sparse, shows, clicks;
  std::unordered_map<uint64_t, size_t> index;
  std::vector<float> dense;
  for (Batch& b : batches) {
    for (size_t i = 0; i < b.keys.size(); ++i) {
      auto [it, fresh] = index.try_emplace(b.keys[i], keys.size());
      if (fresh) {
        keys.push_back(b.keys[i]);
        sparse.resize(sparse.size() + push_dim_, 0.0f);
        if (counts) shows.push_back(0.0f), clicks.push_back(0.0f);
      }
      float* dst = sparse.data() + it->second * push_dim_;
      const float* src = b.sparse.data() + i * push_dim_;
      for (size_t j = 0; j < push_dim_; ++j) dst[j] += src[j];
      if (counts) {
        shows[it->second] += b.shows.empty() ? 1.0f : b.shows[i];
        clicks[it->second] += b.clicks.empty() ? 0.0f : b.clicks[i];
      }
    }
    if (!b.dense.empty()) {
      if (dense.empty()) {
        dense = std::move(b.dense);
      } else {
        for (size_t j = 0; j < dense.size(); ++j) dense[j] += b.dense[j];
      }
    }
  }
  ps::PushOptions po;
  po.timeout = options_.timeout;
  po.shows = shows;
  po.clicks = clicks;
  std::future<Status> sp, dn;
  if (options_.sparse_table && !keys.empty()) {
    sp = client_->PushSparseGradAsync(*options_.sparse_table, keys, sparse, po);
  }
  if (options_.dense_table && !dense.empty()) {
    dn = client_->ZPushDenseGrad(*options_.dense_table, SArray<float>(std::move(dense)), po);
  }
  return WaitBoth(*client_, std::move(sp), std::move(dn), options_.timeout);
}

}  // namespace fleet::worker
