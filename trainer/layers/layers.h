// Layers with explicit Forward and Backward (llm.c style).
//
// * Forward overwrites its output and keeps what Backward needs (a view of
//   its input or output: the caller keeps those buffers alive and unchanged
//   until Backward has run).
// * Backward ADDS into its gradient outputs, both the parameter gradients in
//   the ParamArena and the input gradient `dx` it is given; the caller zeroes
//   them before the step (ParamArena::ZeroGrad and its own activation grads).
// * Batch rows are the first dim; shapes are in each method's comment.
//
// Linear, Tanh, SoftmaxCrossEntropy, SigmoidBce, Concat and the CTR
// interactions (FieldSum, FmInteraction, CrossLayer) run on any Backend (CPU or CUDA; Linear's
// fused ReLU needs a backend with a fused kernel, which both have); Relu, Sigmoid and EmbeddingBag
// are CPU only (host buffers; optional ThreadPool for the element-wise work).
//
// Thread safety: a layer object is used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "comm/thread_pool.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/param_arena.h"
#include "trainer/tensor.h"

namespace fleet::trainer {

// Adds "<prefix>.weight" [out, in] and "<prefix>.bias" [out] to a table.
void AddLinearParams(ParamTable* table, std::string_view prefix, int in, int out);

// Whether a backward ADDS into a gradient buffer (the default: the caller
// zeroed it, and a tensor used twice accumulates) or OVERWRITES it (the
// caller need not zero it first).
enum class GradMode { kAdd, kOverwrite };

// y = act(x W^T + b).   W: [out, in], b: [out] (PyTorch's layout). The
// activation (none, tanh or ReLU) is applied in the same pass as the bias,
// right after the GEMM; backward applies its derivative and sums the bias
// gradient in one pass before the two GEMMs.
class Linear {
 public:
  // Views "<prefix>.weight" and "<prefix>.bias" (and their grads) in `arena`,
  // which must outlive the layer. `backend` is the arena's; ReLU needs one
  // with a fused kernel (the CPU and CUDA backends).
  Linear(const ParamArena& arena, std::string_view prefix,
         kernels::Activation act = kernels::Activation::kNone);

  int in_features() const { return static_cast<int>(w_.dim(1)); }
  int out_features() const { return static_cast<int>(w_.dim(0)); }
  kernels::Activation activation() const { return act_; }

  // x: [B, in], y: [B, out]. Keeps views of x and y (y: the activation's
  // backward reads it).
  void Forward(const Tensor& x, Tensor* y);
  // dy: [B, out], the gradient of y. With dz = dy * act'(y):
  // dW += dz^T x; db += sum_rows dz; dx (if not null, [B, in]) += dz W, or
  // = dz W with GradMode::kOverwrite.
  void Backward(const Tensor& dy, Tensor* dx, GradMode dx_mode = GradMode::kAdd);

 private:
  Backend* const backend_;
  const kernels::Activation act_;
  Tensor w_, b_, dw_, db_;
  Tensor x_, y_;  // saved input and output
  Tensor dz_;     // [capacity] scratch for dy * act'(y); grows, never shrinks
};

// y = tanh(x), element-wise on any backend.
class Tanh {
 public:
  explicit Tanh(Backend* backend) : backend_(backend) {}
  // x, y: same shape. Keeps a view of y.
  void Forward(const Tensor& x, Tensor* y);
  // dx += dy * (1 - y^2). dy, dx: y's shape.
  void Backward(const Tensor& dy, Tensor* dx);

 private:
  Backend* const backend_;
  Tensor y_;
};

// y = max(x, 0). CPU.
class Relu {
 public:
  explicit Relu(ThreadPool* pool = nullptr) : pool_(pool) {}
  void Forward(const Tensor& x, Tensor* y);     // keeps a view of y
  void Backward(const Tensor& dy, Tensor* dx);  // dx += dy * (y > 0)

 private:
  ThreadPool* const pool_;
  Tensor y_;
};

// y = sigmoid(x). CPU.
class Sigmoid {
 public:
  explicit Sigmoid(ThreadPool* pool = nullptr) : pool_(pool) {}
  void Forward(const Tensor& x, Tensor* y);     // keeps a view of y
  void Backward(const Tensor& dy, Tensor* dx);  // dx += dy * y * (1 - y)

 private:
  ThreadPool* const pool_;
  Tensor y_;
};

// Mean softmax cross-entropy over the batch, on any backend.
class SoftmaxCrossEntropy {
 public:
  explicit SoftmaxCrossEntropy(Backend* backend) : backend_(backend) {}
  // logits, probs: [B, C]; labels: [B] on the backend's device, in [0, C)
  // (REQUIRES: validated by the caller). Returns mean_b -log probs[b, label].
  // Keeps views of probs and labels.
  float Forward(const Tensor& logits, const int32_t* labels, Tensor* probs);
  // dlogits [B, C] += dloss * (probs - onehot(labels)) / B.
  void Backward(float dloss, Tensor* dlogits);

 private:
  Backend* const backend_;
  Tensor probs_;
  const int32_t* labels_ = nullptr;
  Tensor row_loss_;               // [capacity] scratch on the device
  std::vector<float> host_loss_;  // [B]
};

// Mean binary cross-entropy on logits (numerically stable), on any backend.
class SigmoidBce {
 public:
  explicit SigmoidBce(Backend* backend) : backend_(backend) {}
  // logits, probs: [B] or [B, 1]; targets: [B] in [0, 1] on the backend's
  // device (REQUIRES: validated by the caller). Returns the mean loss (the
  // per-sample losses summed in order in double on the host); probs =
  // sigmoid(logits). Keeps views of probs and targets.
  float Forward(const Tensor& logits, const float* targets, Tensor* probs);
  // dlogits [B] += dloss * (probs - targets) / B.
  void Backward(float dloss, Tensor* dlogits);

