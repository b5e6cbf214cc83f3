// The factory and the checks shared by the three policies; each policy lives
// in its own file (communicator_sync.cc, communicator_async.cc,
// communicator_geo.cc).
#include "worker/communicator.h"

#include <string>
#include <utility>

namespace fleet::worker {

Status ValidateCommunicatorOptions(const ps::PsClient& client, CommunicatorOptions* options) {
  const ps::JobConfig& job = client.job();
  auto check_table = [&](const std::optional<uint32_t>& id, ps::TableKind kind,
                         const char* what) -> Status {
    if (!id) return Status::OK();
    const ps::TableConfig* t = job.table(*id);
    if (t == nullptr) {
      return Status::InvalidArgument(std::string("communicator: no ") + what + " table with id",
                                     std::to_string(*id));
    }
    if (t->kind != kind) {
      return Status::InvalidArgument(std::string("communicator: table is not ") + what,
                                     std::to_string(*id));
    }
    return Status::OK();
  };
  FLEET_RETURN_IF_ERROR(check_table(options->sparse_table, ps::TableKind::kSparse, "sparse"));
  FLEET_RETURN_IF_ERROR(check_table(options->dense_table, ps::TableKind::kDense, "dense"));
  // Every policy hands the worker rows it can add gradients of the same
  // width to (geo even applies them locally): a table whose pushes differ
  // in width from its pulls (the ctr accessor) does not fit this interface.
  if (options->sparse_table &&
      client.PullDim(*options->sparse_table) != client.PushDim(*options->sparse_table)) {
    return Status::InvalidArgument(
        "communicator: sparse table must pull and push the same width (accessor: plain)",
        std::to_string(*options->sparse_table));
  }
  if (options->num_workers < 1) {
    return Status::InvalidArgument("communicator: num_workers must be >= 1",
                                   std::to_string(options->num_workers));
  }
  if (options->batch_size < 1) {
    return Status::InvalidArgument("communicator: batch_size must be >= 1",
                                   std::to_string(options->batch_size));
  }
  if (options->max_merge < 1) {
    return Status::InvalidArgument("communicator: max_merge must be >= 1",
                                   std::to_string(options->max_merge));
  }
  if (options->k_steps < 1) {
    return Status::InvalidArgument("communicator: k_steps must be >= 1",
                                   std::to_string(options->k_steps));
  }
  if (options->queue_capacity < 0) {
    return Status::InvalidArgument("communicator: queue_capacity must be >= 0",
                                   std::to_string(options->queue_capacity));
  }
  if (options->queue_capacity == 0) options->queue_capacity = 2 * options->max_merge;
  if (options->timeout.count() <= 0) options->timeout = job.distributed.timeout;
  return Status::OK();
}

Result<std::unique_ptr<Communicator>> CreateCommunicator(ps::PsClient* client,
                                                         CommunicatorOptions options) {
  FLEET_RETURN_IF_ERROR(ValidateCommunicatorOptions(*client, &options));
  switch (client->job().distributed.mode) {
    case ps::SyncMode::kSync:
      return std::unique_ptr<Communicator>(std::make_unique<SyncCommunicator>(client, options));
    case ps::SyncMode::kAsync:
      return std::unique_ptr<Communicator>(std::make_unique<AsyncCommunicator>(client, options));
    case ps::SyncMode::kGeo:
      return std::unique_ptr<Communicator>(std::make_unique<GeoCommunicator>(client, options));
  }
  return Status::InvalidArgument("communicator: unknown Distributed.mode");
}

Status PullFromServers(ps::PsClient& client, const CommunicatorOptions& options,
                       const PullRequest& request) {
  const ps::PullOptions po{options.timeout};
  std::future<Status> sparse, dense;
  if (options.sparse_table && !request.sparse_keys.empty()) {
    sparse = client.PullSparseAsync(*options.sparse_table, request.sparse_keys,
                                    request.sparse_values, po);
  }
  if (options.dense_table && !request.dense_values.empty()) {
    dense = client.PullDenseAsync(*options.dense_table, request.dense_values, po);
  }
  return WaitBoth(client, std::move(sparse), std::move(dense), options.timeout);
}

Status CheckCounts(const PushRequest& request, const char* what) {
  const size_t n = request.sparse_keys.size();
  const bool none = request.sparse_shows.empty() && request.sparse_clicks.empty();
  if (none || (request.sparse_shows.size() == n && request.sparse_clicks.size() == n)) {
    return Status::OK();
  }
  return Status::InvalidArgument(std::string(what) + ": " + std::to_string(n) +
                                     " keys need as many shows and clicks, got " +
                                     std::to_string(request.sparse_shows.size()) + " and " +
                                     std::to_string(request.sparse_clicks.size()),
                                 "sparse_shows / sparse_clicks");
}

PendingPush::PendingPush(const ps::PsClient* client, std::future<Status> sparse,
                         std::future<Status> dense, std::chrono::milliseconds timeout,
                         std::string context)
    : client_(client),
      sparse_(std::move(sparse)),
      dense_(std::move(dense)),
      timeout_(timeout),
      context_(std::move(context)) {}

Status PendingPush::Wait() {
  if (client_ == nullptr) return done_;
  const ps::PsClient* client = std::exchange(client_, nullptr);
  done_ = WaitBoth(*client, std::move(sparse_), std::move(dense_), timeout_);
  if (!done_.ok() && !context_.empty()) done_ = done_.WithContext(context_);
  return done_;
}

Status WaitBoth(const ps::PsClient& client, std::future<Status> sparse, std::future<Status> dense,
                std::chrono::milliseconds timeout) {
  Status s = sparse.valid() ? client.Wait(std::move(sparse), timeout) : Status::OK();
  Status d = dense.valid() ? client.Wait(std::move(dense), timeout) : Status::OK();
  FLEET_RETURN_IF_ERROR(s);
  return d;
}

}  // namespace fleet::worker
