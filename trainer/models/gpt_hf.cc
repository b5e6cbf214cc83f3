#include "trainer/models/gpt_hf.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "comm/file_io.h"
#include "trainer/optimizer.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::trainer {
namespace {

// GPT-2's name of a GptModel tensor, and whether its matrix is stored
// transposed (Conv1D's [in, out]).
struct HfTensor {
  std::string name;
  bool transposed = false;
};

HfTensor HfName(GptTensor tensor, int layer) {
  const std::string h = "h." + std::to_string(layer) + ".";
  switch (tensor) {
    case GptTensor::kWte:
      return {"wte.weight"};
    case GptTensor::kWpe:
      return {"wpe.weight"};
    case GptTensor::kLn1W:
      return {h + "ln_1.weight"};
    case GptTensor::kLn1B:
      return {h + "ln_1.bias"};
    case GptTensor::kQkvW:
      return {h + "attn.c_attn.weight", true};
    case GptTensor::kQkvB:
      return {h + "attn.c_attn.bias"};
    case GptTensor::kProjW:
      return {h + "attn.c_proj.weight", true};
    case GptTensor::kProjB:
      return {h + "attn.c_proj.bias"};
    case GptTensor::kLn2W:
      return {h + "ln_2.weight"};
    case GptTensor::kLn2B:
      return {h + "ln_2.bias"};
    case GptTensor::kFcW:
      return {h + "mlp.c_fc.weight", true};
    case GptTensor::kFcB:
      return {h + "mlp.c_fc.bias"};
    case GptTensor::kFcProjW:
      return {h + "mlp.c_proj.weight", true};
    case GptTensor::kFcProjB:
      return {h + "mlp.c_proj.bias"};
    case GptTensor::kLnfW:
      return {"ln_f.weight"};
    case GptTensor::kLnfB:
      return {"ln_f.bias"};
  }
  LOG(FATAL) << "unknown GptTensor";
}

// out[c, r] = in[r, c] for an in of rows x cols.
void Transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

// The causal-mask buffers older GPT-2 checkpoints carry: not parameters.
bool IsMaskBuffer(std::string_view name) {
  return name.starts_with("h.") &&
         (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
}

Result<int> PositiveInt(const nlohmann::json& doc, const std::string& key,
                        const std::string& path) {
  const auto it = doc.find(key);
  if (it == doc.end()) return Status::InvalidArgument("config.json has no \"" + key + "\"", path);
  if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 30)) {
    return Status::InvalidArgument("config.json's \"" + key + "\" must be a positive integer",
                                   path);
  }
  return static_cast<int>(it->get<int64_t>());
}

}  // namespace

Result<GptConfig> ReadHfGpt2Config(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<data::InputFile> file, data::InputFile::Open(path));
  FLEET_ASSIGN_OR_RETURN(std::string text, file->ReadAll());
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::InvalidArgument("config.json is not a JSON object", path);
  }
  // Settings GptModel does not compute, refused rather than silently
  // giving other logits.
  const auto refuse = [&](const std::string& key, const std::string& why) {
    return Status::InvalidArgument(
        absl::StrCat("config.json's \"", key, "\" is ", doc[key].dump(), ": ", why), path);
  };
  if (doc.contains("activation_function") && doc["activation_function"] != "gelu_new") {
    return refuse("activation_function",
                  "only gelu_new (GPT-2's tanh GELU) is supported by FleetPS's GPT");
  }
  if (doc.contains("layer_norm_epsilon")) {
    const nlohmann::json& eps = doc["layer_norm_epsilon"];
    if (!eps.is_number() || std::abs(eps.get<double>() - kLayerNormEps) > 1e-3 * kLayerNormEps) {
      return refuse("layer_norm_epsilon", "FleetPS's LayerNorm uses GPT-2's 1e-05");
    }
  }
  if (doc.contains("tie_word_embeddings") && doc["tie_word_embeddings"] == false) {
    return refuse("tie_word_embeddings", "FleetPS's GPT ties the output layer to wte");
  }
  if (doc.contains("scale_attn_weights") && doc["scale_attn_weights"] == false) {
    return refuse("scale_attn_weights", "attention is always scaled by 1/sqrt(head size)");
  }
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"}) {
    if (doc.contains(key) && doc[key] == true) return refuse(key, "not supported");
  }
  GptConfig c;
  FLEET_ASSIGN_OR_RETURN(c.num_layers, PositiveInt(doc, "n_layer", path));
  FLEET_ASSIGN_OR_RETURN(c.num_attention_heads, PositiveInt(doc, "n_head", path));
  FLEET_ASSIGN_OR_RETURN(c.hidden_size, PositiveInt(doc, "n_embd", path));
  FLEET_ASSIGN_OR_RETURN(c.vocab_size, PositiveInt(doc, "vocab_size", path));
  FLEET_ASSIGN_OR_RETURN(
      c.max_position_embeddings,
      PositiveInt(doc, doc.contains("n_positions") ? "n_positions" : "n_ctx", path));
  c.ffn_hidden_size = 0;
  if (doc.contains("n_inner") && !doc["n_inner"].is_null()) {
    FLEET_ASSIGN_OR_RETURN(c.ffn_hidden_size, PositiveInt(doc, "n_inner", path));
  }
  Status valid = c.Validate();
  if (!valid.ok()) return valid.WithContext("config.json " + path);
  return c;
}

