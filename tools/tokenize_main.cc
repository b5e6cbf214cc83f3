// tokenize: text files -> llm.c .bin shards and/or FleetX npy/npz
// (data/tokenize_tool.h). A thin main over RunTokenize().
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <iostream>
#include <optional>

#include "comm/program_help.h"

#include "data/tokenize_tool.h"

DEFINE_string(input, "",
              "Text files: comma-separated files, directories or globs. Empty: the default corpus "
              "(the fortunes of the Debian package `fortunes`).");
DEFINE_string(text_format, "file",
              "How a file splits into documents: file, line, blank_line, percent (fortune "
              "files), jsonl (one JSON object per line, field --json_key).");
DEFINE_string(json_key, "text", "jsonl: the field holding a document's text.");
DEFINE_string(tokenizer, "gpt2", "gpt2 (GPT-2 BPE, 50257 ids) or byte (256 bytes + EOT).");
DEFINE_string(vocab_dir, "",
              "gpt2: directory of encoder.json and vocab.bpe (default: where scripts/setup.sh "
              "puts them).");
DEFINE_string(output_prefix, "", "Output path prefix, e.g. data/books (required).");
DEFINE_string(output_format, "bin",
              "bin (llm.c shards <prefix>_000000.bin...), fleetx (<prefix>_ids.npy + "
              "<prefix>_idx.npz), both, or megatron (Megatron's indexed dataset "
              "<prefix>_<json_key>_document.bin + .idx).");
DEFINE_int64(shard_tokens, 100000000, "Tokens per .bin shard.");
DEFINE_bool(shuffle_documents, false,
            "Shuffle documents (fixed seed) so a split by position holds out every file's.");

int main(int argc, char** argv) {
  const fleet::ProgramHelp help{
      "tokenize --input=FILES --output_prefix=PREFIX [--tokenizer=gpt2|byte] [flags]",
      "Turns text files into GPT token files: llm.c .bin shards and/or FleetX *_ids.npy + "
      "*_idx.npz, or Megatron's indexed dataset (.bin + .idx).",
      {{"Input",
        {fleet::GflagsHelpFlag("input", "FILES"), fleet::GflagsHelpFlag("text_format", "FORMAT"),
         fleet::GflagsHelpFlag("json_key", "KEY"), fleet::GflagsHelpFlag("shuffle_documents")}},
       {"Tokenizer",
        {fleet::GflagsHelpFlag("tokenizer", "gpt2|byte"),
         fleet::GflagsHelpFlag("vocab_dir", "DIR")}},
       {"Output",
        {fleet::GflagsHelpFlag("output_prefix", "PREFIX"),
         fleet::GflagsHelpFlag("output_format", "bin|fleetx|both|megatron"),
         fleet::GflagsHelpFlag("shard_tokens", "N")}}}};
  if (std::optional<int> done = fleet::ParseFlagsOrHelp(help, &argc, &argv, std::cout)) {
    return *done;
  }
  google::InitGoogleLogging(argv[0]);
  fleet::data::TokenizeToolOptions o;
  o.input = FLAGS_input;
  o.text_format = FLAGS_text_format;
  o.json_key = FLAGS_json_key;
  o.tokenizer = FLAGS_tokenizer;
  o.vocab_dir = FLAGS_vocab_dir;
  o.output_prefix = FLAGS_output_prefix;
  o.output_format = FLAGS_output_format;
  o.shard_tokens = FLAGS_shard_tokens;
  o.shuffle_documents = FLAGS_shuffle_documents;
  const fleet::Status st = fleet::data::RunTokenize(o, std::cout);
  if (!st.ok()) {
    std::cerr << "tokenize: " << st.ToString() << "\n";
    // What was given is wrong (a flag, a file): a usage error, as for flags.
    return st.IsInvalidArgument() || st.IsNotFound() ? fleet::kExitUsage : 1;
  }
  return 0;
}
