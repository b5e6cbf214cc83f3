#include "trainer/kernels/gpt_ref_kernels.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "trainer/kernels/philox.h"

namespace fleet::trainer::kernels::gpt_ref {

namespace {

constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

}  // namespace

double DropoutFactor(const DropoutSpec& d, int b, int lane, uint64_t index) {
  if (!d.enabled()) return 1.0;
  const bool kept = philox::DropoutKeep(d.seed, d.site, d.streams[b], static_cast<uint32_t>(lane),
                                        index, philox::DropoutThreshold(d.p));
  return kept ? 1.0 / (1.0 - double{d.p}) : 0.0;
}

template <typename F>
void DropoutForward(F* out, const F* inp, const F* residual, int B, size_t n,
                    const DropoutSpec& dropout) {
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < n; ++i) {
      const size_t at = size_t(b) * n + i;
      const double r = residual != nullptr ? double{residual[at]} : 0.0;
      out[at] = static_cast<F>(r + DropoutFactor(dropout, b, 0, i) * inp[at]);
    }
  }
}

template <typename F>
void DropoutBackward(F* dinp, const F* dout, int B, size_t n, const DropoutSpec& dropout) {
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < n; ++i) {
      const size_t at = size_t(b) * n + i;
      dinp[at] = static_cast<F>(DropoutFactor(dropout, b, 0, i) * dout[at]);
    }
  }
}

template <typename F>
void EncoderForward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T,
                    int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      F* o = out + (int64_t{b} * T + t) * C;
      const F* we = wte + int64_t{tokens[b * T + t]} * C;
      const F* pe = wpe + int64_t{t} * C;
      for (int c = 0; c < C; ++c) o[c] = we[c] + pe[c];
    }
  }
}

template <typename F>
void EncoderBackward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const F* d = dout + (int64_t{b} * T + t) * C;
      F* dwe = dwte + int64_t{tokens[b * T + t]} * C;
      F* dpe = dwpe + int64_t{t} * C;
      for (int c = 0; c < C; ++c) {
        dwe[c] += d[c];
        dpe[c] += d[c];
      }
    }
  }
}

template <typename F>
void LayerNormForward(F* out, F* mean, F* rstd, const F* inp, const F* weight, const F* bias, int N,
                      int C) {
  for (int i = 0; i < N; ++i) {
    const F* x = inp + int64_t{i} * C;
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + double{kLayerNormEps});
    F* o = out + int64_t{i} * C;
    for (int c = 0; c < C; ++c) o[c] = static_cast<F>((x[c] - m) * s * weight[c] + bias[c]);
    mean[i] = static_cast<F>(m);
    rstd[i] = static_cast<F>(s);
  }
}

template <typename F>
void LayerNormBackward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                       const F* mean, const F* rstd, int N, int C) {
  for (int i = 0; i < N; ++i) {
    const F* x = inp + int64_t{i} * C;
    const F* d = dout + int64_t{i} * C;
    F* dx = dinp + int64_t{i} * C;
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int c = 0; c < C; ++c) {
      const double norm = (double{x[c]} - mean[i]) * rstd[i];
      const double dnorm = double{weight[c]} * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const double norm = (double{x[c]} - mean[i]) * rstd[i];
      const double dnorm = double{weight[c]} * d[c];
      if (dweight != nullptr) {
        dbias[c] += d[c];
        dweight[c] += static_cast<F>(norm * d[c]);
      }
      dx[c] += static_cast<F>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[i]);
    }
  }
}

template <typename F>
void MatmulForward(F* out, const F* inp, const F* weight, const F* bias, int N, int IC, int OC,
                   bool accumulate) {
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OC; ++o) {
      double acc = bias ? double{bias[o]} : 0.0;
      for (int k = 0; k < IC; ++k)
        acc += double{inp[int64_t{i} * IC + k]} * weight[int64_t{o} * IC + k];
      F& y = out[int64_t{i} * OC + o];
      y = static_cast<F>(accumulate ? y + acc : acc);
    }
  }
}