std::string HfGpt2ConfigJson(const GptConfig& c, SafetensorsDtype dtype) {
  nlohmann::ordered_json doc = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"activation_function", "gelu_new"},
      {"n_layer", c.num_layers},
      {"n_head", c.num_attention_heads},
      {"n_embd", c.hidden_size},
      {"n_positions", c.max_position_embeddings},
      {"n_ctx", c.max_position_embeddings},
      {"vocab_size", c.vocab_size},
      {"n_inner", nullptr},
      {"layer_norm_epsilon", kLayerNormEps},
      {"tie_word_embeddings", true},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", c.initializer_range},
      {"torch_dtype", dtype == SafetensorsDtype::kF32   ? "float32"
                      : dtype == SafetensorsDtype::kF16 ? "float16"
                                                        : "bfloat16"},
  };
  if (c.ffn_hidden_size > 0) doc["n_inner"] = c.ffn_hidden_size;
  // GPT-2's end-of-text id, when the vocabulary holds it.
  if (c.vocab_size > 50256) {
    doc["bos_token_id"] = 50256;
    doc["eos_token_id"] = 50256;
  }
  return doc.dump(2) + "\n";
}

Result<std::vector<float>> ReadHfGpt2Weights(const std::string& path, const GptConfig& config) {
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader, SafetensorsReader::Open(path));
  // "transformer." when the file was saved from GPT2LMHeadModel's state dict.
  const std::string prefix =
      reader->Find("transformer.wte.weight") != nullptr ? "transformer." : "";
  std::set<std::string> expected;
  ForEachGptTensor(config, [&](GptTensor t, int layer, int64_t, int64_t) {
    expected.insert(prefix + HfName(t, layer).name);
  });
  const std::string lm_head = "lm_head.weight";
  for (const SafetensorsTensor& t : reader->tensors()) {
    std::string_view bare = t.name;
    if (bare.starts_with(prefix)) bare.remove_prefix(prefix.size());
    if (expected.count(t.name) || t.name == lm_head || IsMaskBuffer(bare)) continue;
    return Status::InvalidArgument(
        absl::StrCat("tensor '", t.name, "' is not part of a GPT-2 with ", config.num_layers,
                     " layers (config.json's n_layer), or not a GPT-2 tensor"),
        path);
  }

  std::vector<float> params;
  params.reserve(static_cast<size_t>(GptParamCount(config)));
  std::vector<float> buffer;
  Status status;
  ForEachGptTensor(config, [&](GptTensor tensor, int layer, int64_t rows, int64_t cols) {
    if (!status.ok()) return;
    const HfTensor hf = HfName(tensor, layer);
    const std::string name = prefix + hf.name;
    const SafetensorsTensor* t = reader->Find(name);
    if (t == nullptr) {
      status = Status::InvalidArgument(
          absl::StrCat("tensor '", name, "' is missing (config.json's shape needs it)"), path);
      return;
    }
    std::vector<int64_t> want = cols == 0       ? std::vector<int64_t>{rows}
                                : hf.transposed ? std::vector<int64_t>{cols, rows}
                                                : std::vector<int64_t>{rows, cols};
    if (t->shape != want) {
      status = Status::InvalidArgument(
          absl::StrCat("tensor '", name, "' has shape ", ShapeText(t->shape), " but config.json (",
                       config.num_layers, " layers, n_embd ", config.hidden_size, ", vocab ",
                       config.vocab_size, ", ", config.max_position_embeddings,
                       " positions) needs ", ShapeText(want)),
          path);
      return;
    }
    const size_t n = static_cast<size_t>(t->num_elements());
    buffer.resize(n);
    status = reader->ReadFloats(*t, buffer);
    if (!status.ok()) return;
    const size_t at = params.size();
    params.resize(at + n);
    if (hf.transposed) {
      Transpose(buffer.data(), cols, rows, params.data() + at);
    } else {
      std::copy(buffer.begin(), buffer.end(), params.begin() + at);
    }
  });
  FLEET_RETURN_IF_ERROR(status);
  if (const SafetensorsTensor* head = reader->Find(lm_head)) {
    const int64_t wte_floats = static_cast<int64_t>(config.vocab_size) * config.hidden_size;
    bool tied = head->num_elements() == wte_floats;
    if (tied) {
      buffer.resize(wte_floats);
      FLEET_RETURN_IF_ERROR(reader->ReadFloats(*head, buffer));
      tied = std::equal(buffer.begin(), buffer.end(), params.begin());
    }
    if (!tied) {
      return Status::InvalidArgument(
          "lm_head.weight differs from wte.weight: FleetPS's GPT ties the output layer to the "
          "token embedding and cannot load an untied head",
          path);
    }
  }
  return params;
}

