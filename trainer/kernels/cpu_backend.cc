#include "trainer/kernels/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace fleet::trainer {

std::shared_ptr<float> CpuBackend::AllocateFloats(size_t n) {
  auto storage = std::make_shared<float[]>(n ? n : 1);  // value-initialised: zeros
  return std::shared_ptr<float>(storage, storage.get());
}

std::shared_ptr<void> CpuBackend::AllocateBytes(size_t bytes) {
  auto storage = std::make_shared<std::byte[]>(bytes ? bytes : 1);
  return std::shared_ptr<void>(storage, storage.get());
}

void CpuBackend::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuBackend::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void CpuBackend::Fill(float* x, size_t n, float value) {
  kernels::ParallelRange(pool_, n, 4 * kernels::kParallelGrain,
                         [=](size_t b, size_t e) { std::fill(x + b, x + e, value); });
}

void CpuBackend::Discard(float* x, size_t n) {
  // Whole pages inside the range are handed back (they read as zeros after);
  // the partial pages at either end are zeroed by hand. No pool: this runs on
  // a communication thread while the pool computes.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(x);
  const uintptr_t end = begin + n * sizeof(float);
  const uintptr_t inner_begin = (begin + page - 1) / page * page;
  const uintptr_t inner_end = end / page * page;
  if (inner_begin >= inner_end ||
      madvise(reinterpret_cast<void*>(inner_begin), inner_end - inner_begin, MADV_DONTNEED) != 0) {
    std::memset(x, 0, n * sizeof(float));
    return;
  }
  std::memset(x, 0, inner_begin - begin);
  std::memset(reinterpret_cast<void*>(inner_end), 0, end - inner_end);
}

void CpuBackend::Gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                      const float* B, float beta, float* C) {
  if (gemm_log_ != nullptr) gemm_log_->push_back(GemmCall{trans_a, trans_b, M, N, K, beta});
  if (gemm_ == GemmKind::kBlas) {
    kernels::GemmBlas(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
  } else {
    kernels::GemmNaive(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
  }
}
void CpuBackend::BiasAddForward(float* y, const float* bias, int rows, int cols) {
  kernels::BiasAddForward(y, bias, rows, cols);
}
void CpuBackend::BiasBackward(float* dbias, const float* dy, int rows, int cols) {
  kernels::BiasBackward(dbias, dy, rows, cols);
}
void CpuBackend::BiasActForward(float* y, const float* bias, int rows, int cols,
                                kernels::Activation act) {
  kernels::BiasActForward(y, bias, rows, cols, act);
}
void CpuBackend::BiasActBackward(float* dz, float* dbias, const float* y, const float* dy, int rows,
                                 int cols, kernels::Activation act) {
  kernels::BiasActBackward(dz, dbias, y, dy, rows, cols, act);
}
void CpuBackend::TanhForward(float* y, const float* x, size_t n) {
  kernels::TanhForward(y, x, n, pool_);
}
void CpuBackend::TanhBackward(float* dx, const float* y, const float* dy, size_t n) {
  kernels::TanhBackward(dx, y, dy, n, pool_);
}
void CpuBackend::SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                            const int32_t* labels, int B, int C) {
  kernels::SoftmaxCrossEntropyForward(probs, row_loss, logits, labels, B, C, pool_);
}
void CpuBackend::SoftmaxCrossEntropyBackward(float* dlogits, const float* probs,
                                             const int32_t* labels, int B, int C, float scale) {
  kernels::SoftmaxCrossEntropyBackward(dlogits, probs, labels, B, C, scale, pool_);
}
void CpuBackend::SigmoidBceForward(float* probs, float* row_loss, const float* logits,
                                   const float* targets, size_t n) {
  kernels::SigmoidBceForward(probs, row_loss, logits, targets, n);
}
void CpuBackend::SigmoidBceBackward(float* dlogits, const float* probs, const float* targets,
                                    size_t n, float scale) {
  kernels::SigmoidBceBackward(dlogits, probs, targets, n, scale);
}
void CpuBackend::ConcatForward(float* out, std::span<const float* const> ins,
                               std::span<const int> widths, int B) {
  kernels::ConcatForward(out, ins, widths, B);
}
void CpuBackend::ConcatBackward(std::span<float* const> dins, const float* dout,
                                std::span<const int> widths, int B) {
  kernels::ConcatBackward(dins, dout, widths, B);
}
void CpuBackend::FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                                 int field_stride, int offset, float beta) {
  kernels::FieldSumForward(out, x, B, F, W, row_stride, field_stride, offset, beta);
}
void CpuBackend::FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                                  int field_stride, int offset) {
  kernels::FieldSumBackward(dx, dout, B, F, W, row_stride, field_stride, offset);
}
void CpuBackend::FmForward(float* out, const float* x, int B, int F, int D, int row_stride,
                           int field_stride, int offset, float beta) {
  kernels::FmForward(out, x, B, F, D, row_stride, field_stride, offset, beta);
}
void CpuBackend::FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D,
                            int row_stride, int field_stride, int offset) {
  kernels::FmBackward(dx, x, dout, B, F, D, row_stride, field_stride, offset);
}
void CpuBackend::CrossForward(float* y, const float* x0, const float* u, const float* xl,
                              size_t n) {
  kernels::CrossForward(y, x0, u, xl, n);
}
void CpuBackend::CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                               const float* dy, size_t n) {
  kernels::CrossBackward(dx0, du, dxl, x0, u, dy, n);
}
void CpuBackend::SgdUpdate(float* p, const float* g, size_t n, float lr, float weight_decay) {
  kernels::SgdUpdate(p, g, n, lr, weight_decay, pool_);
}
void CpuBackend::AdamUpdate(float* p, float* m, float* v, const float* g, size_t n,
                            const kernels::AdamHyper& h, int64_t t) {
  kernels::AdamUpdate(p, m, v, g, n, h, t, pool_);
}

}  // namespace fleet::trainer