template <typename F>
void MatmulBackward(F* dinp, F* dweight, F* dbias, const F* dout, const F* inp, const F* weight,
                    int N, int IC, int OC) {
  if (dinp) {
    for (int i = 0; i < N; ++i) {
      for (int k = 0; k < IC; ++k) {
        double acc = 0.0;
        for (int o = 0; o < OC; ++o)
          acc += double{dout[int64_t{i} * OC + o]} * weight[int64_t{o} * IC + k];
        dinp[int64_t{i} * IC + k] += static_cast<F>(acc);
      }
    }
  }
  for (int o = 0; o < OC && dweight != nullptr; ++o) {
    for (int k = 0; k < IC; ++k) {
      double acc = 0.0;
      for (int i = 0; i < N; ++i)
        acc += double{dout[int64_t{i} * OC + o]} * inp[int64_t{i} * IC + k];
      dweight[int64_t{o} * IC + k] += static_cast<F>(acc);
    }
    if (dbias) {
      double acc = 0.0;
      for (int i = 0; i < N; ++i) acc += dout[int64_t{i} * OC + o];
      dbias[o] += static_cast<F>(acc);
    }
  }
}

template <typename F>
void AttentionForward(F* out, F* saved, const F* qkv, int B, int T, int C, int NH,
                      const DropoutSpec& dropout) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const F* q = qkv + (int64_t{b} * T + t) * 3 * C + h * hs;
        F* p = saved + ((int64_t{b} * NH + h) * T + t) * T;
        double maxv = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          const F* k = qkv + (int64_t{b} * T + s) * 3 * C + C + h * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += double{q[d]} * k[d];
          p[s] = static_cast<F>(dot * scale);
          maxv = std::max(maxv, double{p[s]});
        }
        double sum = 0.0;
        for (int s = 0; s <= t; ++s) sum += std::exp(double{p[s]} - maxv);
        for (int s = 0; s < T; ++s) {
          p[s] = s <= t ? static_cast<F>(std::exp(double{p[s]} - maxv) / sum) : F{0};
        }
        F* o = out + (int64_t{b} * T + t) * C + h * hs;
        for (int d = 0; d < hs; ++d) {
          double acc = 0.0;
          for (int s = 0; s <= t; ++s) {
            const double kept =
                DropoutFactor(dropout, b, dropout.head_offset + h, uint64_t(t) * T + s);
            acc += double{p[s]} * kept * qkv[(int64_t{b} * T + s) * 3 * C + 2 * C + h * hs + d];
          }
          o[d] = static_cast<F>(acc);
        }
      }
    }
  }
}

template <typename F>
void AttentionBackward(F* dqkv, F* scratch, const F* dout, const F* qkv, const F* saved, int B,
                       int T, int C, int NH, const DropoutSpec& dropout) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const int64_t row = (int64_t{b} * NH + h) * T + t;
        const F* p = saved + row * T;
        F* dp = scratch + row * T;
        const F* dO = dout + (int64_t{b} * T + t) * C + h * hs;
        // With the mask's factors k[s] (0 or 1 / (1 - p); 1 without dropout):
        // dp[s] = k[s] dO . v_s;  dv_s += p[s] k[s] dO.
        for (int s = 0; s <= t; ++s) {
          const int64_t vs = (int64_t{b} * T + s) * 3 * C + 2 * C + h * hs;
          const double kept =
              DropoutFactor(dropout, b, dropout.head_offset + h, uint64_t(t) * T + s);
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) {
            dot += double{dO[d]} * qkv[vs + d];
            dqkv[vs + d] += static_cast<F>(double{p[s]} * kept * dO[d]);
          }
          dp[s] = static_cast<F>(kept * dot);
        }
        // Softmax backward, then through q . k * scale.
        double pdp = 0.0;
        for (int s = 0; s <= t; ++s) pdp += double{p[s]} * dp[s];
        const int64_t qt = (int64_t{b} * T + t) * 3 * C + h * hs;
        for (int s = 0; s <= t; ++s) {
          const double ds = double{p[s]} * (dp[s] - pdp) * scale;
          const int64_t ks = (int64_t{b} * T + s) * 3 * C + C + h * hs;
          for (int d = 0; d < hs; ++d) {
            dqkv[qt + d] += static_cast<F>(ds * qkv[ks + d]);
            dqkv[ks + d] += static_cast<F>(ds * qkv[qt + d]);
          }
        }
      }
    }
  }
}

