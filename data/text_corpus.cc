#include "data/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "comm/splitmix.h"
#include "comm/file_io.h"
#include "data/token_files.h"

namespace fleet::data {

namespace {

constexpr std::pair<TextFormat, const char*> kFormats[] = {
    {TextFormat::kFile, "file"},
    {TextFormat::kLine, "line"},
    {TextFormat::kBlankLine, "blank_line"},
    {TextFormat::kPercent, "percent"},
    {TextFormat::kJsonl, "jsonl"},
};

// Bumped when the cached files' contents change meaning.
constexpr int kCacheVersion = 1;

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// Calls fn(line, line_number) for each line without its "\n" / "\r\n".
template <typename Fn>
Status ForEachLine(std::string_view text, Fn fn) {
  int64_t number = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    FLEET_RETURN_IF_ERROR(fn(line, ++number));
    pos = end + 1;
  }
  return Status::OK();
}

// Joins runs of lines into documents, ending one wherever `is_separator`.
template <typename IsSeparator>
std::vector<std::string> Groups(std::string_view text, IsSeparator is_separator) {
  std::vector<std::string> docs;
  std::string current;
  bool open = false;
  auto flush = [&] {
    if (open && !current.empty()) docs.push_back(std::move(current));
    current.clear();
    open = false;
  };
  (void)ForEachLine(text, [&](std::string_view line, int64_t) {
    if (is_separator(line)) {
      flush();
    } else {
      if (open) current += '\n';
      current += line;
      open = true;
    }
    return Status::OK();
  });
  flush();
  return docs;
}

// FNV-1a: a stable 64-bit hash of the cache key text.
uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return Mix64(h);
}

// Uniform in [0, n) without modulo bias (Lemire's multiply-and-reject).
uint64_t Below(SplitMix64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;
  while (true) {
    const unsigned __int128 m = static_cast<unsigned __int128>(rng.Next()) * n;
    if (static_cast<uint64_t>(m) >= threshold) return static_cast<uint64_t>(m >> 64);
  }
}

}  // namespace

std::string_view TextFormatName(TextFormat f) {
  for (const auto& [format, name] : kFormats) {
    if (format == f) return name;
  }
  return "?";
}

Result<TextFormat> ParseTextFormat(std::string_view name) {
  for (const auto& [format, n] : kFormats) {
    if (name == n) return format;
  }
  return Status::InvalidArgument(
      absl::StrCat("text format '", std::string(name),
                   "' is not one of file, line, blank_line, percent, jsonl"));
}

Result<std::vector<std::string>> SplitDocuments(std::string_view text, TextFormat format,
                                                const std::string& file,
                                                std::string_view json_key) {
  switch (format) {
    case TextFormat::kFile:
      if (text.empty()) return std::vector<std::string>{};
      return std::vector<std::string>{std::string(text)};
    case TextFormat::kLine: {
      std::vector<std::string> docs;
      (void)ForEachLine(text, [&](std::string_view line, int64_t) {
        if (!line.empty()) docs.emplace_back(line);
        return Status::OK();
      });
      return docs;
    }
    case TextFormat::kBlankLine:
      return Groups(text, IsBlank);
    case TextFormat::kPercent:
      return Groups(text, [](std::string_view line) { return line == "%"; });
    case TextFormat::kJsonl: {
      std::vector<std::string> docs;
      const std::string key(json_key);
      FLEET_RETURN_IF_ERROR(ForEachLine(text, [&](std::string_view line, int64_t n) -> Status {
        if (IsBlank(line)) return Status::OK();
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_object()) {
          return Status::InvalidArgument("not a JSON object", absl::StrCat(file, ":", n));
        }
        auto it = j.find(key);
        if (it == j.end() || !it->is_string()) {
          return Status::InvalidArgument(absl::StrCat("no string field \"", key, "\""),
                                         absl::StrCat(file, ":", n));
        }
        std::string doc = it->get<std::string>();
        if (!doc.empty()) docs.push_back(std::move(doc));
        return Status::OK();
      }));
      return docs;
    }
  }
  return Status::InvalidArgument("unknown text format", file);
}

Result<TokenizedText> TokenizeTextFiles(const TextCorpusOptions& options,
                                        const Tokenizer& tokenizer) {
  std::vector<std::string> docs;
  for (const auto& path : options.files) {
    FLEET_ASSIGN_OR_RETURN(auto file, InputFile::Open(path));
    FLEET_ASSIGN_OR_RETURN(std::string text, file->ReadAll());
    FLEET_ASSIGN_OR_RETURN(std::vector<std::string> these,
                           SplitDocuments(text, options.format, path, options.json_key));
    for (auto& d : these) docs.push_back(std::move(d));
  }
  if (docs.empty()) {
    return Status::InvalidArgument(
        absl::StrCat("no documents in ", options.files.size(), " file(s) split by ",
                     std::string(TextFormatName(options.format))),
        options.files.empty() ? "(no files)" : options.files.front());
  }
  if (options.shuffle_documents) {
    SplitMix64 rng(options.shuffle_seed);
    for (size_t i = docs.size() - 1; i > 0; --i) std::swap(docs[i], docs[Below(rng, i + 1)]);
  }
  TokenizedText out;
  out.doc_lens.reserve(docs.size());
  for (const auto& d : docs) {
    const size_t before = out.tokens.size();
    tokenizer.Encode(d, &out.tokens);
    out.tokens.push_back(tokenizer.eot_id());
    out.doc_lens.push_back(static_cast<int64_t>(out.tokens.size() - before));
  }
  return out;
}

Result<std::string> BuildTokenCache(const TextCorpusOptions& options, const Tokenizer& tokenizer,
                                    const std::string& cache_dir, std::string_view label) {
  namespace fs = std::filesystem;
  std::string key =
      absl::StrCat("v", kCacheVersion, "|", std::string(tokenizer.name()), "|",
                   tokenizer.vocab_size(), "|", std::string(TextFormatName(options.format)), "|",
                   options.json_key, "|", options.shuffle_documents, "|", options.shuffle_seed);
  for (const auto& path : options.files) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) {
      return ec == std::errc::no_such_file_or_directory
                 ? Status::NotFound("no such file", path)
                 : Status::IOError("cannot stat (" + ec.message() + ")", path);
    }
    const auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
    absl::StrAppend(&key, "|", fs::absolute(path).string(), "|", size, "|", mtime);
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a(key)));
  const std::string prefix =
      (fs::path(cache_dir) /
       absl::StrCat(std::string(label), "_", std::string(tokenizer.name()), "_", hex))
          .string();
  if (OpenFleetXData(prefix).ok()) return prefix;

  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) return Status::IOError("cannot create the token cache (" + ec.message() + ")", cache_dir);
  FLEET_ASSIGN_OR_RETURN(TokenizedText t, TokenizeTextFiles(options, tokenizer));
  FLEET_RETURN_IF_ERROR(WriteFleetXData(prefix, t.tokens, t.doc_lens, tokenizer.vocab_size()));
  return prefix;
}

Result<std::vector<std::string>> DefaultCorpusFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const fs::path& p = e.path();
    if (!p.has_extension() && !e.is_symlink() && e.is_regular_file() &&
        p.filename().string()[0] != '.') {
      files.push_back(p.string());
    }
  }
  if (files.empty()) {
    return Status::NotFound(
        "no fortune files (the default training text comes from the Debian package `fortunes`: "
        "apt-get install fortunes, as scripts/setup.sh does)",
        dir);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace fleet::data
