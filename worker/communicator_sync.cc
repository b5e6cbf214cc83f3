#include <future>

#include "worker/communicator.h"

namespace fleet::worker {

SyncCommunicator::SyncCommunicator(ps::PsClient* client, CommunicatorOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.dense_table) {
    dense_dim_ = client_->job().table(*options_.dense_table)->dim;
    zero_dense_.assign(dense_dim_, 0.0f);
  }
}

Status SyncCommunicator::Pull(const PullRequest& request) {
  return PullFromServers(*client_, options_, request);
}

PendingPush SyncCommunicator::StartPush(const PushRequest& request) {
  ps::PushOptions po;
  po.timeout = options_.timeout;
  po.shows = request.sparse_shows;
  po.clicks = request.sparse_clicks;
  if (request.sync_slot) {
    po.step = request.sync_slot->step;
    po.contributor = request.sync_slot->contributor;
    po.contributors = request.sync_slot->contributors;
    po.idempotent = true;
  } else {
    po.idempotent = step_ == resumed_at_;
    po.step = step_++;
  }
  std::future<Status> sparse, dense;
  // Empty pushes are sent too: a sync server applies a step only once every
  // worker's push for it arrived.
  if (options_.sparse_table) {
    sparse = client_->PushSparseGradAsync(*options_.sparse_table, request.sparse_keys,
                                          request.sparse_grads, po);
  }
  if (options_.dense_table) {
    std::span<const float> g = request.dense_grads.empty()
                                   ? std::span<const float>(zero_dense_)
                                   : request.dense_grads;
    // A copy the transport owns: a request that times out may still sit in
    // ZeroMQ's queue after we return, so it must not borrow the caller's buffer.
    dense = client_->ZPushDenseGrad(*options_.dense_table, SArray<float>(g.data(), g.size()), po);
  }
  std::string context = "sync push step " + std::to_string(po.step);
  if (request.sync_slot) {
    context += " slot " + std::to_string(po.contributor) + "/" + std::to_string(po.contributors);
  }
  return PendingPush(client_, std::move(sparse), std::move(dense), options_.timeout,
                     std::move(context));
}

Status SyncCommunicator::ResumeAt(int64_t step) {
  if (step < 0) return Status::InvalidArgument("a sync step is >= 0", std::to_string(step));
  step_ = resumed_at_ = step;
  return Status::OK();
}

double SyncCommunicator::GradientScale(size_t batch_samples) const {
  return static_cast<double>(batch_samples) /
         (static_cast<double>(options_.batch_size) * options_.num_workers);
}

}  // namespace fleet::worker
