#include "collective/updater.h"

#include <system_error>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "trainer/checkpoint.h"

namespace fleet::trainer::collective {

Status AgreeOnSuccess(GradientUpdater& updater, const Status& local, const std::string& what) {
  float failed = local.ok() ? 0.0f : 1.0f;
  FLEET_RETURN_IF_ERROR(updater.SumOverRanks(std::span<float>(&failed, 1)));
  if (!local.ok()) return local;
  if (failed > 0) {
    return Status::FailedPrecondition(
        absl::StrCat(what, ": failed on ", static_cast<int>(failed),
                     " other rank(s) (see their logs)"));
  }
  return Status::OK();
}

Result<std::unique_ptr<ReplicatedUpdater>> ReplicatedUpdater::Create(
    Collective* collective, ParamArena* arena, std::unique_ptr<Optimizer> optimizer,
    const DataParallelOptions& options, const std::string& name) {
  CHECK(optimizer != nullptr && optimizer->arena() == arena);
  DataParallelOptions replicated = options;
  replicated.shard_gradients = false;  // the optimizer steps over every parameter
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<DataParallel> dp,
                         DataParallel::Create(collective, arena, replicated));
  return std::unique_ptr<ReplicatedUpdater>(
      new ReplicatedUpdater(std::move(optimizer), std::move(dp), name + ".ckpt"));
}

GradReadyFn ReplicatedUpdater::grad_ready(bool last_micro_batch) {
  return last_micro_batch ? dp_->grad_ready() : GradReadyFn();
}

Status ReplicatedUpdater::Step() {
  FLEET_RETURN_IF_ERROR(dp_->FinishGradients());
  optimizer_->Step();
  return Status::OK();
}

bool ReplicatedUpdater::HasCheckpoint(const std::filesystem::path& dir) const {
  std::error_code ec;
  return !dir.empty() && std::filesystem::exists(dir / file_, ec);
}

Status ReplicatedUpdater::Save(const std::filesystem::path& dir) {
  if (dp_->rank() != 0) return Status::OK();
  return SaveCheckpoint((dir / file_).string(), *optimizer_->arena(), *optimizer_);
}

Status ReplicatedUpdater::Resume(const std::filesystem::path& dir) {
  Status load;
  if (dp_->rank() == 0 && HasCheckpoint(dir)) {
    load = LoadCheckpoint((dir / file_).string(), optimizer_->arena(), optimizer_.get());
    if (load.ok()) {
      LOG(INFO) << "resumed from " << (dir / file_).string() << " at step " << optimizer_->step();
    }
  }
  FLEET_RETURN_IF_ERROR(
      AgreeOnSuccess(*this, load.ok() ? load : load.WithContext("loading the checkpoint"),
                     "rank 0 could not load the checkpoint"));
  return dp_->SyncFromRoot(optimizer_.get());
}

UpdaterMemory ReplicatedUpdater::memory() const {
  const size_t n = optimizer_->arena()->size() * sizeof(float);
  return UpdaterMemory{n, n * optimizer_->state().size()};
}

}  // namespace fleet::trainer::collective
