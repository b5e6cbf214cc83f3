// The models ps_worker can train (worker/task.h). Adding one: define its
// WorkerTaskType in worker/tasks/<name>_task.cc, declare it here and add it
// to the list. Referencing each type from this list is also what keeps the
// linker from dropping the task files out of the static library.
#include "worker/task.h"

namespace fleet::worker {

extern const WorkerTaskType kCtrDnnTaskType;  // worker/tasks/ctr_dnn_task.cc
extern const WorkerTaskType kMlpTaskType;     // worker/tasks/mlp_task.cc

namespace {
constexpr const WorkerTaskType* kTypes[] = {&kCtrDnnTaskType, &kMlpTaskType};
}  // namespace

std::span<const WorkerTaskType* const> WorkerTaskTypes() { return kTypes; }

}  // namespace fleet::worker
