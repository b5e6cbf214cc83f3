// Hugging Face GPT-2 checkpoints (a directory with model.safetensors and
// config.json, as `transformers` saves GPT2LMHeadModel) in and out of a
// GptModel's parameters: what gpt_convert and fine-tuning from
// Engine.init_from use.
//
// config.json -> GptConfig:
//   n_layer -> num_layers, n_head -> num_attention_heads, n_embd -> hidden_size,
//   n_positions (or n_ctx) -> max_position_embeddings, vocab_size,
//   n_inner (null: 4 n_embd) -> ffn_hidden_size.
// What GptModel cannot compute is refused with the key named:
//   activation_function other than gelu_new (GPT-2's tanh GELU),
//   layer_norm_epsilon other than 1e-5 (the kernels' kLayerNormEps),
//   tie_word_embeddings false, scale_attn_weights false,
//   scale_attn_by_inverse_layer_idx true, add_cross_attention true.
//
// model.safetensors tensor names (optionally prefixed "transformer."):
//   wte.weight [V, C], wpe.weight [P, C], ln_f.{weight,bias} [C],
//   h.N.ln_1.{weight,bias}, h.N.ln_2.{weight,bias} [C],
//   h.N.attn.c_attn.weight [C, 3C], h.N.attn.c_attn.bias [3C],
//   h.N.attn.c_proj.weight [C, C], h.N.attn.c_proj.bias [C],
//   h.N.mlp.c_fc.weight [C, F], h.N.mlp.c_fc.bias [F],
//   h.N.mlp.c_proj.weight [F, C], h.N.mlp.c_proj.bias [C].
// GPT-2's Conv1D stores weights [in, out]; GptModel's matrices are
// [out, in], so the four weight matrices are transposed each way. The
// buffers h.N.attn.bias and h.N.attn.masked_bias (the causal mask) are
// skipped; lm_head.weight is accepted only when equal to wte (tied). Any
// other tensor, a missing one or a wrong shape is InvalidArgument naming
// the tensor and both shapes. F32, F16 and BF16 tensors are read (into
// float32); writing picks one of the three for every tensor.
//
// Thread safety: free functions over their arguments.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "trainer/models/gpt.h"
#include "trainer/safetensors.h"

namespace fleet::trainer {

inline constexpr char kHfConfigFile[] = "config.json";
// The FleetPS checkpoint of a GPT in a directory: gpt_pretrain's task name
// "gpt" (collective/train_loop.h), params + optimizer state + step.
inline constexpr char kGptCheckpointFile[] = "gpt.ckpt";
inline constexpr char kHfWeightsFile[] = "model.safetensors";

// The model shape of a config.json (seed and initializer_range keep their
// defaults). NotFound / IOError for the file; InvalidArgument naming the
// file and key for a missing or wrong-typed key or a setting refused above.
Result<GptConfig> ReadHfGpt2Config(const std::string& path);

// config.json text for `config` (GPT2LMHeadModel, gelu_new, eps 1e-5, tied).
std::string HfGpt2ConfigJson(const GptConfig& config, SafetensorsDtype dtype);

// The parameters of `config`'s GptModel, host float32 in arena order
// (GptParamTable), read from a model.safetensors. Errors: the reader's, and
// InvalidArgument naming the tensor as described above.
Result<std::vector<float>> ReadHfGpt2Weights(const std::string& path, const GptConfig& config);

// Writes `params` (arena order for `config`) as a model.safetensors in
// GPT-2's names and layout, every tensor as `dtype`. IOError naming the file.
// REQUIRES: params.size() == GptParamCount-sized arena of `config`.
Status WriteHfGpt2Weights(const std::string& path, const GptConfig& config,
                          std::span<const float> params, SafetensorsDtype dtype);

struct HfGpt2Checkpoint {
  GptConfig config;
  std::vector<float> params;  // arena order
};

// <dir>/config.json and <dir>/model.safetensors together.
Result<HfGpt2Checkpoint> ReadHfGpt2Dir(const std::string& dir);
// Creates `dir` if needed and writes both files. IOError naming the file.
Status WriteHfGpt2Dir(const std::string& dir, const GptConfig& config,
                      std::span<const float> params, SafetensorsDtype dtype);

// OK when `hf` and `model` have the same shape (vocabulary, width, depth,
// heads, MLP width, positions); otherwise InvalidArgument naming the first
// differing Model.<key> with both values.
Status CheckSameGptShape(const GptConfig& hf, const GptConfig& model);

// The parameters of a pretrained model into `arena` (GptParamTable(config),
// any backend): `path` is a Hugging Face GPT-2 directory (it holds
// config.json, whose shape must equal `config`'s) or a FleetPS checkpoint
// (a directory holding gpt.ckpt, or the file; its optimizer state is
// skipped). Errors: NotFound naming both files looked for; those of the
// readers; InvalidArgument from CheckSameGptShape; FailedPrecondition from
// LoadCheckpointParams for a checkpoint of another shape. The arena is
// unchanged on error.
Status LoadPretrainedGpt(const std::string& path, const GptConfig& config, ParamArena* arena);

// The file holding the weights LoadPretrainedGpt reads from `path`: a
// Hugging Face directory's model.safetensors, a directory's gpt.ckpt, or
// `path` itself. Does not check that it exists.
std::string PretrainedWeightsFile(const std::string& path);

// gpt_convert's two directions. HF directory -> <ckpt_dir>/gpt.ckpt
// (parameters only; gpt_generate and Engine.init_from read it), returning
// the model's shape; and <ckpt_dir>/gpt.ckpt (or the file) of a model of
// `config`'s shape -> HF directory with every tensor as `dtype`. Errors:
// those of the readers and writers, each naming its file.
Result<GptConfig> ConvertHfToCheckpoint(const std::string& hf_dir, const std::string& ckpt_dir);
Status ConvertCheckpointToHf(const std::string& ckpt_path, const GptConfig& config,
                             const std::string& hf_dir, SafetensorsDtype dtype);

}  // namespace fleet::trainer
