// gpt_generate: text from a trained GPT checkpoint.
//
//   build/bin/gpt_generate -c configs/gpt/pretrain_gpt_tiny.yaml
//       --checkpoint output/gpt_tiny --prompt "A fortune: " [--seed 7] [--max_dec_len 80]
//   (one command line)
//
// The config (-c FILE, -o Section.key=value, as gpt_pretrain takes it) gives
// the model's shape (Model), the tokenizer (Data.Train.dataset.tokenizer),
// the device (Global.device) and how to decode (Generation: decode_strategy,
// top_k, top_p, temperature (0: greedy), min_dec_len, max_dec_len,
// num_return_sequences). The flags --decode_strategy, --top_k, --top_p,
// --temperature, --min_dec_len, --max_dec_len and --num_return_sequences
// are shorthands for -o Generation.<key>=<value> (applied after every -o).
// The parameters come from <checkpoint>/gpt.ckpt, the file gpt_pretrain (or
// gpt_convert) writes, or from a Hugging Face GPT-2 directory given as
// --checkpoint (any optimizer state in gpt.ckpt is skipped).
//
// Output (stdout): each sequence's text, the prompt followed by what was
// generated up to end-of-text or max_dec_len; with num_return_sequences > 1
// each is preceded by a line "=== sample i/n ===". The same config, prompt
// and --seed (default Global.seed) print the same text.
//
// Device: --device cpu|cuda:K, by default cpu for Global.device cpu and
// cuda:0 for gpu (one GPU is enough: a single process decodes).
//
// Exit status: 0 done; 1 generation failed (missing or unreadable
// checkpoint, a checkpoint of another model shape, a prompt longer than the
// model's context, no such GPU or no CUDA in this build); 2 bad command line
// or config. Every error is one line on stderr.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "collective/config/gpt_config.h"
#include "comm/status.h"
#include "serve/inference.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_hf.h"

namespace fleet::examples::gpt {

// The checkpoint file gpt_pretrain writes into its output directory.
using trainer::kGptCheckpointFile;

struct GeneratedText {
  // Per sequence: the prompt's text followed by the generated text.
  std::vector<std::string> texts;
  // Generation stopped because a sequence filled the model's context.
  bool context_full = false;
};

// The compute and model loading gpt_serve shares (serve/inference.h).
using serve::CreateInferenceCompute;
using serve::InferenceCompute;
using serve::LoadGptModel;

// Builds config.model on `compute` (CreateGptCompute's backend and twin, not
// owned), loads its parameters as LoadGptModel does, and generates
// config.generation.num_return_sequences continuations of `prompt` with a
// mt19937_64 seeded with `seed`. Blocks for the whole generation.
// Errors: NotFound / Corruption / FailedPrecondition (another shape, naming
// the tensor) from the checkpoint; InvalidArgument naming
// Model.max_position_embeddings for an empty prompt or one longer than the
// context, or naming the Generation key that is out of range.
Result<GeneratedText> GenerateText(const trainer::config::GptJobConfig& config,
                                   const std::string& checkpoint_dir, const std::string& prompt,
                                   uint64_t seed, trainer::GptCompute* compute);

// The whole program over `args` (argv without argv[0]): parses the command
// line, creates the compute for --device (default DefaultDevice(config);
// on cpu with --threads threads, default all cores, which sets OpenBLAS to
// one thread process-wide), calls GenerateText and prints. Returns the exit
// status above.
int GptGenerateMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace fleet::examples::gpt
