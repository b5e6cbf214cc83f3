// GptKernels: the compute of a GPT-2 model, llm.c style: explicit forward and
// backward functions over raw pointers with explicit shapes. One interface,
// several twins:
//   * CpuGptKernels (gpt_cpu_kernels.h)  the optimised CPU kernels
//   * RefGptKernels (gpt_ref_kernels.h)  naive loops, the test oracle
//   * CudaGptKernels (gpt_cuda_kernels.h) the CUDA twin (flash attention);
//     gpt_kernels_factory.h picks a twin by device
// GptModel (trainer/models/gpt.h) and AdamW (trainer/models/adamw.h) hold a
// GptKernels* and never know which twin they drive.
//
// Shapes. B batch, T sequence length (T <= maxT, the position table's rows),
// C channels (hidden size), NH heads, hs = C / NH head size, F the MLP's
// hidden size, V vocabulary, N = B * T rows. Every buffer is contiguous,
// row-major, float32 unless said otherwise, and lives on device(); its shape
// is in the comment beside it. No kernel allocates.
//
// Conventions.
// * Forward kernels overwrite their outputs.
// * Backward kernels ADD into their gradient outputs (parameter gradients and
//   input gradients alike), which the caller zeroed before the step; so
//   gradient accumulation over micro-batches and tensors used twice (the tied
//   token embedding) need nothing special. The exceptions, GeluBackward and
//   DropoutBackward, overwrite (so that they can run in place), and say so.
// * Outputs never alias inputs unless a kernel says they may.
// * Token and target ids are validated by the caller (GptModel) first:
//   kernels REQUIRE ids in range and never check them.
// * Results are deterministic: the same inputs give the same bits on every
//   call (no atomics whose order varies, reductions in a fixed order).
//   Activation recompute relies on it: a recomputed block equals the first.
//
// What a CUDA twin must match.
// * Exactly these signatures, shapes and add/overwrite semantics, with every
//   pointer in device memory; kernels may run asynchronously on the twin's
//   stream, and SumOfSquares (which returns a host value) synchronises.
// * Values within the CPU twin's tolerance of the reference: |got - want| <=
//   1e-4 + 1e-3 |want| for float32 math, looser where it computes in bf16
//   (the test comparing twins states its tolerance per kernel).
// * The interface is float32 at its boundary (parameters are fp32 master
//   weights in the ParamArena). A twin may compute in bf16 inside a kernel
//   (cuBLAS GEMMs with CUBLAS_COMPUTE_32F_FAST_16BF, bf16 attention tiles)
//   as long as what it writes is float32. Storing activations in bf16 would
//   need an activation dtype on this interface; GptPlan already estimates
//   that case.
// * Attention: the twin chooses what it keeps between forward and backward
//   (AttentionSavedFloats). The CPU twin keeps the T x T probabilities per
//   head; a CUDA twin should keep only the B * NH * T row log-sum-exps and
//   never materialise T x T in global memory (flash attention); backward
//   gets the forward's output for that reason.
//
// Thread safety: a GptKernels object is used by one thread at a time (it may
// use more threads inside a call; see the twin's header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "trainer/tensor.h"

namespace fleet::trainer {

// The constants of one AdamW step over a range of parameters, computed on the
// host by AdamWRule (trainer/models/adamw.h) and applied element-wise:
//   g' = g * grad_scale
//   m  = beta1 * m + (1 - beta1) * g'
//   v  = beta2 * v + (1 - beta2) * g'^2
//   p -= lr * ((m / bias_correction1) / (sqrt(v / bias_correction2) + eps)
//              + weight_decay * p)
// with bias_correction{1,2} = 1 - beta{1,2}^t for step t >= 1 (PyTorch's
// AdamW; the decay term uses p before the update).
struct AdamWStep {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float bias_correction1 = 1.0f;
  float bias_correction2 = 1.0f;
  float grad_scale = 1.0f;  // e.g. the global-norm clipping factor
};

// LayerNorm's epsilon (GPT-2's and PyTorch's 1e-5).
inline constexpr float kLayerNormEps = 1e-5f;

// One dropout of the model (Srivastava et al. 2014) in FleetX's and
// PyTorch's "upscale in train" form: an element is kept with probability
// 1 - p and scaled by 1 / (1 - p), or dropped (0). Which elements are kept
// comes from the counter-based generator of philox.h: element e of sequence
// b is kept when philox::DropoutKeep(seed, site, streams[b], lane, e,
// DropoutThreshold(p)), where the lane is 0, or the global head index for
// attention. The mask is thus a function of the step (seed), the site and
// the sample alone: forward, backward and a recompute draw the same one
// without storing it, every twin draws the same bits, and a sample's mask
// does not depend on which rank, micro-batch or tensor-parallel part
// computes it.
struct DropoutSpec {
  float p = 0.0f;                     // in [0, 1); 0: off
  uint64_t seed = 0;                  // the step's key
  uint32_t site = 0;                  // which dropout of the model
  const uint32_t* streams = nullptr;  // [B] on device(): each sequence's stream (its sample)
  int head_offset = 0;                // attention: the global head index of the call's head 0
  bool enabled() const { return p > 0.0f; }
  float scale() const { return 1.0f / (1.0f - p); }  // a kept element's factor
};

class GptKernels {
 public:
  virtual ~GptKernels() = default;

