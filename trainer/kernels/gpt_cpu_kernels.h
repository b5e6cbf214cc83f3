// CpuGptKernels: the optimised CPU twin of GptKernels (gpt_kernels.h).
// GEMMs (the matmuls, and attention's QK^T, PV and their gradients) go
// through CBLAS (OpenBLAS); LayerNorm, GELU, softmax and cross-entropy are
// vectorisable loops; everything is split over threads.
//
// Threads: ONE set of threads does everything. Each kernel cuts its work into
// blocks (row blocks of a GEMM's output, (batch, head) pairs of attention,
// row or column ranges of the rest) and runs them on `pool` plus the calling
// thread; inside a block OpenBLAS runs single-threaded. OpenBLAS's own
// threads must therefore be off (OpenBLAS at 1 thread), or a GEMM block would
// start more threads on cores the pool already uses: its threads spin after
// each call and fight the pool's (cpu_kernels.h measured ~3x slower for the
// MLP when both were on). SetUpGptCpuThreads() below sets both sides for a
// program; it is where the thread count of GPT training on CPU is decided.
// Why not OpenBLAS's threads for the GEMMs and the pool for the rest: the
// two sets of threads would alternate every few hundred microseconds and
// each hand-over costs the spinning or wake-up above; and attention's many
// small GEMMs parallelise better over (batch, head) pairs than inside each.
//
// Block boundaries depend only on the shapes and the number of workers, and
// every reduction is summed in a fixed order, so results are deterministic
// for a given pool size (not across pool sizes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "comm/thread_pool.h"
#include "trainer/kernels/gpt_kernels.h"

namespace fleet::trainer {

class CpuGptKernels final : public GptKernels {
 public:
  // `pool` is not owned, may be null (everything on the calling thread) and
  // must outlive this object. Workers = pool threads + the caller.
  explicit CpuGptKernels(ThreadPool* pool);

  int workers() const { return workers_; }

  Device device() const override { return Device{}; }
  std::string_view name() const override { return "cpu"; }

  void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                      int T, int C) override;
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                       int T, int C) override;
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C) override;
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int N, int C) override;
  void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                     int IC, int OC, bool accumulate) override;
  void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                      const float* inp, const float* weight, int N, int IC, int OC) override;
  // Saved: the probabilities [B, NH, T, T] (only the causal part of each
  // row block is written). Scratch: one [kAttentionRowBlock, T] block per
  // attention task.
  size_t AttentionSavedFloats(int B, int T, int NH) const override;
  // With dropout, forward drops the probabilities of each row block into
  // its task's scratch block (saved keeps them whole for backward).
  void AttentionForward(float* out, float* saved, float* scratch, const float* qkv, int B, int T,
                        int C, int NH, const DropoutSpec& dropout) override;
  size_t AttentionScratchFloats(int B, int T, int NH) const override;
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* out, const float* saved, int B, int T, int C, int NH,
                         const DropoutSpec& dropout) override;
  void AttentionDecodeForward(float* out, float* k_cache, float* v_cache, float* scratch,
                              const float* qkv, int B, int T, int past, int maxT, int C,
                              int NH) override;
  void DropoutForward(float* out, const float* inp, const float* residual, int B, size_t n,
                      const DropoutSpec& dropout) override;
  void DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                       const DropoutSpec& dropout) override;
  void GeluForward(float* out, const float* inp, size_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N, int V,
                           float dloss, bool write_dlogits) override;
  void EncoderShardForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                           int B, int T, int C, int v_begin, int V) override;
  void EncoderShardBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            int B, int T, int C, int v_begin, int V) override;
  void CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) override;
  void CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                             const int32_t* targets, int N, int V, int v_begin) override;
  void CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                               const float* sums, const int32_t* targets, int N, int V, int v_begin,
                               float dloss, bool write_dlogits) override;
  double SumOfSquares(const float* x, size_t n) override;
  void AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                   const AdamWStep& step) override;

  // Attention works on row blocks of this many queries: each block's scores
  // are computed only against the keys it can see (causal), which halves the
  // attention GEMMs' work for long sequences.
  static constexpr int kAttentionRowBlock = 64;

 private:
  // Runs fn(i) for i in [0, n) on the pool and the caller (or serially).
  void For(size_t n, const std::function<void(size_t)>& fn) const;
  // Number of (batch, head) tasks of attention for B * NH pairs.
  int AttentionTasks(int B, int NH) const;

  ThreadPool* const pool_;  // not owned; may be null
  const int workers_;
};

// The thread policy of GPT on CPU, in one place. Makes OpenBLAS
// single-threaded (process-wide: call it from main(), before any GEMM) and
// returns a pool of num_threads - 1 threads for CpuGptKernels (null for
// num_threads == 1; the calling thread is the other worker).
// REQUIRES: num_threads >= 1. Use the number of cores the process may use
// (one rank per machine) or cores / ranks (several ranks on one machine).
std::unique_ptr<ThreadPool> SetUpGptCpuThreads(int num_threads);

}  // namespace fleet::trainer
