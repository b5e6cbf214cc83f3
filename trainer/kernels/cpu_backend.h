// CpuBackend: the Backend interface (trainer/backend.h) over the CPU kernels
// of cpu_kernels.h and OpenBLAS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/thread_pool.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_kernels.h"

namespace fleet::trainer {

// CPU backend over the kernels of cpu_kernels.h. `pool` (not owned, may be
// null, must outlive the backend) runs the element-wise kernels. With
// GemmKind::kNaive it uses the triple-loop GEMM oracle instead of OpenBLAS
// (for tests and the reference figure of benchmarks).
class CpuBackend final : public Backend {
 public:
  enum class GemmKind { kBlas, kNaive };
  explicit CpuBackend(ThreadPool* pool = nullptr, GemmKind gemm = GemmKind::kBlas)
      : pool_(pool), gemm_(gemm) {}

  ThreadPool* pool() const { return pool_; }

  // The shape of one Gemm call (see kernels::GemmBlas).
  struct GemmCall {
    bool trans_a = false, trans_b = false;
    int M = 0, N = 0, K = 0;
    float beta = 0.0f;
  };
  // While `log` is not null, every Gemm call also appends its shape to *log
  // (not owned; must outlive the recording). Benchmarks use it to time a
  // step's GEMMs alone (bench/train_bench's "GEMM floor").
  void RecordGemms(std::vector<GemmCall>* log) { gemm_log_ = log; }

  Device device() const override { return Device{}; }
  std::shared_ptr<float> AllocateFloats(size_t n) override;
  std::shared_ptr<void> AllocateBytes(size_t bytes) override;
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  void CopyOnDevice(void* dst, const void* src, size_t bytes) override;
  void Fill(float* x, size_t n, float value) override;
  void Discard(float* x, size_t n) override;

  void Gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
            const float* B, float beta, float* C) override;
  void BiasAddForward(float* y, const float* bias, int rows, int cols) override;
  void BiasBackward(float* dbias, const float* dy, int rows, int cols) override;
  void BiasActForward(float* y, const float* bias, int rows, int cols,
                      kernels::Activation act) override;
  void BiasActBackward(float* dz, float* dbias, const float* y, const float* dy, int rows, int cols,
                       kernels::Activation act) override;
  void TanhForward(float* y, const float* x, size_t n) override;
  void TanhBackward(float* dx, const float* y, const float* dy, size_t n) override;
  void SoftmaxCrossEntropyForward(float* probs, float* row_loss, const float* logits,
                                  const int32_t* labels, int B, int C) override;
  void SoftmaxCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* labels, int B,
                                   int C, float scale) override;
  void SigmoidBceForward(float* probs, float* row_loss, const float* logits, const float* targets,
                         size_t n) override;
  void SigmoidBceBackward(float* dlogits, const float* probs, const float* targets, size_t n,
                          float scale) override;
  void ConcatForward(float* out, std::span<const float* const> ins, std::span<const int> widths,
                     int B) override;
  void ConcatBackward(std::span<float* const> dins, const float* dout, std::span<const int> widths,
                      int B) override;
  void FieldSumForward(float* out, const float* x, int B, int F, int W, int row_stride,
                       int field_stride, int offset, float beta) override;
  void FieldSumBackward(float* dx, const float* dout, int B, int F, int W, int row_stride,
                        int field_stride, int offset) override;
  void FmForward(float* out, const float* x, int B, int F, int D, int row_stride, int field_stride,
                 int offset, float beta) override;
  void FmBackward(float* dx, const float* x, const float* dout, int B, int F, int D, int row_stride,
                  int field_stride, int offset) override;
  void CrossForward(float* y, const float* x0, const float* u, const float* xl, size_t n) override;
  void CrossBackward(float* dx0, float* du, float* dxl, const float* x0, const float* u,
                     const float* dy, size_t n) override;
  void SgdUpdate(float* p, const float* g, size_t n, float lr, float weight_decay) override;
  void AdamUpdate(float* p, float* m, float* v, const float* g, size_t n,
                  const kernels::AdamHyper& h, int64_t t) override;

 private:
  ThreadPool* const pool_;
  const GemmKind gemm_;
  std::vector<GemmCall>* gemm_log_ = nullptr;
};

}  // namespace fleet::trainer