  // Where every pointer passed to this twin lives.
  virtual Device device() const = 0;
  // "cpu", "cpu-reference", "cuda": for logs and test names.
  virtual std::string_view name() const = 0;

  // ---- token + position embedding --------------------------------------------
  // out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
  //   out: [B, T, C], tokens: int32 [B, T] in [0, V), wte: [V, C], wpe: [maxT, C]
  virtual void EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                              int B, int T, int C) = 0;
  // dwte[tokens[b, t], :] += dout[b, t, :];  dwpe[t, :] += sum_b dout[b, t, :].
  //   dwte: [V, C], dwpe: [maxT, C], dout: [B, T, C], tokens: int32 [B, T]
  virtual void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                               int B, int T, int C) = 0;

  // ---- LayerNorm over the last dim (eps kLayerNormEps) --------------------------
  // out = (inp - mean) * rstd * weight + bias, per row; mean and rstd =
  // 1 / sqrt(var + eps) (biased variance) are kept for backward.
  //   out, inp: [N, C], mean, rstd: [N], weight, bias: [C]
  virtual void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int N, int C) = 0;
  // dinp += d(out)/d(inp)^T dout; dweight += sum_rows dout * xhat; dbias += sum_rows dout.
  // dweight and dbias both null: frozen parameters (LoRA), only dinp.
  //   dinp, dout, inp: [N, C], dweight, dbias, weight: [C], mean, rstd: [N]
  virtual void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int N, int C) = 0;

  // ---- matmul (a Linear layer; weights in PyTorch's [out, in] layout) ----------
  // out = inp weight^T + bias, or out += that when `accumulate` (used to add a
  // projection onto the residual stream without another buffer).
  //   out: [N, OC], inp: [N, IC], weight: [OC, IC], bias: [OC] or null
  virtual void MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                             int N, int IC, int OC, bool accumulate) = 0;
  // dinp += dout weight;  dweight += dout^T inp;  dbias += sum_rows dout.
  //   dinp: [N, IC] or null (no input gradient wanted), dweight: [OC, IC] or
  //   null (a frozen weight, LoRA's base: its GEMM is skipped), dbias: [OC]
  //   or null, dout: [N, OC], inp: [N, IC], weight: [OC, IC]
  virtual void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int N, int IC, int OC) = 0;

  // ---- causal multi-head self-attention ------------------------------------------
  // qkv[b, t, :] = [q | k | v], each C wide, head h at columns [h hs, (h+1) hs).
  // out[b, t, h hs + d] = sum_{s <= t} softmax_s(q_t . k_s / sqrt(hs)) v_s[d].
  // With `dropout` enabled the probabilities are dropped out before they
  // weigh the values (FleetX's attention_probs_dropout_prob): element
  // t T + s of head h of sequence b (query t, key s <= t) has lane
  // dropout.head_offset + h. `saved` holds what backward needs (its layout
  // is the twin's own); `scratch` may be used (contents undefined after).
  //   out: [B, T, C], saved: [AttentionSavedFloats(B, T, NH)],
  //   scratch: [AttentionScratchFloats(B, T, NH)], qkv: [B, T, 3C]
  // REQUIRES: C % NH == 0.
  virtual size_t AttentionSavedFloats(int B, int T, int NH) const = 0;
  virtual void AttentionForward(float* out, float* saved, float* scratch, const float* qkv, int B,
                                int T, int C, int NH, const DropoutSpec& dropout) = 0;
  // dqkv += d(out)/d(qkv)^T dout, `dropout` the forward's. `scratch` is
  // overwritten (contents undefined after); `saved` and `out` are the
  // forward's and stay unchanged.
  //   dqkv, qkv: [B, T, 3C], scratch: [AttentionScratchFloats(B, T, NH)],
  //   dout, out: [B, T, C], saved: [AttentionSavedFloats(B, T, NH)]
  virtual size_t AttentionScratchFloats(int B, int T, int NH) const = 0;
  virtual void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                 const float* out, const float* saved, int B, int T, int C, int NH,
                                 const DropoutSpec& dropout) = 0;

  // ---- attention of new positions over a KV cache (generation) ---------------------
  // The T new positions of each sequence sit at positions [past, past + T);
  // the caches hold rows [0, past) from earlier calls. Appends the new keys
  // and values, then attends causally over everything cached:
  //   k_cache[b, past + t, :] = qkv[b, t, C:2C],  v_cache[b, past + t, :] = qkv[b, t, 2C:3C]
  //   out[b, t, h hs + d] = sum_{s <= past + t} softmax_s(q_t . k_s / sqrt(hs)) v_s[d]
  // with q_t = qkv[b, t, 0:C]. With past = 0 and T the whole sequence this is
  // AttentionForward's output. Rows [past + T, maxT) of the caches are left
  // unchanged. `scratch` is overwritten (contents undefined after; a twin may
  // not use it).
  //   out: [B, T, C], k_cache, v_cache: [B, maxT, C], qkv: [B, T, 3C],
  //   scratch: [B * NH * T * (past + T)]
  // REQUIRES: C % NH == 0, T >= 1, past >= 0, past + T <= maxT.
  virtual void AttentionDecodeForward(float* out, float* k_cache, float* v_cache, float* scratch,
                                      const float* qkv, int B, int T, int past, int maxT, int C,
                                      int NH) = 0;

  // ---- GELU, tanh approximation -------------------------------------------------
  // out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).   out, inp: [n]
  virtual void GeluForward(float* out, const float* inp, size_t n) = 0;
  // dinp = dout * gelu'(inp). OVERWRITES dinp (unlike other backward kernels);
  // dinp may be dout (in place).   dinp, inp, dout: [n]
  virtual void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) = 0;

  // ---- dropout (see DropoutSpec) --------------------------------------------------
  // out[b, i] = (residual ? residual[b, i] : 0) + (kept(b, i) ? inp[b, i] / (1 - p) : 0)
  // for the n elements i of each sequence b (the element index of the mask).
  // out may alias inp or residual.
  //   out, inp, residual: [B, n]. REQUIRES: dropout.enabled().
  virtual void DropoutForward(float* out, const float* inp, const float* residual, int B, size_t n,
                              const DropoutSpec& dropout) = 0;
  // dinp[b, i] = kept(b, i) ? dout[b, i] / (1 - p) : 0, the forward's mask.
  // OVERWRITES dinp (like GeluBackward), which may be dout (in place).
  //   dinp, dout: [B, n]. REQUIRES: dropout.enabled().
  virtual void DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                               const DropoutSpec& dropout) = 0;

  // ---- fused softmax + cross-entropy ----------------------------------------------
  // Per row i with targets[i] >= 0:
  //   losses[i] = logsumexp(logits[i, :]) - logits[i, targets[i]]
  //   and, when write_dlogits, logits[i, :] = dloss * (softmax(logits[i, :]) - onehot)
  // i.e. the logits are overwritten IN PLACE by the gradient of dloss * losses[i],
  // so no probability matrix exists beside them. Rows with targets[i] < 0
  // (ignored positions) get losses[i] = 0 and, when write_dlogits, a zero row.
  //   losses: [N], logits: [N, V], targets: int32 [N] in [-1, V)
  virtual void CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N,
                                   int V, float dloss, bool write_dlogits) = 0;

  // ---- vocabulary-parallel pieces (tensor parallelism, GptModel with mp > 1) ---------
  // A rank holds rows [v_begin, v_begin + V) of wte (V is the shard's row
  // count) and so the logits of those ids only. Token ids stay global.
  // out[b, t, :] = (tokens[b, t] in the shard ? wte[tokens[b, t] - v_begin, :] : 0)
  //                + (wpe ? wpe[t, :] : 0)
  //   out: [B, T, C], tokens: int32 [B, T], wte: [V, C], wpe: [maxT, C] or null
  virtual void EncoderShardForward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int B, int T, int C, int v_begin, int V) = 0;
  // dwte[tokens[b, t] - v_begin, :] += dout[b, t, :] for tokens in the shard;
  // dwpe[t, :] += sum_b dout[b, t, :].
  //   dwte: [V, C], dwpe: [maxT, C], dout: [B, T, C], tokens: int32 [B, T]
  virtual void EncoderShardBackward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int B, int T, int C, int v_begin,
                                    int V) = 0;
  // The softmax cross-entropy of logits split by columns over ranks, in three
  // passes with all-reduces between (GptModel does them):
  //   1. row_max[i] = max_c logits[i, c]                  (then the max over ranks)
  //   2. sums[i] = sum_c exp(logits[i, c] - row_max[i]);
  //      sums[N + i] = logits[i, targets[i] - v_begin] if the target is in the
  //      shard, else 0                                    (then the sum over ranks)
  //   3. losses[i] = log(sums[i]) + row_max[i] - sums[N + i], and, when
  //      write_dlogits, logits[i, :] = dloss * (exp(logits[i, :] - row_max[i]) /
  //      sums[i] - onehot) IN PLACE (the onehot only where the target is in the
  //      shard). Rows with targets[i] < 0 get losses[i] = 0 and a zero row.
  // With one rank (v_begin 0, the whole vocabulary) this is CrossEntropyForward.
  //   logits: [N, V], row_max, losses: [N], sums: [2 N], targets: int32 [N] in [-1, vocab)
  virtual void CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) = 0;
  virtual void CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                                     const int32_t* targets, int N, int V, int v_begin) = 0;
  virtual void CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                                       const float* sums, const int32_t* targets, int N, int V,
                                       int v_begin, float dloss, bool write_dlogits) = 0;

  // ---- optimizer pieces -------------------------------------------------------------
  // sum_i x[i]^2, accumulated in double; returned on the host (blocking).
  //   x: [n]
  virtual double SumOfSquares(const float* x, size_t n) = 0;
  // One AdamW step (see AdamWStep).   p, m, v: [n] updated; g: [n]
  virtual void AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                           const AdamWStep& step) = 0;
};

}  // namespace fleet::trainer
