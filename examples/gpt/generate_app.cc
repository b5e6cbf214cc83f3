#include "examples/gpt/generate_app.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "collective/config/gpt_data.h"
#include "comm/program_flags.h"
#include "comm/program_help.h"
#include "comm/yaml_config.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_decoder.h"
#include "trainer/models/gpt_sampling.h"

namespace fleet::examples::gpt {

using trainer::config::GptJobConfig;

Result<GeneratedText> GenerateText(const GptJobConfig& config, const std::string& checkpoint_dir,
                                   const std::string& prompt, uint64_t seed,
                                   trainer::GptCompute* compute) {
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<data::Tokenizer> tokenizer,
                         data::OpenConfiguredTokenizer(config.data.train.dataset));
  // An empty prompt, or one longer than the context, is the decoder's
  // InvalidArgument (naming Model.max_position_embeddings).
  const std::vector<int32_t> ids = tokenizer->Encode(prompt);

  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::GptModel> model,
                         LoadGptModel(config, checkpoint_dir, compute));

  const auto& g = config.generation;
  FLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::TokenSampler> sampler,
      trainer::CreateTokenSampler(
          g.decode_strategy, {.temperature = g.temperature, .top_k = g.top_k, .top_p = g.top_p}));
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::GptDecoder> decoder,
                         trainer::GptDecoder::Create(
                             model.get(), {.batch = static_cast<int>(g.num_return_sequences)}));
  std::mt19937_64 rng(seed);
  FLEET_ASSIGN_OR_RETURN(trainer::GeneratedTokens tokens,
                         trainer::GenerateTokens(decoder.get(), *sampler, &rng, ids,
                                                 {.min_dec_len = g.min_dec_len,
                                                  .max_dec_len = g.max_dec_len,
                                                  .eot_id = tokenizer->eot_id(),
                                                  .vocab_limit = tokenizer->vocab_size()}));
  GeneratedText out;
  out.context_full = tokens.context_full;
  for (std::vector<int32_t>& seq : tokens.sequences) {
    // Decoded whole, prompt included, so a UTF-8 character split between
    // the prompt's last token and the first generated one stays whole.
    seq.insert(seq.begin(), ids.begin(), ids.end());
    FLEET_ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(seq));
    out.texts.push_back(std::move(text));
  }
  return out;
}

