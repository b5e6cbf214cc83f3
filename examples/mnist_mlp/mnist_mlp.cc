#include "examples/mnist_mlp/mnist_mlp.h"

#include <memory>

#include "trainer/collective/mlp_classifier.h"

namespace fleet::examples {

Result<MnistReport> TrainMnist(const MnistOptions& options, const data::MnistData& data,
                               Collective* collective, trainer::Backend* backend,
                               std::ostream* progress) {
  if (backend == nullptr) return Status::InvalidArgument("TrainMnist: no backend");
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::collective::MlpClassifierTask> task,
                         trainer::collective::MlpClassifierTask::Create(options.model, data.train,
                                                                        data.test, backend));
  return trainer::collective::RunTrainLoop(options, *task, collective, progress);
}

}  // namespace fleet::examples
