#include "trainer/models/gpt_lora.h"

#include <glog/logging.h>

#include <cmath>

#include "comm/splitmix.h"

namespace fleet::trainer {

namespace {

constexpr std::array<LoraTarget, kLoraTargets> kAllTargets = {
    LoraTarget::kQkv, LoraTarget::kProj, LoraTarget::kFc, LoraTarget::kFcProj};

// Calls fn(layer, target, in, out) for every adapted matrix in table order.
template <typename Fn>
void ForEachAdapter(const GptConfig& c, Fn&& fn) {
  if (!c.lora.enabled()) return;
  for (int l = 0; l < c.num_layers; ++l) {
    for (LoraTarget t : kAllTargets) {
      if (!c.lora.targets_(t)) continue;
      const auto [in, out] = LoraTargetShape(c, t);
      fn(l, t, in, out);
    }
  }
}

}  // namespace

std::string_view LoraTargetName(LoraTarget target) {
  switch (target) {
    case LoraTarget::kQkv:
      return "qkv";
    case LoraTarget::kProj:
      return "proj";
    case LoraTarget::kFc:
      return "fc";
    case LoraTarget::kFcProj:
      return "fc_proj";
  }
  return "?";
}

GptTensor LoraBaseTensor(LoraTarget t) {
  switch (t) {
    case LoraTarget::kQkv:
      return GptTensor::kQkvW;
    case LoraTarget::kProj:
      return GptTensor::kProjW;
    case LoraTarget::kFc:
      return GptTensor::kFcW;
    case LoraTarget::kFcProj:
      return GptTensor::kFcProjW;
  }
  LOG(FATAL) << "unknown LoraTarget " << static_cast<int>(t);
}

std::array<int64_t, 2> LoraTargetShape(const GptConfig& c, LoraTarget t) {
  const int64_t C = c.hidden_size, F = c.ffn();
  switch (t) {
    case LoraTarget::kQkv:
      return {C, 3 * C};
    case LoraTarget::kProj:
      return {C, C};
    case LoraTarget::kFc:
      return {C, F};
    case LoraTarget::kFcProj:
      return {F, C};
  }
  LOG(FATAL) << "unknown LoraTarget " << static_cast<int>(t);
}

ParamTable GptLoraParamTable(const GptConfig& c) {
  ParamTable table;
  const int64_t r = c.lora.rank;
  ForEachAdapter(c, [&](int l, LoraTarget t, int64_t in, int64_t out) {
    // "h.3.attn.qkv.weight" -> "h.3.attn.qkv.lora_A".
    std::string base = GptTensorName(LoraBaseTensor(t), l);
    base.resize(base.size() - std::string_view("weight").size());
    table.push_back({base + "lora_A", Shape{r, in}});
    table.push_back({base + "lora_B", Shape{out, r}});
  });
  return table;
}

int64_t GptLoraParamCount(const GptConfig& c) {
  int64_t n = 0;
  ForEachAdapter(c, [&](int, LoraTarget, int64_t in, int64_t out) { n += c.lora.rank * (in + out); });
  return n;
}

Result<std::unique_ptr<GptLoraAdapters>> GptLoraAdapters::Create(const GptConfig& config,
                                                                 Backend* backend) {
  CHECK(config.lora.enabled());
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(GptLoraParamTable(config), backend));
  // A uniform in +-1/sqrt(in) (PEFT's kaiming_uniform(a = sqrt 5)), each
  // tensor from its own stream of the seed; B stays zero.
  std::vector<float> host;
  for (size_t i = 0; i < arena.num_tensors(); i += 2) {
    const Shape& shape = arena.table()[i].shape;
    host.resize(static_cast<size_t>(shape.numel()));
    const double bound = 1.0 / std::sqrt(static_cast<double>(shape[1]));
    SplitMix64 rng(Mix64(config.seed) ^ Mix64(0x6c6f72612d41ULL + i));
    for (float& v : host) v = static_cast<float>((2.0 * rng.UniformDouble() - 1.0) * bound);
    backend->CopyFromHost(arena.param(i).data(), host.data(), host.size() * sizeof(float));
  }
  return std::unique_ptr<GptLoraAdapters>(
      new GptLoraAdapters(config, backend, std::move(arena)));
}

GptLoraAdapters::GptLoraAdapters(const GptConfig& config, Backend* backend, ParamArena arena)
    : config_(config), backend_(backend), arena_(std::move(arena)) {
  for (LoraTarget t : kAllTargets) per_block_ += config_.lora.targets_(t) ? 2 : 0;
}

TensorRange GptLoraAdapters::BlockRange(int layer) const {
  const size_t first = static_cast<size_t>(layer) * per_block_;
  return {first, first + per_block_};
}

int GptLoraAdapters::Index(int layer, LoraTarget t) const {
  if (!config_.lora.targets_(t)) return -1;
  int index = layer * per_block_;
  for (LoraTarget before : kAllTargets) {
    if (before == t) break;
    index += config_.lora.targets_(before) ? 2 : 0;
  }
  return index;
}

void GptLoraAdapters::Forward(int layer, LoraTarget t, const float* inp, float* out, int N,
                              float* u) {
  const int i = Index(layer, t);
  if (i < 0) return;
  const auto [in, out_dim] = LoraTargetShape(config_, t);
  const int r = config_.lora.rank, IC = static_cast<int>(in), OC = static_cast<int>(out_dim);
  const float* A = arena_.param(i).data();
  const float* B = arena_.param(i + 1).data();
  // u [N, r] = inp [N, IC] A^T;  out [N, OC] += s u B^T.
  backend_->Gemm(false, true, N, r, IC, 1.0f, inp, A, 0.0f, u);
  backend_->Gemm(false, true, N, OC, r, config_.lora.scale(), u, B, 1.0f, out);
}

void GptLoraAdapters::Backward(int layer, LoraTarget t, const float* dout, const float* inp,
                               float* dinp, int N, float* u, float* du) {
  const int i = Index(layer, t);
  if (i < 0) return;
  const auto [in, out_dim] = LoraTargetShape(config_, t);
  const int r = config_.lora.rank, IC = static_cast<int>(in), OC = static_cast<int>(out_dim);
  const float s = config_.lora.scale();
  const float* A = arena_.param(i).data();
  const float* B = arena_.param(i + 1).data();
  float* dA = arena_.grad(i).data();
  float* dB = arena_.grad(i + 1).data();
  backend_->Gemm(false, true, N, r, IC, 1.0f, inp, A, 0.0f, u);    // u = inp A^T (recomputed)
  backend_->Gemm(true, false, OC, r, N, s, dout, u, 1.0f, dB);     // dB [OC, r] += s dout^T u
  backend_->Gemm(false, false, N, r, OC, s, dout, B, 0.0f, du);    // du [N, r] = s dout B
  backend_->Gemm(true, false, r, IC, N, 1.0f, du, inp, 1.0f, dA);  // dA [r, IC] += du^T inp
  backend_->Gemm(false, false, N, IC, r, 1.0f, du, A, 1.0f, dinp);  // dinp [N, IC] += du A
}

}  // namespace fleet::trainer
