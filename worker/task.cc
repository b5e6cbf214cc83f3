#include "worker/task.h"

namespace fleet::worker {

namespace {

// Every model.kind a type trains: its own, then its more_kinds.
std::vector<std::string> KindsOf(const WorkerTaskType& type) {
  std::vector<std::string> kinds = {type.kind};
  if (type.more_kinds != nullptr) {
    for (std::string& k : type.more_kinds()) kinds.push_back(std::move(k));
  }
  return kinds;
}

}  // namespace

const WorkerTaskType* FindWorkerTaskType(std::string_view kind) {
  for (const WorkerTaskType* type : WorkerTaskTypes()) {
    for (const std::string& k : KindsOf(*type)) {
      if (kind == k) return type;
    }
  }
  return nullptr;
}

std::string WorkerTaskKinds() {
  std::string kinds;
  for (const WorkerTaskType* type : WorkerTaskTypes()) {
    for (const std::string& k : KindsOf(*type)) {
      if (!kinds.empty()) kinds += ", ";
      kinds += k;
    }
  }
  return kinds;
}

Result<std::unique_ptr<WorkerTask>> CreateWorkerTask(const WorkerConfig& config,
                                                     const ps::JobConfig& job,
                                                     const WorkerTaskOptions& options) {
  const WorkerTaskType* type = FindWorkerTaskType(config.model.kind);
  if (type == nullptr) {
    return Status::InvalidArgument(
        "must be one of " + WorkerTaskKinds() + ", got '" + config.model.kind + "'", "model.kind");
  }
  return type->create(config, job, options);
}

}  // namespace fleet::worker
