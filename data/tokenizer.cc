#include "data/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "data/gpt2_tokenizer.h"

namespace fleet::data {

void ByteTokenizer::Encode(std::string_view text, std::vector<int32_t>* out) const {
  out->reserve(out->size() + text.size());
  for (char c : text) out->push_back(static_cast<unsigned char>(c));
}

Result<std::string> ByteTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == kEot) {
      out += "<|endoftext|>";
    } else if (ids[i] >= 0 && ids[i] < 256) {
      out.push_back(static_cast<char>(ids[i]));
    } else {
      return Status::InvalidArgument(absl::StrCat("id ", ids[i], " at position ", i,
                                                  " is outside the byte vocabulary [0, 257)"));
    }
  }
  return out;
}

Result<std::unique_ptr<Tokenizer>> MakeTokenizer(std::string_view name,
                                                 const std::string& vocab_dir) {
  if (name == "byte") return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
  if (name == "gpt2") {
    std::string dir = vocab_dir;
    if (dir.empty()) {
      FLEET_ASSIGN_OR_RETURN(dir, FindGpt2VocabDir(ProcessGpt2VocabSearch()));
    }
    FLEET_ASSIGN_OR_RETURN(auto t, Gpt2Tokenizer::Load(dir));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  return Status::InvalidArgument(
      absl::StrCat("unknown tokenizer '", std::string(name), "' (byte or gpt2)"));
}

}  // namespace fleet::data
