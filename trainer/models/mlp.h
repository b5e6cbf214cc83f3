// Mlp: the MNIST classifier: Linear layers of `sizes` with tanh between them
// and softmax cross-entropy on the last (default 784-128-128-10). Runs on any
// Backend (CPU, or CUDA via cuBLAS and the .cu kernels).
//
// A training step:
//   model->arena().ZeroGrad();
//   FLEET_ASSIGN_OR_RETURN(float loss, model->Forward(x, labels));
//   model->Backward();
//   optimizer->Step();
//
// Thread safety: one thread drives a model at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/layers/layers.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

struct MlpConfig {
  // Layer widths, input first and classes last (Model.sizes). At least two
  // entries, all > 0. Bigger hidden layers learn more and cost more per step.
  std::vector<int> sizes = {784, 128, 128, 10};
  // Seed of the parameter initialisation (Model.seed); same seed, same model.
  uint64_t seed = 1;
};

// "fc1.weight" [sizes[1], sizes[0]], "fc1.bias" [sizes[1]], ..., "fcL.bias".
ParamTable MlpParamTable(const MlpConfig& config);

class Mlp {
 public:
  // InvalidArgument for a bad config. `backend` is not owned and must
  // outlive the model. Parameters are initialised from config.seed.
  static Result<std::unique_ptr<Mlp>> Create(const MlpConfig& config, Backend* backend);

  const MlpConfig& config() const { return config_; }
  const ParamTable& param_table() const { return arena_.table(); }
  ParamArena& arena() { return arena_; }
  const ParamArena& arena() const { return arena_; }
  int num_classes() const { return config_.sizes.back(); }

  // x: host [B, sizes[0]]; labels: host [B] in [0, num_classes()).
  // Returns the mean cross-entropy. InvalidArgument (model unchanged) for
  // B == 0, a size mismatch or a label out of range. On a CPU backend the
  // model keeps views of x and labels (no copy): they must stay alive and
  // unchanged until Backward has run. Other backends copy them.
  Result<float> Forward(std::span<const float> x, std::span<const int32_t> labels);
  // Adds d(grad_scale * loss)/d(params) into arena().grads() (grad_scale
  // 1/k for one of k accumulated micro-batches). REQUIRES: a successful
  // Forward since the last Backward.
  void Backward(const GradReadyFn& on_grads_ready = {}, float grad_scale = 1.0f);

  int batch_size() const { return batch_; }
  // Class probabilities of the last Forward, host [B, num_classes()].
  std::vector<float> Probabilities() const;

 private:
  Mlp(const MlpConfig& config, Backend* backend, ParamArena arena);
  void EnsureBatch(int B);

  // Fixed after construction.
  const MlpConfig config_;
  Backend* const backend_;
  ParamArena arena_;
  std::vector<Linear> linears_;  // tanh fused into every one but the last
  SoftmaxCrossEntropy loss_;

  // Per-batch buffers, reallocated when B changes.
  int batch_ = 0;
  bool forward_done_ = false;
  Tensor x_;                      // [B, sizes[0]]: the caller's batch (CPU) or x_buffer_
  Tensor x_buffer_;               // device copy of x (non-CPU backends)
  std::shared_ptr<void> labels_;  // int32 [B] on the device (non-CPU backends)
  std::vector<Tensor> y_, dy_;    // y_[l]: [B, sizes[l+1]] output of linear l (tanh'd, l < L-1)
  Tensor probs_;                  // [B, classes]
};

}  // namespace fleet::trainer
