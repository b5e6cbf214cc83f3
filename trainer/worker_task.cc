#include "trainer/worker_task.h"

namespace fleet::trainer {

Result<std::unique_ptr<WorkerTask>> CreateWorkerTask(const WorkerConfig& config,
                                                     const ps::JobConfig& job,
                                                     const WorkerTaskOptions& options) {
  switch (config.model.kind) {
    case ModelKind::kCtrDnn:
      return CreateCtrDnnTask(config, job, options);
    case ModelKind::kMlp:
      return CreateMlpTask(config, options);
  }
  return Status::InvalidArgument("unknown model.kind");
}

}  // namespace fleet::trainer
