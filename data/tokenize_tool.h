// The `tokenize` program: text files -> token files a GPT config trains on.
//
//   build/bin/tokenize --input=books/,notes.txt --text_format=blank_line
//       --tokenizer=gpt2 --output_prefix=data/books --output_format=both   (one line)
//
// writes data/books_000000.bin, data/books_000001.bin, ... (llm.c shards of
// at most --shard_tokens tokens; TokenBinDataset) and/or data/books_ids.npy
// + data/books_idx.npz (FleetX; GPTDataset), every document followed by the
// end-of-text token. --output_format=megatron writes Megatron's indexed
// dataset instead, named as its preprocess_data.py names it:
// data/books_text_document.bin + .idx (MegatronDataset, gpt_pretrain
// --data-path data/books_text_document; data/megatron_data.h). With no --input it tokenizes the
// default corpus (the Debian `fortunes` files, split at "%" lines).
//
// Thread safety: RunTokenize touches only the files it is given.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "comm/status.h"

namespace fleet::data {

struct TokenizeToolOptions {
  // Text files: comma-separated files, directories or globs (ExpandFileSpec).
  // Empty: the default corpus.
  std::string input;
  // file | line | blank_line | percent | jsonl (text_corpus.h). Ignored for
  // the default corpus, which is always split at "%" lines.
  std::string text_format = "file";
  std::string json_key = "text";
  // gpt2 | byte, and where gpt2's encoder.json and vocab.bpe are ("" = the
  // scripts/setup.sh copy).
  std::string tokenizer = "gpt2";
  std::string vocab_dir;
  // Output files start with this path (its directory must exist).
  std::string output_prefix;
  // bin | fleetx | both | megatron.
  std::string output_format = "bin";
  // Tokens per .bin shard, >= 1 (llm.c's own default is 10^8).
  int64_t shard_tokens = 100'000'000;
  // Put documents in a pseudo-random order (seed shuffle_seed) first, so a
  // split by position holds out documents from every file.
  bool shuffle_documents = false;
  uint64_t shuffle_seed = 20240520;
};

// The prefix --output_format=megatron writes: <output_prefix>_<json_key>_document.
std::string MegatronOutputPrefix(const TokenizeToolOptions& options);

// Tokenizes and writes the files; prints one summary line per file written
// and a total to `log`. Errors: InvalidArgument for bad options (naming the
// flag) or text without documents; those of reading (NotFound, IOError,
// Corruption) and writing (IOError) naming the file.
Status RunTokenize(const TokenizeToolOptions& options, std::ostream& log);

}  // namespace fleet::data
