#include <future>

#include "trainer/communicator.h"

namespace fleet::trainer {

SyncCommunicator::SyncCommunicator(ps::PsClient* client, CommunicatorOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.dense_table) {
    dense_dim_ = client_->job().table(*options_.dense_table)->dim;
    zero_dense_.assign(dense_dim_, 0.0f);
  }
}

Status SyncCommunicator::Pull(const PullRequest& request) {
  const ps::PullOptions po{options_.timeout};
  // Both reads in flight at once; wait for both before returning so the
  // caller's buffers are never written after we return.
  std::future<Status> sparse, dense;
  if (options_.sparse_table && !request.sparse_keys.empty()) {
    sparse = client_->PullSparseAsync(*options_.sparse_table, request.sparse_keys,
                                      request.sparse_values, po);
  }
  if (options_.dense_table && !request.dense_values.empty()) {
    dense = client_->PullDenseAsync(*options_.dense_table, request.dense_values, po);
  }
  Status s = sparse.valid() ? sparse.get() : Status::OK();
  Status d = dense.valid() ? dense.get() : Status::OK();
  FLEET_RETURN_IF_ERROR(s);
  return d;
}

Status SyncCommunicator::Push(const PushRequest& request) {
  ps::PushOptions po;
  po.timeout = options_.timeout;
  po.step = step_;
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
    // Zero-copy view of the caller's buffer: we wait for the servers'
    // replies below, so the buffer outlives the transport's use of it.
    SArray<float> view(const_cast<float*>(g.data()), g.size(),
                       std::shared_ptr<void>(nullptr, [](void*) {}));
    dense = client_->ZPushDenseGrad(*options_.dense_table, std::move(view), po);
  }
  Status s = sparse.valid() ? sparse.get() : Status::OK();
  Status d = dense.valid() ? dense.get() : Status::OK();
  ++step_;
  FLEET_RETURN_IF_ERROR(s.ok() ? s : s.WithContext("sync push step " + std::to_string(po.step)));
  return d.ok() ? d : d.WithContext("sync push step " + std::to_string(po.step));
}

double SyncCommunicator::GradientScale(size_t batch_samples) const {
  return static_cast<double>(batch_samples) /
         (static_cast<double>(options_.batch_size) * options_.num_workers);
}

}  // namespace fleet::trainer
