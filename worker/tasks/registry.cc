// The models ps_worker can train (worker/task.h). Adding one: define its
// WorkerTaskType in worker/tasks/<name>_task.cc, declare it here and add it
// to the list. Referencing each type from this list is also what keeps the
// linker from dropping the task files out of the static library.
#include "worker/task.h"

namespace fleet::worker {

extern const WorkerTaskType kCtrTaskType;     // worker/tasks/ctr_task.cc: every CTR model
extern const WorkerTaskType kMlpTaskType;     // worker/tasks/mlp_task.cc

namespace {
constexpr const WorkerTaskType* kTypes[] = {&kCtrTaskType, &kMlpTaskType};
}  // namespace

std::span<const WorkerTaskType* const> WorkerTaskTypes() { return kTypes; }

}  // namespace fleet::worker
