// Tokenizers: text <-> token ids, for GPT pretraining data and generation.
//
//   Tokenizer       the interface.
//   ByteTokenizer   byte-level: id b is byte b (0..255), 256 is end-of-text.
//                   257 ids, no files; for tiny models and tests.
//   Gpt2Tokenizer   GPT-2's byte-level BPE (data/gpt2_tokenizer.h):
//                   50257 ids, end-of-text 50256, read from encoder.json and
//                   vocab.bpe.
//
// Encode never fails: any bytes (also invalid UTF-8) have ids, and
// Decode(Encode(s)) == s. The text "<|endoftext|>" is encoded as ordinary
// text, never as the end-of-text id: callers place that id themselves
// (tokenize puts one after every document).
//
// Thread safety: Encode and Decode are const and may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"

namespace fleet::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "byte" or "gpt2": the name configs use (Data.*.dataset.tokenizer).
  virtual std::string_view name() const = 0;
  // Ids are in [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
  // The end-of-text id that separates documents.
  virtual int32_t eot_id() const = 0;

  // Appends the ids of `text` to *out.
  virtual void Encode(std::string_view text, std::vector<int32_t>* out) const = 0;
  std::vector<int32_t> Encode(std::string_view text) const {
    std::vector<int32_t> out;
    Encode(text, &out);
    return out;
  }

  // The bytes `ids` stand for (end-of-text as "<|endoftext|>"). A prefix of
  // a longer sequence may end inside a UTF-8 character; decode whole
  // sequences, or join the bytes, before showing them.
  // Errors: InvalidArgument naming the first id outside [0, vocab_size()).
  virtual Result<std::string> Decode(std::span<const int32_t> ids) const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEot = 256;
  std::string_view name() const override { return "byte"; }
  int32_t vocab_size() const override { return 257; }
  int32_t eot_id() const override { return kEot; }
  void Encode(std::string_view text, std::vector<int32_t>* out) const override;
  using Tokenizer::Encode;
  Result<std::string> Decode(std::span<const int32_t> ids) const override;
};

// The tokenizer named `name` ("byte" or "gpt2"); gpt2 reads its files from
// `vocab_dir`, or when it is empty from the first directory of
// gpt2_tokenizer.h's search that holds them.
// Errors: InvalidArgument for another name; NotFound listing every directory
// searched; those of Gpt2Tokenizer::Load.
Result<std::unique_ptr<Tokenizer>> MakeTokenizer(std::string_view name,
                                                 const std::string& vocab_dir);

}  // namespace fleet::data