template <typename F>
void GeluForward(F* out, const F* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = static_cast<F>(0.5 * x * (1.0 + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x))));
  }
}

template <typename F>
void GeluBackward(F* dinp, const F* inp, const F* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double th = std::tanh(kGeluScale * (x + kGeluCubic * x * x * x));
    const double grad = 0.5 * (1.0 + th) +
                        0.5 * x * (1.0 - th * th) * kGeluScale * (1.0 + 3.0 * kGeluCubic * x * x);
    dinp[i] = static_cast<F>(grad * dout[i]);
  }
}

template <typename F>
void CrossEntropyForward(F* losses, F* logits, const int32_t* targets, int N, int V, F dloss,
                         bool write_dlogits) {
  for (int i = 0; i < N; ++i) {
    F* z = logits + int64_t{i} * V;
    if (targets[i] < 0) {
      losses[i] = F{0};
      if (write_dlogits) std::fill(z, z + V, F{0});
      continue;
    }
    double maxv = -INFINITY;
    for (int c = 0; c < V; ++c) maxv = std::max(maxv, double{z[c]});
    double sum = 0.0;
    for (int c = 0; c < V; ++c) sum += std::exp(double{z[c]} - maxv);
    const double lse = std::log(sum) + maxv;
    losses[i] = static_cast<F>(lse - z[targets[i]]);
    if (write_dlogits) {
      for (int c = 0; c < V; ++c) {
        const double p = std::exp(double{z[c]} - lse);
        z[c] = static_cast<F>(double{dloss} * (p - (c == targets[i] ? 1.0 : 0.0)));
      }
    }
  }
}

void EncoderShardForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int B, int T, int C, int v_begin, int V) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (int64_t{b} * T + t) * C;
      const int64_t row = int64_t{tokens[b * T + t]} - v_begin;
      for (int c = 0; c < C; ++c) {
        const float we = row >= 0 && row < V ? wte[row * C + c] : 0.0f;
        o[c] = we + (wpe != nullptr ? wpe[int64_t{t} * C + c] : 0.0f);
      }
    }
  }
}

void EncoderShardBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                          int T, int C, int v_begin, int V) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (int64_t{b} * T + t) * C;
      const int64_t row = int64_t{tokens[b * T + t]} - v_begin;
      for (int c = 0; c < C; ++c) {
        if (row >= 0 && row < V) dwte[row * C + c] += d[c];
        dwpe[int64_t{t} * C + c] += d[c];
      }
    }
  }
}

void CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) {
  for (int i = 0; i < N; ++i) {
    float m = -INFINITY;
    for (int c = 0; c < V; ++c) m = std::max(m, logits[int64_t{i} * V + c]);
    row_max[i] = m;
  }
}

void CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                           const int32_t* targets, int N, int V, int v_begin) {
  for (int i = 0; i < N; ++i) {
    const float* z = logits + int64_t{i} * V;
    double sum = 0.0;
    for (int c = 0; c < V; ++c) sum += std::exp(double{z[c]} - row_max[i]);
    const int64_t target = int64_t{targets[i]} - v_begin;
    sums[i] = static_cast<float>(sum);
    sums[N + i] = targets[i] >= 0 && target >= 0 && target < V ? z[target] : 0.0f;
  }
}

void CrossEntropyShardFinish(float* losses, float* logits, const float* row_max, const float* sums,
                             const int32_t* targets, int N, int V, int v_begin, float dloss,
                             bool write_dlogits) {
  for (int i = 0; i < N; ++i) {
    float* z = logits + int64_t{i} * V;
    if (targets[i] < 0) {
      losses[i] = 0.0f;
      if (write_dlogits) std::fill(z, z + V, 0.0f);
      continue;
    }
    const double lse = std::log(double{sums[i]}) + row_max[i];
    losses[i] = static_cast<float>(lse - sums[N + i]);
    if (!write_dlogits) continue;
    const int64_t target = int64_t{targets[i]} - v_begin;
    for (int c = 0; c < V; ++c) {
      const double p = std::exp(double{z[c]} - lse);
      z[c] = static_cast<float>(double{dloss} * (p - (c == target ? 1.0 : 0.0)));
    }
  }
}

double SumOfSquares(const float* x, size_t n) {
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) acc += double{x[i]} * x[i];
  return acc;
}

void AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s) {
  for (size_t i = 0; i < n; ++i) {
    const double gi = double{g[i]} * s.grad_scale;
    const double mi = double{s.beta1} * m[i] + (1.0 - s.beta1) * gi;
    const double vi = double{s.beta2} * v[i] + (1.0 - s.beta2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double mhat = mi / s.bias_correction1;
    const double vhat = vi / s.bias_correction2;
    p[i] = static_cast<float>(
        p[i] - double{s.lr} * (mhat / (std::sqrt(vhat) + s.eps) + double{s.weight_decay} * p[i]));
  }
}

#define FLEET_GPT_REF_INSTANTIATE(F)                                                               \
  template void EncoderForward<F>(F*, const int32_t*, const F*, const F*, int, int, int);          \
  template void EncoderBackward<F>(F*, F*, const F*, const int32_t*, int, int, int);               \
  template void LayerNormForward<F>(F*, F*, F*, const F*, const F*, const F*, int, int);           \
  template void LayerNormBackward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, \
                                     int, int);                                                    \
  template void MatmulForward<F>(F*, const F*, const F*, const F*, int, int, int, bool);           \
  template void MatmulBackward<F>(F*, F*, F*, const F*, const F*, const F*, int, int, int);        \
  template void AttentionForward<F>(F*, F*, const F*, int, int, int, int, const DropoutSpec&);     \
  template void AttentionBackward<F>(F*, F*, const F*, const F*, const F*, int, int, int, int,     \
                                     const DropoutSpec&);                                          \
  template void DropoutForward<F>(F*, const F*, const F*, int, size_t, const DropoutSpec&);        \
  template void DropoutBackward<F>(F*, const F*, int, size_t, const DropoutSpec&);                 \
  template void GeluForward<F>(F*, const F*, size_t);                                              \
  template void GeluBackward<F>(F*, const F*, const F*, size_t);                                   \
  template void CrossEntropyForward<F>(F*, F*, const int32_t*, int, int, F, bool);

FLEET_GPT_REF_INSTANTIATE(float)
FLEET_GPT_REF_INSTANTIATE(double)
#undef FLEET_GPT_REF_INSTANTIATE

}  // namespace fleet::trainer::kernels::gpt_ref

namespace fleet::trainer {

namespace ref = kernels::gpt_ref;

void RefGptKernels::EncoderForward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int B, int T, int C) {
  ref::EncoderForward(out, tokens, wte, wpe, B, T, C);
}
void RefGptKernels::EncoderBackward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int B, int T, int C) {
  ref::EncoderBackward(dwte, dwpe, dout, tokens, B, T, C);
}
void RefGptKernels::LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* weight, const float* bias, int N, int C) {
  ref::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C);
}
void RefGptKernels::LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                      const float* inp, const float* weight, const float* mean,
                                      const float* rstd, int N, int C) {
  ref::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
void RefGptKernels::MatmulForward(float* out, const float* inp, const float* weight,
                                  const float* bias, int N, int IC, int OC, bool accumulate) {
  ref::MatmulForward(out, inp, weight, bias, N, IC, OC, accumulate);
}
void RefGptKernels::MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                   const float* inp, const float* weight, int N, int IC, int OC) {
  ref::MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}
