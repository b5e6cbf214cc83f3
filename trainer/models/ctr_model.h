// CtrModel: the dense part of the CTR models a PS worker trains (model.kind
// dnn / ctr_dnn, wide_deep, deepfm, dcn), all one class whose parts a kind
// turns on. Input: the pooled pull of each of `num_slots` sparse fields
// (`embedding_dim` floats: the table's pull width) and `num_dense` dense
// features, concatenated into x0 [B, num_slots * embedding_dim + num_dense].
//
//   wide      logit += sum over fields of each field's first float (the
//             first-order weight of a [w, v_1..v_D] row; Wide&Deep, DeepFM)
//   fm        logit += sum_{f<g} <v_f, v_g> over the fields' floats 1..D
//             (DeepFM's second-order term)
//   cross     cross_layers DCN-v2 layers c_{l+1} = x0 * (W_l c_l + b_l) + c_l,
//             c_0 = x0; the last feeds the head
//   deep      FC layers of `hidden`, ReLU after each, over x0; the last
//             feeds the head
//   head      one Linear to the logit over [c_L, h] (whichever exist; x0
//             when neither does), then sigmoid binary cross-entropy.
//
// Parameters, in this order: "fc1".."fcH" (deep), "cross1".."crossL"
// (weight [in, in], bias [in]), "fc{H+1}" (the head, [1, head inputs]). A
// dnn's table is therefore CTR-DNN's: fc1, ..., fc{H+1}. Sparse weights
// (first-order weights, embeddings) live in the PS table, not here.
//
// Runs on any Backend: the CPU worker's own step on the CPU, a heter
// worker's dense section on CPU or CUDA (the same kernels' math on both).
//
// A training step on a PS worker:
//   model->arena().ZeroGrad();
//   pool each slot's rows into pooled[s]            (EmbeddingBag::Forward)
//   FLEET_ASSIGN_OR_RETURN(float loss, model->Forward(pooled, dense, labels));
//   model->Backward();                               (dense grads + pooled grads)
//   unpool model->pooled_grad() slot by slot         (EmbeddingBag::Backward)
//   push arena().grads() and the row grads
//
// Adding a model that combines these parts is one entry of CtrModelKinds()
// (ctr_model_kinds.cc); see CONTRIBUTING.md "Adding a CTR model".
//
// Thread safety: one thread drives a model at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/layers/layers.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

struct CtrModelConfig {
  // Sparse fields (Criteo: 26). Each contributes one pooled vector.
  int num_slots = 26;
  // Floats per field: what a pull returns per key (the PS table's pull
  // width). With wide or fm, float 0 is the field's first-order weight and
  // floats 1.. its embedding (so >= 2).
  int embedding_dim = 9;
  // Dense features (Criteo: 13).
  int num_dense = 13;
  // The parts (see the top of this file).
  bool wide = false;
  bool fm = false;
  int cross_layers = 0;
  std::vector<int> hidden = {400, 400, 400};
  // Seed of the parameter initialisation.
  uint64_t seed = 1;
};

// A model kind: model.kind's name and the parts it turns on (a config's
// cross_layers and hidden are used only by kinds with cross / deep parts).
struct CtrModelKind {
  const char* name;
  bool wide;
  bool fm;
  bool cross;
  bool deep;
  const char* about;  // one line, for help and errors
};
// Every kind, in a fixed order (ctr_model_kinds.cc). Static storage.
std::span<const CtrModelKind> CtrModelKinds();
const CtrModelKind* FindCtrModelKind(std::string_view name);

// The parameter table of a config (see the top of this file).
ParamTable CtrModelParamTable(const CtrModelConfig& config);

class CtrModel {
 public:
  // InvalidArgument for a bad config. `backend` is not owned and must
  // outlive the model (a CpuBackend's pool runs the element-wise kernels).
  static Result<std::unique_ptr<CtrModel>> Create(const CtrModelConfig& config, Backend* backend);

  const CtrModelConfig& config() const { return config_; }
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
  // into pooled_grad(). on_grads_ready(first, end) is called with each
  // range of parameter tensors (table indices) whose gradients are final.
  // REQUIRES: a successful Forward since the last Backward.
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
  CtrModel(const CtrModelConfig& config, Backend* backend, ParamArena arena);
  void EnsureBatch(int B);
  // Width of the head's input: [c_L, h], or x0.
  int head_inputs() const;

  // Fixed after construction.
  const CtrModelConfig config_;
  Backend* const backend_;
  ParamArena arena_;
  const FieldLayout fields_;
  Concat concat_;
  Concat head_concat_;        // [c_L, h] when both exist
  std::vector<Linear> deep_;  // ReLU fused into each
  std::vector<CrossLayer> cross_;
  Linear head_;
  FieldSum wide_;     // used when config_.wide
  FmInteraction fm_;  // used when config_.fm
  SigmoidBce loss_;

  // Per-batch buffers, reallocated when B changes.
  int batch_ = 0;
  bool forward_done_ = false;
  Tensor pooled_, dpooled_;     // [num_slots, B, D]
  Tensor dense_;                // [B, num_dense]
  Tensor labels_;               // [B]
  Tensor input_, dinput_;       // x0 and its gradient, [B, input_width()]
  std::vector<Tensor> h_, dh_;  // output of deep layer l (ReLU'd)
  std::vector<Tensor> c_, dc_;  // output of cross layer l
  Tensor head_in_, dhead_in_;   // [B, head_inputs()] when both parts feed the head
  Tensor logits_, dlogits_;     // [B, 1]
  // Views reused every step (no per-step allocation).
  std::vector<Tensor> slot_parts_;       // [num_slots] of pooled_, then dense_
  std::vector<Tensor> slot_grads_;       // [num_slots] of dpooled_
  std::vector<Tensor*> slot_grad_ptrs_;  // [num_slots + 1]; the last (dense) is null
  std::vector<Tensor> head_parts_;       // c_L, h_H (both parts only)
  std::vector<Tensor*> head_grad_ptrs_;
  Tensor probs_;  // [B]
};

}  // namespace fleet::trainer
