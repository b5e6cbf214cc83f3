#include "worker/task.h"

namespace fleet::worker {

const WorkerTaskType* FindWorkerTaskType(std::string_view kind) {
  for (const WorkerTaskType* type : WorkerTaskTypes()) {
    if (kind == type->kind) return type;
  }
  return nullptr;
}

std::string WorkerTaskKinds() {
  std::string kinds;
  for (const WorkerTaskType* type : WorkerTaskTypes()) {
    if (!kinds.empty()) kinds += ", ";
    kinds += type->kind;
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
