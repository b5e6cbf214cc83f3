#include "data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/file_io.h"

#ifndef FLEET_GPT2_VOCAB_DIR
#error "FLEET_GPT2_VOCAB_DIR must name the directory scripts/setup.sh fills"
#endif

namespace fleet::data {

Gpt2VocabSearch ProcessGpt2VocabSearch() {
  Gpt2VocabSearch search;
  if (const char* env = std::getenv("FLEET_GPT2_VOCAB_DIR"); env != nullptr && *env != '\0') {
    search.env_dir = env;
  }
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) search.binary_dir = exe.parent_path().string();
  const std::filesystem::path cwd = std::filesystem::current_path(error);
  if (!error) search.working_dir = cwd.string();
  search.source_dir = FLEET_GPT2_VOCAB_DIR;
  return search;
}

std::vector<std::string> Gpt2VocabDirCandidates(const Gpt2VocabSearch& search) {
  std::vector<std::string> dirs;
  if (search.env_dir) dirs.push_back(*search.env_dir);
  if (!search.binary_dir.empty()) {
    dirs.push_back(search.binary_dir + "/../share/gpt2-bpe");
    dirs.push_back(search.binary_dir + "/gpt2-bpe");
  }
  if (!search.working_dir.empty()) dirs.push_back(search.working_dir + "/.cache/gpt2-bpe");
  if (!search.source_dir.empty()) dirs.push_back(search.source_dir);
  return dirs;
}

Result<std::string> FindGpt2VocabDir(const Gpt2VocabSearch& search) {
  const std::vector<std::string> dirs = Gpt2VocabDirCandidates(search);
  std::error_code error;
  for (const std::string& dir : dirs) {
    if (std::filesystem::is_regular_file(dir + "/encoder.json", error) &&
        std::filesystem::is_regular_file(dir + "/vocab.bpe", error)) {
      return dir;
    }
  }
  return Status::NotFound(
      "no GPT-2 vocabulary (encoder.json and vocab.bpe; scripts/setup.sh fetches them into "
      ".cache/gpt2-bpe) in any of: " +
          absl::StrJoin(dirs, ", "),
      "set FLEET_GPT2_VOCAB_DIR or Data.*.dataset.vocab_dir to a directory holding them");
}

std::string DefaultGpt2VocabDir() {
  const Gpt2VocabSearch search = ProcessGpt2VocabSearch();
  Result<std::string> found = FindGpt2VocabDir(search);
  return found.ok() ? *found : search.source_dir;
}

namespace {

// GPT-2's pre-tokenizer (encoder.py), unchanged.
constexpr char kPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// bytes_to_unicode(): the printable bytes stand for themselves; the others
// (controls, space, 127-160, 173) map to code points 256, 257, ... in order.
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// Decodes valid UTF-8 (as nlohmann::json and the checked vocab.bpe give)
// into code points; false on a malformed sequence.
bool CodePoints(std::string_view s, std::vector<uint32_t>* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc >> 6) != 2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    out->push_back(cp);
    i += len;
  }
  return true;
}

// A token spelled in bytes_to_unicode characters -> its raw bytes.
bool SpelledToBytes(std::string_view spelled, const std::vector<int>& cp_to_byte,
                    std::string* bytes) {
  std::vector<uint32_t> cps;
  if (!CodePoints(spelled, &cps) || cps.empty()) return false;
  bytes->clear();
  for (uint32_t cp : cps) {
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    bytes->push_back(static_cast<char>(cp_to_byte[cp]));
  }
  return true;
}

Result<std::string> ReadVocabFile(const std::string& path) {
  auto file = InputFile::Open(path);
  if (!file.ok()) {
    if (file.status().IsNotFound()) {
      return Status::NotFound(
          "no GPT-2 vocabulary file (scripts/setup.sh fetches encoder.json and vocab.bpe into "
          ".cache/gpt2-bpe; or set Data.*.dataset.vocab_dir)",
          path);
    }
    return file.status();
  }
  return (*file)->ReadAll();
}

}  // namespace

struct Gpt2Tokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Gpt2Tokenizer::Gpt2Tokenizer() = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Result<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::Load(const std::string& vocab_dir) {
  return LoadFiles(vocab_dir + "/encoder.json", vocab_dir + "/vocab.bpe");
}