size_t RefGptKernels::AttentionSavedFloats(int B, int T, int NH) const {
  return size_t(B) * NH * T * T;
}
void RefGptKernels::AttentionForward(float* out, float* saved, float* /*scratch*/, const float* qkv,
                                     int B, int T, int C, int NH, const DropoutSpec& dropout) {
  ref::AttentionForward(out, saved, qkv, B, T, C, NH, dropout);
}
size_t RefGptKernels::AttentionScratchFloats(int B, int T, int NH) const {
  return size_t(B) * NH * T * T;
}
void RefGptKernels::AttentionBackward(float* dqkv, float* scratch, const float* dout,
                                      const float* qkv, const float* /*out*/, const float* saved,
                                      int B, int T, int C, int NH, const DropoutSpec& dropout) {
  ref::AttentionBackward(dqkv, scratch, dout, qkv, saved, B, T, C, NH, dropout);
}
void RefGptKernels::DropoutForward(float* out, const float* inp, const float* residual, int B,
                                   size_t n, const DropoutSpec& dropout) {
  ref::DropoutForward(out, inp, residual, B, n, dropout);
}
void RefGptKernels::DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                                    const DropoutSpec& dropout) {
  ref::DropoutBackward(dinp, dout, B, n, dropout);
}
void RefGptKernels::AttentionDecodeForward(float* out, float* k_cache, float* v_cache,
                                           float* scratch, const float* qkv, int B, int T, int past,
                                           int maxT, int C, int NH) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* row = qkv + (int64_t{b} * T + t) * 3 * C;
      const int64_t dst = (int64_t{b} * maxT + past + t) * C;
      for (int c = 0; c < C; ++c) {
        k_cache[dst + c] = row[C + c];
        v_cache[dst + c] = row[2 * C + c];
      }
    }
  }
  const int hs = C / NH, S = past + T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + (int64_t{b} * T + t) * 3 * C + h * hs;
        float* p = scratch + ((int64_t{b} * NH + h) * T + t) * S;
        const int len = past + t + 1;  // keys this query sees
        double maxv = -INFINITY;
        for (int s = 0; s < len; ++s) {
          const float* k = k_cache + (int64_t{b} * maxT + s) * C + h * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += double{q[d]} * k[d];
          p[s] = static_cast<float>(dot * scale);
          maxv = std::max(maxv, double{p[s]});
        }
        double sum = 0.0;
        for (int s = 0; s < len; ++s) sum += std::exp(double{p[s]} - maxv);
        for (int s = 0; s < len; ++s)
          p[s] = static_cast<float>(std::exp(double{p[s]} - maxv) / sum);
        float* o = out + (int64_t{b} * T + t) * C + h * hs;
        for (int d = 0; d < hs; ++d) {
          double acc = 0.0;
          for (int s = 0; s < len; ++s)
            acc += double{p[s]} * v_cache[(int64_t{b} * maxT + s) * C + h * hs + d];
          o[d] = static_cast<float>(acc);
        }
      }
    }
  }
}
void RefGptKernels::GeluForward(float* out, const float* inp, size_t n) {
  ref::GeluForward(out, inp, n);
}
void RefGptKernels::GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) {
  ref::GeluBackward(dinp, inp, dout, n);
}
void RefGptKernels::EncoderShardForward(float* out, const int32_t* tokens, const float* wte,
                                        const float* wpe, int B, int T, int C, int v_begin, int V) {
  ref::EncoderShardForward(out, tokens, wte, wpe, B, T, C, v_begin, V);
}
void RefGptKernels::EncoderShardBackward(float* dwte, float* dwpe, const float* dout,
                                         const int32_t* tokens, int B, int T, int C, int v_begin,
                                         int V) {
  ref::EncoderShardBackward(dwte, dwpe, dout, tokens, B, T, C, v_begin, V);
}
void RefGptKernels::CrossEntropyShardMax(float* row_max, const float* logits, int N, int V) {
  ref::CrossEntropyShardMax(row_max, logits, N, V);
}
void RefGptKernels::CrossEntropyShardSums(float* sums, const float* logits, const float* row_max,
                                          const int32_t* targets, int N, int V, int v_begin) {
  ref::CrossEntropyShardSums(sums, logits, row_max, targets, N, V, v_begin);
}
void RefGptKernels::CrossEntropyShardFinish(float* losses, float* logits, const float* row_max,
                                            const float* sums, const int32_t* targets, int N, int V,
                                            int v_begin, float dloss, bool write_dlogits) {
  ref::CrossEntropyShardFinish(losses, logits, row_max, sums, targets, N, V, v_begin, dloss,
                               write_dlogits);
}
void RefGptKernels::CrossEntropyForward(float* losses, float* logits, const int32_t* targets, int N,
                                        int V, float dloss, bool write_dlogits) {
  ref::CrossEntropyForward(losses, logits, targets, N, V, dloss, write_dlogits);
}
double RefGptKernels::SumOfSquares(const float* x, size_t n) { return ref::SumOfSquares(x, n); }
void RefGptKernels::AdamWUpdate(float* p, const float* g, float* m, float* v, size_t n,
                                const AdamWStep& step) {
  ref::AdamWUpdate(p, g, m, v, n, step);
}

}  // namespace fleet::trainer