 private:
  Backend* const backend_;
  Tensor probs_;
  const float* targets_ = nullptr;
  Tensor row_loss_;               // [capacity] scratch on the device
  std::vector<float> host_loss_;  // [B]
};

// InvalidArgument unless offsets has >= 1 entry, offsets[0] == 0, is
// non-decreasing and ends at <= num_rows.
Status ValidateBagOffsets(std::span<const int64_t> offsets, int64_t num_rows);

// Embedding-bag pooling (sum or mean) of sparse rows into one vector per
// sample. Bag b is rows offsets[b] .. offsets[b+1]-1. CPU.
class EmbeddingBag {
 public:
  explicit EmbeddingBag(kernels::PoolMode mode) : mode_(mode) {}
  kernels::PoolMode mode() const { return mode_; }

  // rows: [num_rows, D]; offsets: [B + 1]; out: [B, D]. InvalidArgument (and
  // out untouched) for bad offsets or shapes. Keeps a copy of offsets.
  Status Forward(const Tensor& rows, std::span<const int64_t> offsets, Tensor* out);
  // The same over row pointers (row_ptrs: [num_rows], each -> [D] floats).
  Status ForwardPtr(std::span<const float* const> row_ptrs, std::span<const int64_t> offsets,
                    Tensor* out);
  // dout: [B, D]; drows: [num_rows, D] += the gradient of each pooled row
  // (what a PS worker pushes as the sparse gradient).
  void Backward(const Tensor& dout, Tensor* drows);

 private:
  const kernels::PoolMode mode_;
  std::vector<int64_t> offsets_;
};

// Concatenation along the last dim of [B, w_i] inputs, on any backend.
class Concat {
 public:
  explicit Concat(Backend* backend) : backend_(backend) {}
  // ins[i]: [B, w_i]; out: [B, sum w_i]. Keeps the widths.
  void Forward(std::span<const Tensor> ins, Tensor* out);
  // dins[i] ([B, w_i], may be null) += the matching slice of dout.
  void Backward(const Tensor& dout, std::span<Tensor* const> dins);

 private:
  Backend* const backend_;
  std::vector<int> widths_;
  std::vector<const float*> in_ptrs_;  // reused: no allocation per call once warm
  std::vector<float*> grad_ptrs_;
};

// ---- CTR interactions ----------------------------------------------------------
// A CTR model's input row: `fields` fields of `field_stride` floats (what a
// PS pull returns per key, pooled per field), then other features; rows
// `row_stride` floats apart (kernels::FieldSumForward's layout).
struct FieldLayout {
  int fields = 0;
  int field_stride = 0;
  int row_stride = 0;
};

// The sum over fields of `width` floats at `offset` of each field, on any
// backend. The wide (first-order) part of Wide&Deep and DeepFM is width 1
// at offset 0: each field's first-order weight, summed into the logit.
class FieldSum {
 public:
  FieldSum(Backend* backend, FieldLayout layout, int offset, int width)
      : backend_(backend), layout_(layout), offset_(offset), width_(width) {}
  // x: [B, row_stride]; out: [B, width] = beta * out + the sum (beta 0
  // overwrites, 1 adds). Keeps nothing.
  void Forward(const Tensor& x, Tensor* out, float beta);
  // dx [B, row_stride] += dout [B, width], into every summed position.
  void Backward(const Tensor& dout, Tensor* dx);

 private:
  Backend* const backend_;
  const FieldLayout layout_;
  const int offset_, width_;
};

// The factorisation machine's second-order term over each field's `dim`
// floats at `offset` (DeepFM's FM part), on any backend:
//   out[b] = beta * out[b] + sum_{f < g} <v_f, v_g>.
class FmInteraction {
 public:
  FmInteraction(Backend* backend, FieldLayout layout, int offset, int dim)
      : backend_(backend), layout_(layout), offset_(offset), dim_(dim) {}
  // x: [B, row_stride]; out: [B] (or [B, 1]). Keeps a view of x.
  void Forward(const Tensor& x, Tensor* out, float beta);
  // dx [B, row_stride] += d out / d x for dout [B].
  void Backward(const Tensor& dout, Tensor* dx);

 private:
  Backend* const backend_;
  const FieldLayout layout_;
  const int offset_, dim_;
  Tensor x_;
};

// One DCN-v2 cross layer (full rank): y = x0 * (W xl + b) + xl, with
// W "<prefix>.weight" [in, in] and b "<prefix>.bias" [in], on any backend.
class CrossLayer {
 public:
  // Views the parameters in `arena` (which must outlive the layer).
  CrossLayer(const ParamArena& arena, std::string_view prefix);
  int features() const { return linear_.in_features(); }

  // x0, xl, y: [B, in]. Keeps views of x0 and xl.
  void Forward(const Tensor& x0, const Tensor& xl, Tensor* y);
  // dy: [B, in]. dW, db += their gradients; dx0 += dy * (W xl + b);
  // dxl += dy + (dy * x0) W. dx0 and dxl may be the same tensor (the first
  // layer, whose xl is x0).
  void Backward(const Tensor& dy, Tensor* dx0, Tensor* dxl);

 private:
  Backend* const backend_;
  Linear linear_;  // W xl + b
  Tensor x0_, xl_;
  Tensor u_, du_;  // [capacity] W xl + b and its gradient; grow, never shrink
};

}  // namespace fleet::trainer