Result<std::unique_ptr<Gpt2Tokenizer>> Gpt2Tokenizer::LoadFiles(const std::string& encoder_path,
                                                                const std::string& merges_path) {
  FLEET_ASSIGN_OR_RETURN(std::string encoder_text, ReadVocabFile(encoder_path));
  FLEET_ASSIGN_OR_RETURN(std::string merges_text, ReadVocabFile(merges_path));

  const std::array<uint32_t, 256> byte_cp = ByteToCodePoint();
  std::vector<int> cp_to_byte(512, -1);
  for (int b = 0; b < 256; ++b) cp_to_byte[byte_cp[b]] = b;

  std::unique_ptr<Gpt2Tokenizer> t(new Gpt2Tokenizer());
  nlohmann::json encoder = nlohmann::json::parse(encoder_text, nullptr, /*allow_exceptions=*/false);
  if (encoder.is_discarded() || !encoder.is_object() || encoder.empty()) {
    return Status::Corruption("not a JSON object of token -> id", encoder_path);
  }
  const size_t n = encoder.size();
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::Corruption("too many tokens", encoder_path);
  }
  t->bytes_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  absl::flat_hash_map<std::string, int32_t> id_of;
  id_of.reserve(n);
  std::string bytes;
  for (const auto& [key, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(n)) {
      return Status::Corruption(
          absl::StrCat("id of token '", key, "' is not an integer in [0, ", n, ")"), encoder_path);
    }
    const int32_t id = value.get<int32_t>();
    if (seen[id]) return Status::Corruption(absl::StrCat("id ", id, " is repeated"), encoder_path);
    seen[id] = true;
    if (key == "<|endoftext|>") {
      t->eot_ = id;
      bytes = key;
    } else if (!SpelledToBytes(key, cp_to_byte, &bytes)) {
      return Status::Corruption(absl::StrCat("token '", key, "' is not byte-level BPE text"),
                                encoder_path);
    }
    t->bytes_[id] = bytes;
    id_of.emplace(bytes, id);
  }
  if (t->eot_ < 0) return Status::Corruption("no <|endoftext|> token", encoder_path);
  for (int b = 0; b < 256; ++b) {
    auto it = id_of.find(std::string(1, static_cast<char>(b)));
    if (it == id_of.end()) {
      return Status::Corruption(absl::StrCat("no token for byte ", b), encoder_path);
    }
    t->byte_id_[b] = it->second;
  }

  // vocab.bpe: "#version: 0.2", then one merge "left right" per line, best first.
  int32_t rank = 0;
  int64_t line_no = 0;
  std::string left, right;
  for (size_t pos = 0; pos < merges_text.size();) {
    size_t end = merges_text.find('\n', pos);
    if (end == std::string::npos) end = merges_text.size();
    std::string_view line(merges_text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos ||
        !SpelledToBytes(line.substr(0, space), cp_to_byte, &left) ||
        !SpelledToBytes(line.substr(space + 1), cp_to_byte, &right)) {
      return Status::Corruption(absl::StrCat("line ", line_no, " is not two byte-level tokens: '",
                                             std::string(line), "'"),
                                merges_path);
    }
    auto l = id_of.find(left), r = id_of.find(right), m = id_of.find(left + right);
    if (l == id_of.end() || r == id_of.end() || m == id_of.end()) {
      return Status::Corruption(
          absl::StrCat("line ", line_no, " merges tokens encoder.json lacks: '", std::string(line),
                       "'"),
          merges_path);
    }
    const uint64_t key =
        (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
    t->merges_.emplace(key, Merge{rank++, m->second});  // a repeated pair keeps its best rank
  }
  if (t->merges_.empty()) return Status::Corruption("no merges", merges_path);

  int err = 0;
  PCRE2_SIZE offset = 0;
  t->regex_ = std::make_unique<Regex>();
  t->regex_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
  if (t->regex_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return Status::Internal(
        absl::StrCat("PCRE2 refuses GPT-2's pattern: ", reinterpret_cast<const char*>(msg)));
  }
  // JIT is an optimisation only: the interpreter gives the same matches.
  pcre2_jit_compile(t->regex_->code, PCRE2_JIT_COMPLETE);
  return t;
}

void Gpt2Tokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  std::vector<int32_t> word(piece.size());
  for (size_t i = 0; i < piece.size(); ++i)
    word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  while (word.size() > 1) {
    // The adjacent pair with the best rank...
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    uint64_t best_key = 0;
    int32_t best_id = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const uint64_t key =
          (static_cast<uint64_t>(word[i]) << 32) | static_cast<uint32_t>(word[i + 1]);
      auto it = merges_.find(key);
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best_key = key;
        best_id = it->second.id;
      }
    }
    if (best_id < 0) break;
    // ...merged wherever it occurs, left to right without overlap.
    const int32_t first = static_cast<int32_t>(best_key >> 32);
    const int32_t second = static_cast<int32_t>(best_key & 0xffffffffu);
    size_t w = 0;
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        word[w++] = best_id;
        ++i;
      } else {
        word[w++] = word[i];
      }
    }
    word.resize(w);
  }
  out->insert(out->end(), word.begin(), word.end());
}

void Gpt2Tokenizer::Encode(std::string_view text, std::vector<int32_t>* out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  CHECK(md != nullptr) << "out of memory";
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(regex_->code, subject, text.size(), pos, 0, md, nullptr);
    size_t start = text.size(), end = text.size();
    if (rc > 0) {
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      start = ov[0];
      end = ov[1];
    } else {
      // PCRE2_ERROR_NOMATCH: only invalid UTF-8 is left. Other codes are
      // resource limits the pattern cannot reach; the bytes are kept either way.
      DCHECK_EQ(rc, PCRE2_ERROR_NOMATCH);
    }
    // Bytes no alternative matched (invalid UTF-8) form a piece of their own.
    if (start > pos) EncodePiece(text.substr(pos, start - pos), out);
    if (end > start) EncodePiece(text.substr(start, end - start), out);
    // The pattern never matches empty; guard against a stall anyway.
    pos = end > pos ? end : pos + 1;
  }
  pcre2_match_data_free(md);
}

Result<std::string> Gpt2Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return Status::InvalidArgument(absl::StrCat("id ", ids[i], " at position ", i,
                                                  " is outside the GPT-2 vocabulary [0, ",
                                                  vocab_size(), ")"));
    }
    out += bytes_[ids[i]];
  }
  return out;
}

}  // namespace fleet::data
