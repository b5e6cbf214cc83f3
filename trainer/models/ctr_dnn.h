// CtrDnn: the dense part of the classic Criteo CTR-DNN. Input: the pooled
// embedding of each of `num_slots` sparse slots (dim `embedding_dim`, pooled
// by the worker with EmbeddingBag from rows pulled from the PS) and
// `num_dense` dense features, concatenated; then FC layers of `hidden` with
// ReLU; then one logit with sigmoid binary cross-entropy. Runs on any
// Backend: the CPU worker's own step on the CPU, a heter worker's dense
// section on CPU or CUDA (the same kernels' math on both).
//
// A training step on a PS worker:
//   model->arena().ZeroGrad();
//   pool each slot's rows into pooled[s]            (EmbeddingBag::Forward)
//   FLEET_ASSIGN_OR_RETURN(float loss, model->Forward(pooled, dense, labels));
//   model->Backward();                               (dense grads + pooled grads)
//   unpool model->pooled_grad() slot by slot         (EmbeddingBag::Backward)
//   push arena().grads() and the row grads
//
// Thread safety: one thread drives a model at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/layers/layers.h"
#include "trainer/models/mlp.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

struct CtrDnnConfig {
  // Sparse slots (Criteo: 26). Each contributes one pooled vector.
  int num_slots = 26;
  // Width of each slot's embedding (Model.embedding_dim). Larger captures
  // more per id and costs more PS traffic per lookup.
  int embedding_dim = 9;
  // Dense features (Criteo: 13).
  int num_dense = 13;
  // Hidden FC widths, ReLU after each (Model.hidden).
  std::vector<int> hidden = {400, 400, 400};
  // Seed of the parameter initialisation.
  uint64_t seed = 1;
};

// "fc1.weight" [hidden[0], num_slots * embedding_dim + num_dense], "fc1.bias",
// ..., and the output layer "fc{H+1}.weight" [1, hidden.back()], "fc{H+1}.bias" [1].
ParamTable CtrDnnParamTable(const CtrDnnConfig& config);

class CtrDnn {
 public:
  // InvalidArgument for a bad config. `backend` is not owned and must
  // outlive the model (a CpuBackend's pool runs the element-wise kernels).
  static Result<std::unique_ptr<CtrDnn>> Create(const CtrDnnConfig& config, Backend* backend);

  const CtrDnnConfig& config() const { return config_; }
  const ParamTable& param_table() const { return arena_.table(); }
  ParamArena& arena() { return arena_; }
  const ParamArena& arena() const { return arena_; }
  int input_width() const { return config_.num_slots * config_.embedding_dim + config_.num_dense; }

  // pooled: [num_slots, B, embedding_dim] (slot-major: slot s is one
  // EmbeddingBag output); dense: [B, num_dense]; labels: [B] in [0, 1].
  // All three are host memory. Returns the mean BCE. InvalidArgument (model
  // unchanged) for B == 0, mismatched sizes, a non-finite dense feature or a
  // label outside [0, 1]. The buffers are copied (to the backend's device);
  // they need not outlive the call.
  Result<float> Forward(std::span<const float> pooled, std::span<const float> dense,
                        std::span<const float> labels);
  // Adds d(loss)/d(params) into arena().grads() and writes d(loss)/d(pooled)
  // into pooled_grad(). REQUIRES: a successful Forward since the last Backward.
  void Backward(const GradReadyFn& on_grads_ready = {});

  int batch_size() const { return batch_; }
  // d(loss)/d(pooled) of the last Backward, [num_slots, B, embedding_dim];
  // slot s is pooled_grad(s) [B, embedding_dim], the `dout` of that slot's
  // EmbeddingBag::Backward. Valid until the next Forward.
  const Tensor& pooled_grad() const { return dpooled_; }
  Tensor pooled_grad(int slot) const;
  // Click probabilities of the last Forward, [B], in the backend's memory.
  const Tensor& probabilities() const { return probs_; }
  // Host copies of probabilities() and pooled_grad(). REQUIRES: `out` has
  // B, resp. num_slots * B * embedding_dim floats.
  void ProbabilitiesToHost(std::span<float> out) const;
  void PooledGradToHost(std::span<float> out) const;

 private:
  CtrDnn(const CtrDnnConfig& config, Backend* backend, ParamArena arena);
  void EnsureBatch(int B);

  // Fixed after construction.
  const CtrDnnConfig config_;
  Backend* const backend_;
  ParamArena arena_;
  Concat concat_;
  std::vector<Linear> linears_;  // ReLU fused into every one but the last
  SigmoidBce loss_;

  // Per-batch buffers, reallocated when B changes.
  int batch_ = 0;
  bool forward_done_ = false;
  Tensor pooled_, dpooled_;     // [num_slots, B, D]
  Tensor dense_;                // [B, num_dense]
  Tensor labels_;               // [B]
  Tensor input_, dinput_;       // [B, input_width()]
  std::vector<Tensor> y_, dy_;  // output of linear l (ReLU'd for hidden l)
  // Views reused every step (no per-step allocation).
  std::vector<Tensor> slot_parts_;       // [num_slots] of pooled_, then dense_
  std::vector<Tensor> slot_grads_;       // [num_slots] of dpooled_
  std::vector<Tensor*> slot_grad_ptrs_;  // [num_slots + 1]; the last (dense) is null
  Tensor probs_;                         // [B]
};

}  // namespace fleet::trainer
