// Backend: the kernels the MLP and CTR towers need (GEMM, bias with a
// fused activation, tanh, softmax-CE, sigmoid-BCE, concatenation, the CTR
// interactions, the optimizer updates) plus memory, behind one interface with a CPU and a CUDA
// implementation (both fuse ReLU with the bias). Layers and models hold a Backend* and never know
// which one they drive; buffers they pass are in the backend's memory (device()).
//
// Shapes and semantics of every kernel are those of the same-named function
// in trainer/kernels/cpu_kernels.h (CpuBackend: kernels/cpu_backend.h; the
// backend for a device: kernels/backend_factory.h) (forward overwrites, backward ADDS).
// Kernels may run asynchronously on a device; CopyToHost waits for them.
//
// Thread safety: one Backend drives one model from one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "trainer/kernel_types.h"
#include "trainer/tensor.h"

namespace fleet::trainer {

// "cpu" or "cuda:K" (K a non-negative integer). InvalidArgument otherwise.
Result<Device> ParseDevice(std::string_view text);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // ---- memory: `n` floats (or bytes), zero-filled, freed with the last owner.
  virtual std::shared_ptr<float> AllocateFloats(size_t n) = 0;
  virtual std::shared_ptr<void> AllocateBytes(size_t bytes) = 0;
  Tensor AllocateTensor(Shape shape) {
    return Tensor(AllocateFloats(static_cast<size_t>(shape.numel())), shape, device());
  }
  // dst/src on this backend's device as named; blocking.
  virtual void CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void CopyOnDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void Fill(float* x, size_t n, float value) = 0;
  // x[0, n) = 0, and where the device can, the memory's pages go back to the
  // system until they are written again (the CPU: madvise MADV_DONTNEED on
  // the whole pages inside the range). Sharded training (ZeRO stage 2) drops
  // each gradient bucket this way once it is reduced. Safe to call from a
  // thread other than the one computing, for memory nothing else touches.
  virtual void Discard(float* x, size_t n) { Fill(x, n, 0.0f); }

  // ---- kernels --------------------------------------------------------------
  virtual void Gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                    const float* B, float beta, float* C) = 0;
  virtual void BiasAddForward(float* y, const float* bias, int rows, int cols) = 0;
  virtual void BiasBackward(float* dbias, const float* dy, int rows, int cols) = 0;
  // Bias + activation fused (kernels::BiasActForward / BiasActBackward).
  // The defaults compose the primitives here (bias, then tanh) for backends
  // without a fused kernel, and support kNone and kTanh only.
  virtual void BiasActForward(float* y, const float* bias, int rows, int cols,
                              kernels::Activation act);
  virtual void BiasActBackward(float* dz, float* dbias, const float* y, const float* dy, int rows,
                               int cols, kernels::Activation act);
  virtual void TanhForward(float* y, const float* x, size_t n) = 0;
  virtual void TanhBackward(float* dx, const float* y, const float* dy, size_t n) = 0;
  virtual void SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                          const int32_t* labels, int B, int C) = 0;
  virtual void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs,
                                           const int32_t* labels, int B, int C, float scale) = 0;
  virtual void SigmoidBceForward(float* probs, float* row_loss, const float* logits,
                                 const float* targets, size_t n) = 0;
  virtual void SigmoidBceBackward(float* dlogits, const float* probs, const float* targets,
                                  size_t n, float scale) = 0;
  // ins / dins hold pointers into this backend's memory (the pointer arrays
  // themselves are host arrays).
  virtual void ConcatForward(float* out, std::span<const float* const> ins,
                             std::span<const int> widths, int B) = 0;
  virtual void ConcatBackward(std::span<float* const> dins, const float* dout,
                              std::span<const int> widths, int B) = 0;
  // CTR interactions (kernels::FieldSum*, Fm*, Cross*: field layout and
  // shapes there): the wide part's and FM's sums over fields, DCN's cross.
  virtual void FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                               int field_stride, int offset, float beta) = 0;
  virtual void FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                                int field_stride, int offset) = 0;
  virtual void FmForward(float* out, const float* x, int B, int F, int D, int row_stride,
                         int field_stride, int offset, float beta) = 0;
  virtual void FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D,
                          int row_stride, int field_stride, int offset) = 0;
  virtual void CrossForward(float* y, const float* x0, const float* u, const float* xl,
                            size_t n) = 0;
  virtual void CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                             const float* dy, size_t n) = 0;
  virtual void SgdUpdate(float* p, const float* g, size_t n, float lr, float weight_decay) = 0;
  virtual void AdamUpdate(float* p, float* m, float* v, const float* g, size_t n,
                          const kernels::AdamHyper& h, int64_t t) = 0;
};

}  // namespace fleet::trainer