Status WriteHfGpt2Weights(const std::string& path, const GptConfig& config,
                          std::span<const float> params, SafetensorsDtype dtype) {
  // Transposed copies of the Conv1D matrices live here until the write.
  // (Moving the inner vectors when `transposed` grows keeps their buffers,
  // so the entries' spans stay valid.)
  std::vector<std::vector<float>> transposed;
  std::vector<SafetensorsEntry> entries;
  size_t at = 0;
  ForEachGptTensor(config, [&](GptTensor tensor, int layer, int64_t rows, int64_t cols) {
    const HfTensor hf = HfName(tensor, layer);
    const size_t n = static_cast<size_t>(rows * (cols == 0 ? 1 : cols));
    CHECK_LE(at + n, params.size());
    SafetensorsEntry e;
    e.name = hf.name;
    if (cols == 0) {
      e.shape = {rows};
      e.values = params.subspan(at, n);
    } else if (hf.transposed) {
      e.shape = {cols, rows};
      transposed.emplace_back(n);
      Transpose(params.data() + at, rows, cols, transposed.back().data());
      e.values = transposed.back();
    } else {
      e.shape = {rows, cols};
      e.values = params.subspan(at, n);
    }
    entries.push_back(std::move(e));
    at += n;
  });
  CHECK_EQ(at, params.size());
  return WriteSafetensors(path, entries, dtype, {{"format", "pt"}});
}

Result<HfGpt2Checkpoint> ReadHfGpt2Dir(const std::string& dir) {
  const std::filesystem::path d(dir);
  HfGpt2Checkpoint ckpt;
  FLEET_ASSIGN_OR_RETURN(ckpt.config, ReadHfGpt2Config((d / kHfConfigFile).string()));
  FLEET_ASSIGN_OR_RETURN(ckpt.params,
                         ReadHfGpt2Weights((d / kHfWeightsFile).string(), ckpt.config));
  return ckpt;
}

