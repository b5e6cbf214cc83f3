#include "examples/gpt/convert_app.h"

#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "collective/config/gpt_config.h"
#include "comm/program_flags.h"
#include "comm/program_help.h"
#include "comm/yaml_config.h"
#include "trainer/models/gpt_hf.h"
#include "trainer/models/gpt_lora_files.h"

namespace fleet::examples::gpt {
namespace {

ProgramHelp ConvertHelp() {
  return {
      "gpt_convert (--from_hf DIR --checkpoint DIR | --checkpoint DIR -c CONFIG --to_hf DIR | "
      "--merge_lora DIR -c CONFIG --checkpoint DIR) [flags]",
      "Converts Hugging Face GPT-2 checkpoints (config.json + model.safetensors) into a "
      "FleetPS checkpoint (DIR/gpt.ckpt) and back, and merges LoRA adapters into a full "
      "checkpoint (see examples/gpt/README.md).",
      {{"Direction",
        {{"--from_hf", "DIR", "read this Hugging Face GPT-2 directory", ""},
         {"--to_hf", "DIR", "write a Hugging Face GPT-2 directory here", ""},
         {"--merge_lora", "DIR",
          "merge the LoRA adapters of this directory (gpt_lora.ckpt + gpt_lora.json) into the "
          "config's Engine.init_from base: W + (alpha/rank) B A, written to --checkpoint",
          ""},
         {"--checkpoint", "DIR",
          "the FleetPS checkpoint directory (gpt.ckpt): written with --from_hf and "
          "--merge_lora, read with --to_hf (required)",
          ""}}},
       {"Model and format",
        {{"-c", "FILE",
          "the GPT config: its Model section is the checkpoint's shape (required with "
          "--to_hf and --merge_lora, whose Model.lora and Engine.init_from it also gives; "
          "with --from_hf it is checked against config.json)",
          ""},
         {"-o", "Section.key=value", "override one key of the config (repeatable)", ""},
         {"--dtype", "float32|float16|bfloat16",
          "the tensors' type in the written "
          "model.safetensors",
          "float32"}}}},
      ""};
}

struct Flags {
  std::string config;
  std::vector<std::string> overrides;
  std::string from_hf, to_hf, merge_lora, checkpoint;
  std::string dtype = "float32";
  bool help = false;
};

Result<Flags> ParseFlags(const std::vector<std::string>& args) {
  FLEET_ASSIGN_OR_RETURN(ConfigArgs config_args, ParseConfigArgs(args));
  Flags f;
  f.config = config_args.config;
  f.overrides = config_args.overrides;
  const std::map<std::string, std::string*, std::less<>> targets = {
      {"from_hf", &f.from_hf},       {"to_hf", &f.to_hf},           {"checkpoint", &f.checkpoint},
      {"merge_lora", &f.merge_lora}, {"dtype", &f.dtype}};
  FLEET_ASSIGN_OR_RETURN(ProgramFlags flags,
                         ParseProgramFlags(config_args.rest, [&](std::string_view name) {
                           return targets.find(name) != targets.end();
                         }));
  f.help = flags.help;
  for (const auto& [name, value] : flags.values) *targets.find(name)->second = value;
  if (f.help) return f;
  if (int(!f.from_hf.empty()) + int(!f.to_hf.empty()) + int(!f.merge_lora.empty()) != 1) {
    return Status::InvalidArgument(
        "give exactly one of --from_hf DIR, --to_hf DIR and --merge_lora DIR");
  }
  if (f.checkpoint.empty()) return Status::InvalidArgument("--checkpoint DIR is required");
  if (!f.to_hf.empty() && f.config.empty()) {
    return Status::InvalidArgument(
        "--to_hf needs -c CONFIG: its Model section is the checkpoint's shape");
  }
  if (!f.merge_lora.empty() && f.config.empty()) {
    return Status::InvalidArgument(
        "--merge_lora needs -c CONFIG: the config the adapters were trained with (Model.lora "
        "and the base, Engine.init_from)");
  }
  return f;
}

std::string ShapeLine(const trainer::GptConfig& c) {
  return absl::StrCat(trainer::GptParamCount(c), " parameters: ", c.num_layers, " layers, ",
                      c.num_attention_heads, " heads, hidden ", c.hidden_size, ", vocabulary ",
                      c.vocab_size, ", ", c.max_position_embeddings, " positions");
}

}  // namespace

int GptConvertMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Result<Flags> flags = ParseFlags(args);
  const std::optional<int> early = FlagsExitStatus(flags, "gpt_convert", ConvertHelp(), out, err);
  if (early) return *early;
  Result<trainer::SafetensorsDtype> dtype = trainer::ParseFloatDtype(flags->dtype);
  if (!dtype.ok()) {
    err << "gpt_convert: --dtype: " << dtype.status().ToString() << "\n";
    return 2;
  }
  std::optional<trainer::config::GptJobConfig> config;
  if (!flags->config.empty()) {
    Result<trainer::config::GptJobConfig> loaded =
        trainer::config::LoadGptJobConfig(flags->config, flags->overrides);
    if (!loaded.ok()) {
      err << "gpt_convert: " << loaded.status().ToString() << "\n";
      return 2;
    }
    config = std::move(*loaded);
  }
  if (!flags->from_hf.empty()) {
    Result<trainer::GptConfig> shape =
        trainer::ConvertHfToCheckpoint(flags->from_hf, flags->checkpoint);
    Status st = shape.status();
    if (st.ok() && config) st = trainer::CheckSameGptShape(*shape, config->model);
    if (!st.ok()) {
      err << "gpt_convert: " << st.ToString() << "\n";
      return 1;
    }
    out << "gpt_convert: wrote " << flags->checkpoint << "/" << trainer::kGptCheckpointFile << " ("
        << ShapeLine(*shape) << ")\n";
    return 0;
  }
  if (!flags->merge_lora.empty()) {
    if (!config->model.lora.enabled()) {
      err << "gpt_convert: --merge_lora: the config " << flags->config
          << " has no Model.lora section (the adapters' rank, alpha and targets)\n";
      return 2;
    }
    Status st = trainer::MergeGptLoraCheckpoint(flags->merge_lora, config->model,
                                                config->engine.init_from, flags->checkpoint);
    if (!st.ok()) {
      err << "gpt_convert: " << st.ToString() << "\n";
      return 1;
    }
    out << "gpt_convert: wrote " << flags->checkpoint << "/" << trainer::kGptCheckpointFile
        << " (" << flags->merge_lora << "'s rank " << config->model.lora.rank
        << " adapters merged into " << config->engine.init_from << "; "
        << ShapeLine(config->model) << ")\n";
    return 0;
  }
  Status st =
      trainer::ConvertCheckpointToHf(flags->checkpoint, config->model, flags->to_hf, *dtype);
  if (!st.ok()) {
    err << "gpt_convert: " << st.ToString() << "\n";
    return 1;
  }
  out << "gpt_convert: wrote " << flags->to_hf << "/" << trainer::kHfConfigFile << " and "
      << trainer::kHfWeightsFile << " (" << trainer::SafetensorsDtypeName(*dtype) << ", "
      << ShapeLine(config->model) << ")\n";
  return 0;
}

}  // namespace fleet::examples::gpt
