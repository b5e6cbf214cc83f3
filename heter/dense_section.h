// DenseSection: the dense part of a job's model as a heter worker runs it:
// the CTR model and its loss (trainer/models/ctr_model.h) on one device,
// over the inputs of one micro-batch at a time, host buffers in and out.
// The same class and kernels' math as the CPU worker's own step, so a heter
// worker on the CPU computes exactly what the CPU worker would.
//
// Thread safety: one thread drives a section.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "comm/status.h"
#include "comm/thread_pool.h"
#include "worker/heter_protocol.h"
#include "ps/job_config.h"
#include "trainer/backend.h"
#include "trainer/models/ctr_model.h"

namespace fleet::heter {

class DenseSection {
 public:
  // The tower of the job's `model` section on `device` (its element-wise
  // kernels on `pool` on the CPU; not owned, may be null). InvalidArgument
  // naming the key when the config has no dense section to run: no (valid)
  // `model` section, a model without a dense part for heter workers (the
  // CTR models have one), model.sparse_table naming no sparse table,
  // model.dense_table naming no dense table or one whose dim is not the
  // tower's parameter count. Unavailable when the device cannot be used.
  static Result<std::unique_ptr<DenseSection>> Create(const ps::JobConfig& job,
                                                      const trainer::Device& device,
                                                      ThreadPool* pool);

  const DenseShape& shape() const { return shape_; }
  uint32_t dense_table() const { return dense_table_; }
  size_t param_count() const { return model_->arena().size(); }
  const trainer::Device& device() const { return device_; }

  // Host memory of param_count() floats to pull the dense table into;
  // LoadParams() then makes the tower use it (a copy to the device on CUDA;
  // nothing on the CPU, where it is the tower's own buffer).
  std::span<float> host_params() { return host_params_; }
  Status LoadParams();

  // Forward and backward over the request's micro-batch (REQUIRES: B >= 1
  // and the shape() the protocol checked): fills reply->loss, allocates and
  // fills reply->pooled_grad (d mean loss / d pooled) and reply->probs, and
  // writes the dense gradient times request.dense_grad_scale into
  // dense_grad (host, param_count() floats). InvalidArgument (from the
  // model, which is unchanged) for a label outside [0, 1] or a non-finite
  // dense feature.
  Status Run(const TrainRequest& request, TrainReply* reply, std::span<float> dense_grad);

 private:
  DenseSection(DenseShape shape, uint32_t dense_table, trainer::Device device,
               std::unique_ptr<trainer::Backend> backend, std::unique_ptr<trainer::CtrModel> model);

  // Fixed after construction.
  const DenseShape shape_;
  const uint32_t dense_table_;
  const trainer::Device device_;
  std::unique_ptr<trainer::Backend> backend_;  // declared before model_, which uses it
  std::unique_ptr<trainer::CtrModel> model_;
  // The CPU: a view of the arena's parameters; CUDA: a host staging copy.
  std::span<float> host_params_;
  std::vector<float> staging_;
};

}  // namespace fleet::heter
