#include "trainer/layers/layers.h"

#include <string>

namespace fleet::trainer {
namespace {

// Rows and columns of a tensor seen as a matrix [dim(0), numel / dim(0)].
int Rows(const Tensor& t) { return static_cast<int>(t.dim(0)); }
int Cols(const Tensor& t) { return t.dim(0) == 0 ? 0 : static_cast<int>(t.numel() / t.dim(0)); }

// Makes `scratch` hold at least `count` floats on the backend's device. A
// default Tensor is a 0-dim view of nothing whose numel() is 1, so capacity is
// judged on the data pointer too (a batch of one sample once wrote through null).
void GrowScratch(Backend* backend, Tensor* scratch, int64_t count) {
  if (count == 0) return;
  if (scratch->empty() || scratch->numel() < count) {
    *scratch = backend->AllocateTensor(Shape{count});
  }
}

}  // namespace

void AddLinearParams(ParamTable* table, std::string_view prefix, int in, int out) {
  table->push_back({std::string(prefix) + ".weight", Shape{out, in}});
  table->push_back({std::string(prefix) + ".bias", Shape{out}});
}

// ---- Linear -----------------------------------------------------------------

Linear::Linear(const ParamArena& arena, std::string_view prefix, kernels::Activation act)
    : backend_(arena.backend()),
      act_(act),
      w_(arena.param(std::string(prefix) + ".weight")),
      b_(arena.param(std::string(prefix) + ".bias")),
      dw_(arena.grad(std::string(prefix) + ".weight")),
      db_(arena.grad(std::string(prefix) + ".bias")) {
  CHECK_EQ(w_.ndim(), 2);
  CHECK_EQ(b_.numel(), w_.dim(0));
}

void Linear::Forward(const Tensor& x, Tensor* y) {
  const int B = Rows(x), in = in_features(), out = out_features();
  CHECK_EQ(Cols(x), in);
  CHECK_EQ(Rows(*y), B);
  CHECK_EQ(Cols(*y), out);
  x_ = x;
  y_ = *y;
  // y[B, out] = act(x[B, in] * W[out, in]^T + b)
  backend_->Gemm(false, true, B, out, in, 1.0f, x.data(), w_.data(), 0.0f, y->data());
  backend_->BiasActForward(y->data(), b_.data(), B, out, act_);
}

void Linear::Backward(const Tensor& dy, Tensor* dx, GradMode dx_mode) {
  const int B = Rows(x_), in = in_features(), out = out_features();
  CHECK_EQ(Rows(dy), B);
  CHECK_EQ(Cols(dy), out);
  const float* dz = dy.data();
  if (act_ == kernels::Activation::kNone) {
    backend_->BiasBackward(db_.data(), dy.data(), B, out);
  } else {
    GrowScratch(backend_, &dz_, int64_t{B} * out);
    backend_->BiasActBackward(dz_.data(), db_.data(), y_.data(), dy.data(), B, out, act_);
    dz = dz_.data();
  }
  // dW[out, in] += dz[B, out]^T * x[B, in]
  backend_->Gemm(true, false, out, in, B, 1.0f, dz, x_.data(), 1.0f, dw_.data());
  if (dx != nullptr) {
    CHECK_EQ(Rows(*dx), B);
    CHECK_EQ(Cols(*dx), in);
    // dx[B, in] (+)= dz[B, out] * W[out, in]
    backend_->Gemm(false, false, B, in, out, 1.0f, dz, w_.data(),
                   dx_mode == GradMode::kAdd ? 1.0f : 0.0f, dx->data());
  }
}

// ---- activations --------------------------------------------------------------

void Tanh::Forward(const Tensor& x, Tensor* y) {
  CHECK_EQ(x.numel(), y->numel());
  backend_->TanhForward(y->data(), x.data(), x.numel());
  y_ = *y;
}
void Tanh::Backward(const Tensor& dy, Tensor* dx) {
  CHECK_EQ(dy.numel(), y_.numel());
  CHECK_EQ(dx->numel(), y_.numel());
  backend_->TanhBackward(dx->data(), y_.data(), dy.data(), y_.numel());
}

void Relu::Forward(const Tensor& x, Tensor* y) {
  CHECK_EQ(x.numel(), y->numel());
  kernels::ReluForward(y->data(), x.data(), x.numel(), pool_);
  y_ = *y;
}
void Relu::Backward(const Tensor& dy, Tensor* dx) {
  CHECK_EQ(dy.numel(), y_.numel());
  CHECK_EQ(dx->numel(), y_.numel());
  kernels::ReluBackward(dx->data(), y_.data(), dy.data(), y_.numel(), pool_);
}

void Sigmoid::Forward(const Tensor& x, Tensor* y) {
  CHECK_EQ(x.numel(), y->numel());
  kernels::SigmoidForward(y->data(), x.data(), x.numel(), pool_);
  y_ = *y;
}
void Sigmoid::Backward(const Tensor& dy, Tensor* dx) {
  CHECK_EQ(dy.numel(), y_.numel());
  CHECK_EQ(dx->numel(), y_.numel());
  kernels::SigmoidBackward(dx->data(), y_.data(), dy.data(), y_.numel(), pool_);
}

// ---- losses -------------------------------------------------------------------

float SoftmaxCrossEntropy::Forward(const Tensor& logits, const int32_t* labels, Tensor* probs) {
  const int B = Rows(logits), C = Cols(logits);
  CHECK_EQ(probs->numel(), logits.numel());
  CHECK_GT(C, 0);
  GrowScratch(backend_, &row_loss_, B);
  backend_->SoftmaxCrossEntropyForward(probs->data(), row_loss_.data(), logits.data(), labels, B,
                                       C);
  host_loss_.resize(B);
  backend_->CopyToHost(host_loss_.data(), row_loss_.data(), B * sizeof(float));
  probs_ = probs->Reshaped(Shape{B, C});
  labels_ = labels;
  double sum = 0.0;
  for (float l : host_loss_) sum += l;
  return B == 0 ? 0.0f : static_cast<float>(sum / B);
}

void SoftmaxCrossEntropy::Backward(float dloss, Tensor* dlogits) {
  const int B = Rows(probs_), C = Cols(probs_);
  CHECK_EQ(dlogits->numel(), probs_.numel());
  if (B == 0) return;
  backend_->SoftmaxCrossEntropyBackward(dlogits->data(), probs_.data(), labels_, B, C,
                                        dloss / static_cast<float>(B));
}

float SigmoidBce::Forward(const Tensor& logits, const float* targets, Tensor* probs) {
  const size_t n = static_cast<size_t>(logits.numel());
  CHECK_EQ(probs->numel(), logits.numel());
  GrowScratch(backend_, &row_loss_, static_cast<int64_t>(n));
  backend_->SigmoidBceForward(probs->data(), row_loss_.data(), logits.data(), targets, n);
  host_loss_.resize(n);
  backend_->CopyToHost(host_loss_.data(), row_loss_.data(), n * sizeof(float));
  probs_ = *probs;
  targets_ = targets;
  double sum = 0.0;
  for (float l : host_loss_) sum += l;
  return n == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(n));
}

