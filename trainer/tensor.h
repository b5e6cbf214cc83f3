// Tensor: a dense, contiguous, row-major float tensor of up to 4 dims.
//
// A Tensor is a view: a pointer, a shape and the device the pointer lives on.
// It may also share ownership of its memory (Backend::AllocateTensor), in
// which case the memory lives while any copy of the Tensor does; a view into
// a ParamArena owns nothing and is valid while the arena lives.
//
// Copying a Tensor copies the view, never the elements. Thread safety: as for
// a plain pointer; concurrent writers need the caller's own synchronisation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include <glog/logging.h>

namespace fleet::trainer {

// Where a buffer lives: host memory or the memory of CUDA device `index`.
struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;

  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  bool operator==(const Device&) const = default;
  // "cpu" or "cuda:K".
  std::string ToString() const {
    return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
  }
};

class Shape {
 public:
  static constexpr int kMaxDims = 4;

  Shape() = default;
  // REQUIRES: at most kMaxDims dims, each >= 0.
  Shape(std::initializer_list<int64_t> dims) {
    CHECK_LE(dims.size(), static_cast<size_t>(kMaxDims)) << "Shape has at most 4 dims";
    for (int64_t d : dims) {
      CHECK_GE(d, 0);
      dims_[ndim_++] = d;
    }
  }

  int ndim() const { return ndim_; }
  // REQUIRES: 0 <= i < ndim().
  int64_t operator[](int i) const {
    DCHECK(i >= 0 && i < ndim_);
    return dims_[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim_; ++i) n *= dims_[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim_ != o.ndim_) return false;
    for (int i = 0; i < ndim_; ++i)
      if (dims_[i] != o.dims_[i]) return false;
    return true;
  }
  // "[64, 128]".
  std::string ToString() const {
    std::string s = "[";
    for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
    return s + "]";
  }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // A view of `data` (not owned) on `device`.
  Tensor(float* data, Shape shape, Device device = {})
      : data_(data), shape_(shape), device_(device) {}
  // A view of memory kept alive by `owner`.
  Tensor(std::shared_ptr<float> owner, Shape shape, Device device)
      : owner_(std::move(owner)), data_(owner_.get()), shape_(shape), device_(device) {}

  float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  const Device& device() const { return device_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  bool empty() const { return data_ == nullptr; }

  // The same memory seen with another shape of equal numel.
  Tensor Reshaped(Shape shape) const {
    CHECK_EQ(shape.numel(), numel()) << shape.ToString() << " vs " << shape_.ToString();
    Tensor t = *this;
    t.shape_ = shape;
    return t;
  }

  // Host-only element access. REQUIRES: device().is_cpu().
  float& operator[](int64_t i) const {
    DCHECK(device_.is_cpu());
    DCHECK(i >= 0 && i < numel());
    return data_[i];
  }

 private:
  std::shared_ptr<float> owner_;  // null for views
  float* data_ = nullptr;
  Shape shape_;
  Device device_;
};

}  // namespace fleet::trainer
