// The naive GPT-2 kernels: the oracle every optimised twin (CPU, CUDA) is
// tested against. Plain loops in the most obvious order, one thread, sums
// accumulated in double. Each function has the semantics, shapes and
// add/overwrite rules of the GptKernels method of the same name
// (gpt_kernels.h); `F` is float (the oracle) or double (finite-difference
// gradient checks evaluate the forward in double so that the differences are
// exact to ~1e-10).
//
// Attention keeps the probabilities [B, NH, T, T] (zeros above the diagonal)
// and uses a scratch of the same size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainer/kernels/gpt_kernels.h"

namespace fleet::trainer::kernels::gpt_ref {

template <typename F>
void EncoderForward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T, int C);
template <typename F>
void EncoderBackward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C);
template <typename F>
void LayerNormForward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int N,
                      int C);
template <typename F>
void LayerNormBackward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                       const F* mean, const F* rstd, int N, int C);
template <typename F>
void MatmulForward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC,
                   bool accumulate);
template <typename F>
void MatmulBackward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                    int N, int IC, int OC);
// saved: [B, NH, T, T] probabilities (before dropout).
template <typename F>
void AttentionForward(F* out, F* saved, const F* qkv, int B, int T, int C, int NH,
                      const DropoutSpec& dropout);
// scratch: [B, NH, T, T].
template <typename F>
void AttentionBackward(F* dqkv, F* scratch, const F* dout, const F* qkv, const F* saved, int B,
                       int T, int C, int NH, const DropoutSpec& dropout);
// The dropout mask's factor of element `index` of sequence b in `lane`: 0
// (dropped) or 1 / (1 - p), computed in double; 1 when dropout is off.
// dropout.streams is host memory.
double DropoutFactor(const DropoutSpec& dropout, int b, int lane, uint64_t index);
template <typename F>
void DropoutForward(F* out, const F* inp, const F* residual, int B, size_t n,
                    const DropoutSpec& dropout);
template <typename F>
void DropoutBackward(F* dinp, const F* dout, int B, size_t n, const DropoutSpec& dropout);
template <typename F>
void GeluForward(F* out, const F* inp, size_t n);
template <typename F>
void GeluBackward(F* dinp, const F* inp, const F* dout, size_t n);
template <typename F>
void CrossEntropyForward(F* losses, F* logits, const int32_t* targets, int N, int V, F dloss,
                         bool write_dlogits);
void EncoderShardForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C, int v_begin, int V);
void EncoderShardBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                          int T, int C, int v_begin, int V);
void CrossEntropyShardMax(float* row_max, const float* logits, int N, int V);
void CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                           const int32_t* targets, int N, int V, int v_begin);
void CrossEntropyShardFinish(float* losses, float* logits, const float* row_max, const float* sums,
                             const int32_t* targets, int N, int V, int v_begin, float dloss,
                             bool write_dlogits);
double SumOfSquares(const float* x, size_t n);
void AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& step);

}  // namespace fleet::trainer::kernels::gpt_ref

namespace fleet::trainer {

// The naive kernels behind the GptKernels interface (host memory), so that a
// whole GptModel can run on the oracle.
class RefGptKernels final : public GptKernels {
 public:
  Device device() const override { return Device{}; }
  std::string_view name() const override { return "cpu-reference"; }

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
  size_t AttentionSavedFloats(int B, int T, int NH) const override;
  void AttentionForward(float* out, float* saved, float* scratch, const float* qkv, int B, int T,
                        int C, int NH, const DropoutSpec& dropout) override;
  size_t AttentionScratchFloats(int B, int T, int NH) const override;
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* out, const float* saved, int B, int T, int C, int NH,
                         const DropoutSpec& dropout) override;
  void DropoutForward(float* out, const float* inp, const float* residual, int B, size_t n,
                      const DropoutSpec& dropout) override;
  void DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                       const DropoutSpec& dropout) override;
  void AttentionDecodeForward(float* out, float* k_cache, float* v_cache, float* scratch,
                              const float* qkv, int B, int T, int past, int maxT, int C,
                              int NH) override;
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
};

}  // namespace fleet::trainer