namespace {

ProgramHelp GenerateHelp() {
  return {
      "gpt_generate -c CONFIG [-o Section.key=value ...] --checkpoint DIR --prompt TEXT [flags]",
      "Prints text from a checkpoint gpt_pretrain saved, with the config it was trained with "
      "(see examples/gpt/README.md).",
      {{"What to run",
        {{"-c", "FILE", "the config the checkpoint was trained with (required)", ""},
         {"-o", "Section.key=value", "override one key of the config (repeatable)", ""},
         {"--checkpoint", "DIR", "gpt_pretrain's Engine.save_load.output_dir (required)", ""},
         {"--prompt", "TEXT", "the text to continue (required)", ""},
         {"--device", "cpu|cuda:K", "where to run", "Global.device of the config"},
         {"--threads", "N", "CPU threads", "the machine's cores"}}},
       {"Decoding (each stands for -o Generation.<name>=...)",
        {{"--decode_strategy", "sampling|greedy_search", "how the next token is chosen",
          "Generation"},
         {"--top_k", "N", "sample among the N most likely tokens (0: all)", "Generation"},
         {"--top_p", "P", "sample among the most likely tokens whose probabilities add up to P",
          "Generation"},
         {"--temperature", "T", "divides the logits before sampling (0: greedy)", "Generation"},
         {"--min_dec_len", "N", "no end-of-text before N new tokens", "Generation"},
         {"--max_dec_len", "N", "new tokens at most", "Generation"},
         {"--num_return_sequences", "N", "texts to print", "Generation"},
         {"--seed", "N", "the same seed prints the same text", "Global.seed"}}}},
      ""};
}

// Flags that stand for -o Generation.<name>=<value>.
constexpr const char* kGenerationFlags[] = {"decode_strategy",     "top_k",       "top_p",
                                            "temperature",         "min_dec_len", "max_dec_len",
                                            "num_return_sequences"};

struct Flags {
  std::string config;
  std::vector<std::string> overrides;
  std::string checkpoint;
  std::optional<std::string> prompt;
  std::optional<uint64_t> seed;
  std::string device;
  int threads = 0;
  bool help = false;
};

Result<Flags> ParseFlags(const std::vector<std::string>& args) {
  FLEET_ASSIGN_OR_RETURN(ConfigArgs config_args, ParseConfigArgs(args));
  Flags f;
  f.config = config_args.config;
  f.overrides = config_args.overrides;
  std::vector<std::string> generation;
  FLEET_ASSIGN_OR_RETURN(
      ProgramFlags flags, ParseProgramFlags(config_args.rest, [](std::string_view name) {
        return std::find(std::begin(kGenerationFlags), std::end(kGenerationFlags), name) !=
                   std::end(kGenerationFlags) ||
               name == "checkpoint" || name == "prompt" || name == "seed" || name == "device" ||
               name == "threads";
      }));
  f.help = flags.help;
  for (const auto& [name, value] : flags.values) {
    if (name == "checkpoint") {
      f.checkpoint = value;
    } else if (name == "prompt") {
      f.prompt = value;
    } else if (name == "seed") {
      uint64_t seed = 0;
      if (!absl::SimpleAtoi(value, &seed)) {
        return Status::InvalidArgument("--seed must be a non-negative integer, got \"" + value +
                                       "\"");
      }
      f.seed = seed;
    } else if (name == "device") {
      f.device = value;
    } else if (name == "threads") {
      if (!absl::SimpleAtoi(value, &f.threads) || f.threads < 1) {
        return Status::InvalidArgument("--threads must be >= 1, got \"" + value + "\"");
      }
    } else {
      generation.push_back("Generation." + name + "=" + value);
    }
  }
  if (f.help) return f;
  if (f.config.empty()) return Status::InvalidArgument("-c CONFIG is required (see --help)");
  if (f.checkpoint.empty()) return Status::InvalidArgument("--checkpoint DIR is required");
  if (!f.prompt) return Status::InvalidArgument("--prompt TEXT is required");
  f.overrides.insert(f.overrides.end(), generation.begin(), generation.end());
  return f;
}

}  // namespace

int GptGenerateMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Result<Flags> flags = ParseFlags(args);
  const std::optional<int> early = FlagsExitStatus(flags, "gpt_generate", GenerateHelp(), out, err);
  if (early) return *early;
  Result<GptJobConfig> config = trainer::config::LoadGptJobConfig(flags->config, flags->overrides);
  if (!config.ok()) {
    err << "gpt_generate: " << config.status().ToString() << "\n";
    return 2;
  }
  Result<InferenceCompute> compute =
      CreateInferenceCompute(*config, flags->device, flags->threads, "gpt_generate", err);
  if (!compute.ok()) {
    err << "gpt_generate: " << compute.status().ToString() << "\n";
    return 1;
  }
  const uint64_t seed = flags->seed ? *flags->seed : static_cast<uint64_t>(config->global.seed);
  Result<GeneratedText> text =
      GenerateText(*config, flags->checkpoint, *flags->prompt, seed, &compute->compute);
  if (!text.ok()) {
    err << "gpt_generate: " << text.status().ToString() << "\n";
    return 1;
  }
  const size_t n = text->texts.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 1) out << "=== sample " << i + 1 << "/" << n << " ===\n";
    out << text->texts[i] << "\n";
  }
  out.flush();
  if (text->context_full) {
    err << "gpt_generate: note: stopped at the model's context of "
        << config->model.max_position_embeddings
        << " tokens (Model.max_position_embeddings) before max_dec_len\n";
  }
  return 0;
}

}  // namespace fleet::examples::gpt