void SigmoidBce::Backward(float dloss, Tensor* dlogits) {
  const size_t n = static_cast<size_t>(probs_.numel());
  CHECK_EQ(static_cast<size_t>(dlogits->numel()), n);
  if (n == 0) return;
  backend_->SigmoidBceBackward(dlogits->data(), probs_.data(), targets_, n,
                               dloss / static_cast<float>(n));
}

// ---- embedding bag ------------------------------------------------------------

Status ValidateBagOffsets(std::span<const int64_t> offsets, int64_t num_rows) {
  if (offsets.empty()) return Status::InvalidArgument("bag offsets are empty (need B + 1)");
  if (offsets[0] != 0) {
    return Status::InvalidArgument("bag offsets must start at 0, got " +
                                   std::to_string(offsets[0]));
  }
  for (size_t b = 1; b < offsets.size(); ++b) {
    if (offsets[b] < offsets[b - 1]) {
      return Status::InvalidArgument("bag offsets decrease at index " + std::to_string(b));
    }
  }
  if (offsets.back() > num_rows) {
    return Status::InvalidArgument("bag offsets end at " + std::to_string(offsets.back()) +
                                   " but there are only " + std::to_string(num_rows) + " rows");
  }
  return Status::OK();
}

Status EmbeddingBag::Forward(const Tensor& rows, std::span<const int64_t> offsets, Tensor* out) {
  FLEET_RETURN_IF_ERROR(ValidateBagOffsets(offsets, rows.ndim() ? rows.dim(0) : 0));
  const int B = static_cast<int>(offsets.size() - 1);
  const int D = rows.ndim() == 2 ? static_cast<int>(rows.dim(1)) : 0;
  if (rows.ndim() != 2 || out->numel() != int64_t{B} * D) {
    return Status::InvalidArgument("embedding bag wants rows [N, D] and out [B, D]; got rows " +
                                   rows.shape().ToString() + ", out " + out->shape().ToString());
  }
  kernels::EmbeddingBagForward(out->data(), rows.data(), offsets.data(), B, D, mode_);
  offsets_.assign(offsets.begin(), offsets.end());
  return Status::OK();
}

Status EmbeddingBag::ForwardPtr(std::span<const float* const> row_ptrs,
                                std::span<const int64_t> offsets, Tensor* out) {
  FLEET_RETURN_IF_ERROR(ValidateBagOffsets(offsets, static_cast<int64_t>(row_ptrs.size())));
  const int B = static_cast<int>(offsets.size() - 1);
  if (out->ndim() != 2 || out->dim(0) != B) {
    return Status::InvalidArgument("embedding bag wants out [B, D] with B = " + std::to_string(B) +
                                   ", got " + out->shape().ToString());
  }
  for (int64_t r = 0; r < offsets.back(); ++r) {
    if (row_ptrs[r] == nullptr) {
      return Status::InvalidArgument("embedding bag row pointer is null at", std::to_string(r));
    }
  }
  kernels::EmbeddingBagForwardPtr(out->data(), row_ptrs.data(), offsets.data(), B,
                                  static_cast<int>(out->dim(1)), mode_);
  offsets_.assign(offsets.begin(), offsets.end());
  return Status::OK();
}

