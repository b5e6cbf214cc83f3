// Text to token files: splitting text files into documents, tokenizing them
// with an end-of-text token after each, the cached tokenization a
// TextDataset trains on, and the default corpus that needs no download.
//
//   SplitDocuments       one file's text -> documents (file, line,
//                        blank_line, percent or jsonl).
//   TokenizeTextFiles    files -> tokens + document lengths.
//   BuildTokenCache      the same, written once as FleetX *_ids.npy /
//                        *_idx.npz under a cache directory and reused while
//                        the inputs are unchanged.
//   DefaultCorpusFiles   the fortune files the Debian package `fortunes`
//                        installs (/usr/share/games/fortunes): ~2.6 MB of
//                        English text in ~30,000 short documents.
//
// Every error names the file (and line for jsonl).
//
// Thread safety: free functions over their arguments; BuildTokenCache may
// run in several processes at once on the same cache directory (each writes
// complete files under its own temporary names and renames them into place;
// the results are identical).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "data/tokenizer.h"

namespace fleet::data {

enum class TextFormat {
  kFile,       // the whole file is one document
  kLine,       // every non-empty line is a document
  kBlankLine,  // paragraphs: runs of non-blank lines between blank lines
  kPercent,    // fortune(6) files: documents between lines holding only "%"
  kJsonl,      // one JSON object per line; its string field `json_key`
};
// "file", "line", "blank_line", "percent", "jsonl" (Data.*.dataset.text_format).
std::string_view TextFormatName(TextFormat f);
// InvalidArgument listing the names for anything else.
Result<TextFormat> ParseTextFormat(std::string_view name);

// The documents of `text`, the contents of `file` (named in errors). Line
// ends ("\n" or "\r\n") between the lines of a document stay "\n"; the
// separators themselves and empty documents are dropped.
// Errors (jsonl only): InvalidArgument naming file:line for a line that is
// not a JSON object with a string field `json_key`.
Result<std::vector<std::string>> SplitDocuments(std::string_view text, TextFormat format,
                                                const std::string& file,
                                                std::string_view json_key = "text");

struct TextCorpusOptions {
  // The text files, read in this order (gzip-compressed ones too).
  std::vector<std::string> files;
  TextFormat format = TextFormat::kFile;
  std::string json_key = "text";
  // Put the documents in a pseudo-random order drawn from shuffle_seed
  // before tokenizing, so that a split by document position (the held-out
  // part is the last documents) samples every file rather than the last
  // ones. Default on.
  bool shuffle_documents = true;
  uint64_t shuffle_seed = 20240520;
};

struct TokenizedText {
  std::vector<int32_t> tokens;
  // Tokens of each document, its end-of-text token included.
  std::vector<int64_t> doc_lens;
};

// Reads, splits, (shuffles) and encodes every document, each followed by
// tokenizer.eot_id(). Errors: those of reading a file (NotFound, IOError,
// Corruption for a damaged gzip), of SplitDocuments; InvalidArgument when
// no file holds a document.
Result<TokenizedText> TokenizeTextFiles(const TextCorpusOptions& options,
                                        const Tokenizer& tokenizer);

// The FleetX prefix under `cache_dir` holding TokenizeTextFiles(options,
// tokenizer): built (and cache_dir created) when missing, reused when
// present. The name is "<label>_<tokenizer>_<16 hex digits>", the digits a
// hash of the file paths, sizes and modification times, the format,
// json_key, shuffle settings, tokenizer and vocabulary size: changing any
// of them makes a new cache entry (old entries are left for the user to
// delete). Errors: those of TokenizeTextFiles, IOError naming cache_dir
// when it cannot be created or written, NotFound for a missing input file.
Result<std::string> BuildTokenCache(const TextCorpusOptions& options, const Tokenizer& tokenizer,
                                    const std::string& cache_dir, std::string_view label);

// Where the Debian package `fortunes` installs its files.
inline constexpr char kDefaultCorpusDir[] = "/usr/share/games/fortunes";

// The fortune text files in `dir`: regular files without an extension (not
// the *.dat indexes nor the *.u8 links), sorted by name. Split them with
// TextFormat::kPercent. NotFound naming the directory (and the package that
// provides it, which scripts/setup.sh installs) when there are none.
Result<std::vector<std::string>> DefaultCorpusFiles(const std::string& dir = kDefaultCorpusDir);

}  // namespace fleet::data
