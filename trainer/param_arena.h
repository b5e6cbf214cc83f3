// ParamArena: every dense parameter of a model in one contiguous buffer, and
// every gradient in a second buffer with the same layout, both laid out from
// one {name, shape} table. A dense push, an allreduce or an optimizer step is
// then one call over one buffer (params() / grads()).
//
// The table is the single source of the layout: tensor i starts at
// offset(i) = sum of numel of tensors 0..i-1, in table order, with no
// padding. Checkpoints and golden files name tensors by the table's names.
//
// Thread safety: the layout is fixed after Create(); the contents follow the
// usual rule (one writer, no concurrent readers).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/tensor.h"

namespace fleet::trainer {

// Called during Backward when the gradients of table tensors
// [first, end) are final (last layer first), so a data-parallel helper can
// start reducing grads [offset(first), offset(end)) while backward goes on.
using GradReadyFn = std::function<void(size_t first, size_t end)>;

struct ParamSpec {
  std::string name;  // e.g. "fc1.weight"
  Shape shape;
};
using ParamTable = std::vector<ParamSpec>;

class ParamArena {
 public:
  // Allocates zeroed params and grads on `backend` (not owned; must outlive
  // the arena). InvalidArgument for an empty or duplicate name or an empty
  // shape. `with_grads` false allocates no gradient buffer: for frozen
  // parameters (LoRA's base weights), whose grads() is then an empty tensor
  // with a null data pointer, and which nothing may train.
  static Result<ParamArena> Create(ParamTable table, Backend* backend, bool with_grads = true);

  // Move-only: a copy would alias the same buffers.
  ParamArena(ParamArena&&) = default;
  ParamArena& operator=(ParamArena&&) = default;
  ParamArena(const ParamArena&) = delete;
  ParamArena& operator=(const ParamArena&) = delete;

  const ParamTable& table() const { return table_; }
  Backend* backend() const { return backend_; }
  size_t size() const { return offsets_.back(); }  // total floats
  size_t num_tensors() const { return table_.size(); }
  size_t offset(size_t i) const { return offsets_[i]; }

  // The whole buffers, shape [size()], on backend()->device(); grads() is
  // empty (null data) without gradient storage.
  bool has_grads() const { return grads_.data() != nullptr; }
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }
  // Views of tensor i / of the named tensor with its table shape.
  // REQUIRES: i < num_tensors(); the name exists (CHECK: names are code);
  // has_grads() for grad().
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;
  Tensor param(std::string_view name) const { return param(IndexOf(name)); }
  Tensor grad(std::string_view name) const { return grad(IndexOf(name)); }
  // NotFound when no tensor has that name.
  Result<size_t> Find(std::string_view name) const;

  // grads() = 0 (nothing without gradients). Call before each step's
  // Backward (which adds).
  void ZeroGrad();

  // Host copies of the buffers, and writing params from host floats
  // (InvalidArgument if host.size() != size()).
  std::vector<float> ParamsToHost() const;
  std::vector<float> GradsToHost() const;
  Status ParamsFromHost(std::span<const float> host);

 private:
  ParamArena() = default;
  size_t IndexOf(std::string_view name) const;

  ParamTable table_;
  std::vector<size_t> offsets_{0};  // num_tensors() + 1 entries
  Backend* backend_ = nullptr;
  Tensor params_;
  Tensor grads_;
};

}  // namespace fleet::trainer