void EmbeddingBag::Backward(const Tensor& dout, Tensor* drows) {
  CHECK(!offsets_.empty()) << "EmbeddingBag::Backward before Forward";
  const int B = static_cast<int>(offsets_.size() - 1);
  CHECK_EQ(Rows(dout), B);
  const int D = Cols(dout);
  CHECK_GE(drows->numel(), offsets_.back() * D);
  kernels::EmbeddingBagBackward(drows->data(), dout.data(), offsets_.data(), B, D, mode_);
}

// ---- concat -------------------------------------------------------------------

void Concat::Forward(std::span<const Tensor> ins, Tensor* out) {
  CHECK(!ins.empty());
  const int B = Rows(ins[0]);
  widths_.clear();
  in_ptrs_.clear();
  int total = 0;
  for (const Tensor& t : ins) {
    CHECK_EQ(Rows(t), B);
    widths_.push_back(Cols(t));
    in_ptrs_.push_back(t.data());
    total += widths_.back();
  }
  CHECK_EQ(out->numel(), int64_t{B} * total);
  backend_->ConcatForward(out->data(), in_ptrs_, widths_, B);
}

void Concat::Backward(const Tensor& dout, std::span<Tensor* const> dins) {
  CHECK_EQ(dins.size(), widths_.size());
  grad_ptrs_.clear();
  for (size_t i = 0; i < dins.size(); ++i) {
    grad_ptrs_.push_back(dins[i] ? dins[i]->data() : nullptr);
    if (dins[i]) CHECK_EQ(Cols(*dins[i]), widths_[i]);
  }
  backend_->ConcatBackward(grad_ptrs_, dout.data(), widths_, Rows(dout));
}

// ---- CTR interactions ---------------------------------------------------------

void FieldSum::Forward(const Tensor& x, Tensor* out, float beta) {
  const int B = Rows(x);
  CHECK_EQ(Cols(x), layout_.row_stride);
  CHECK_EQ(out->numel(), int64_t{B} * width_);
  backend_->FieldSumForward(out->data(), x.data(), B, layout_.fields, width_, layout_.row_stride,
                            layout_.field_stride, offset_, beta);
}

void FieldSum::Backward(const Tensor& dout, Tensor* dx) {
  const int B = Rows(*dx);
  CHECK_EQ(Cols(*dx), layout_.row_stride);
  CHECK_EQ(dout.numel(), int64_t{B} * width_);
  backend_->FieldSumBackward(dx->data(), dout.data(), B, layout_.fields, width_, layout_.row_stride,
                             layout_.field_stride, offset_);
}

void FmInteraction::Forward(const Tensor& x, Tensor* out, float beta) {
  const int B = Rows(x);
  CHECK_EQ(Cols(x), layout_.row_stride);
  CHECK_EQ(out->numel(), B);
  x_ = x;
  backend_->FmForward(out->data(), x.data(), B, layout_.fields, dim_, layout_.row_stride,
                      layout_.field_stride, offset_, beta);
}

void FmInteraction::Backward(const Tensor& dout, Tensor* dx) {
  const int B = Rows(x_);
  CHECK_EQ(dout.numel(), B);
  CHECK_EQ(dx->numel(), x_.numel());
  backend_->FmBackward(dx->data(), x_.data(), dout.data(), B, layout_.fields, dim_,
                       layout_.row_stride, layout_.field_stride, offset_);
}

CrossLayer::CrossLayer(const ParamArena& arena, std::string_view prefix)
    : backend_(arena.backend()), linear_(arena, prefix) {
  CHECK_EQ(linear_.in_features(), linear_.out_features()) << prefix << " must be square";
}

void CrossLayer::Forward(const Tensor& x0, const Tensor& xl, Tensor* y) {
  const int B = Rows(xl), in = features();
  CHECK_EQ(x0.numel(), int64_t{B} * in);
  CHECK_EQ(y->numel(), int64_t{B} * in);
  x0_ = x0;
  xl_ = xl;
  GrowScratch(backend_, &u_, int64_t{B} * in);
  Tensor u(u_.data(), Shape{B, in}, u_.device());
  linear_.Forward(xl, &u);
  backend_->CrossForward(y->data(), x0.data(), u.data(), xl.data(), size_t(B) * in);
}

void CrossLayer::Backward(const Tensor& dy, Tensor* dx0, Tensor* dxl) {
  const int B = Rows(xl_), in = features();
  CHECK_EQ(dy.numel(), int64_t{B} * in);
  GrowScratch(backend_, &du_, int64_t{B} * in);
  Tensor du(du_.data(), Shape{B, in}, du_.device());
  backend_->CrossBackward(dx0->data(), du.data(), dxl->data(), x0_.data(), u_.data(), dy.data(),
                          size_t(B) * in);
  linear_.Backward(du, dxl, GradMode::kAdd);
}

}  // namespace fleet::trainer