Status WriteHfGpt2Dir(const std::string& dir, const GptConfig& config,
                      std::span<const float> params, SafetensorsDtype dtype) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create the directory: " + ec.message(), dir);
  const std::filesystem::path d(dir);
  FLEET_RETURN_IF_ERROR(WriteHfGpt2Weights((d / kHfWeightsFile).string(), config, params, dtype));
  return WriteFileAtomically((d / kHfConfigFile).string(), HfGpt2ConfigJson(config, dtype));
}

Status CheckSameGptShape(const GptConfig& hf, const GptConfig& model) {
  const struct {
    const char* key;
    int a, b;
  } fields[] = {
      {"Model.vocab_size", hf.vocab_size, model.vocab_size},
      {"Model.hidden_size", hf.hidden_size, model.hidden_size},
      {"Model.num_layers", hf.num_layers, model.num_layers},
      {"Model.num_attention_heads", hf.num_attention_heads, model.num_attention_heads},
      {"Model.ffn_hidden_size", hf.ffn(), model.ffn()},
      {"Model.max_position_embeddings", hf.max_position_embeddings, model.max_position_embeddings},
  };
  for (const auto& f : fields) {
    if (f.a != f.b) {
      return Status::InvalidArgument(
          absl::StrCat("the pretrained weights have ", f.a, " but the config says ", f.b), f.key);
    }
  }
  return Status::OK();
}

namespace {

// <path>/gpt.ckpt for a directory, else `path`.
std::string CheckpointFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec)
             ? (std::filesystem::path(path) / kGptCheckpointFile).string()
             : path;
}

}  // namespace

std::string PretrainedWeightsFile(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path dir(path);
  if (std::filesystem::exists(dir / kHfConfigFile, ec)) return (dir / kHfWeightsFile).string();
  return CheckpointFile(path);
}

Status LoadPretrainedGpt(const std::string& path, const GptConfig& config, ParamArena* arena) {
  std::error_code ec;
  const std::filesystem::path hf_config = std::filesystem::path(path) / kHfConfigFile;
  if (std::filesystem::exists(hf_config, ec)) {
    FLEET_ASSIGN_OR_RETURN(HfGpt2Checkpoint hf, ReadHfGpt2Dir(path));
    FLEET_RETURN_IF_ERROR(CheckSameGptShape(hf.config, config).WithContext(path));
    return arena->ParamsFromHost(hf.params);
  }
  const std::string file = CheckpointFile(path);
  if (!std::filesystem::exists(file, ec)) {
    return Status::NotFound(
        absl::StrCat("no model: the FleetPS checkpoint ", file, " does not exist, nor does ",
                     hf_config.string(), " of a Hugging Face GPT-2 directory"),
        path);
  }
  return LoadCheckpointParams(file, arena);
}

Result<GptConfig> ConvertHfToCheckpoint(const std::string& hf_dir, const std::string& ckpt_dir) {
  FLEET_ASSIGN_OR_RETURN(HfGpt2Checkpoint hf, ReadHfGpt2Dir(hf_dir));
  CpuBackend backend;
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(GptParamTable(hf.config), &backend));
  FLEET_RETURN_IF_ERROR(arena.ParamsFromHost(hf.params));
  std::error_code ec;
  std::filesystem::create_directories(ckpt_dir, ec);
  if (ec) return Status::IOError("cannot create the directory: " + ec.message(), ckpt_dir);
  // SGD has no state: the file holds the parameters alone (step 0).
  Sgd no_state(&arena, 1.0f);
  FLEET_RETURN_IF_ERROR(SaveCheckpoint(
      (std::filesystem::path(ckpt_dir) / kGptCheckpointFile).string(), arena, no_state));
  return hf.config;
}

Status ConvertCheckpointToHf(const std::string& ckpt_path, const GptConfig& config,
                             const std::string& hf_dir, SafetensorsDtype dtype) {
  CpuBackend backend;
  FLEET_ASSIGN_OR_RETURN(ParamArena arena, ParamArena::Create(GptParamTable(config), &backend));
  FLEET_RETURN_IF_ERROR(LoadCheckpointParams(CheckpointFile(ckpt_path), &arena));
  return WriteHfGpt2Dir(hf_dir, config, arena.ParamsToHost(), dtype);
}

}  // namespace fleet::trainer
