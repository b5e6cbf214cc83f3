// Token-id files: the two on-disk formats GPT pretraining reads and writes.
//
//   FleetX's GPT format (ppfleetx/data/data_tools/gpt/preprocess_data.py):
//     <prefix>_ids.npy  1-D NumPy array of every token id, documents back to
//                       back (uint16 when the vocabulary has < 65535 ids,
//                       else int32; int64 and uint32 are read too)
//     <prefix>_idx.npz  NumPy zip of `lens` (int32: tokens of each
//                       document, summing to the ids' length) and `docs`
//                       (int64: cumulative counts of `lens` entries per
//                       document, starting at 0; optional)
//   llm.c's token shards (dev/data/data_common.py):
//     <name>.bin        256 little-endian int32 header (magic 20240520,
//                       version 1, token count, then zeros) followed by that
//                       many uint16 tokens
//
// .npy headers are parsed here (the format is small and specified); the
// .npz zip is read and written through libzip. Token arrays are
// memory-mapped, so opening a multi-gigabyte corpus costs no reading.
//
// Every error names the file: NotFound (no file), IOError (the OS refused),
// Corruption (truncated, wrong magic, a header that does not parse, sizes
// that disagree), InvalidArgument (a dtype or shape this reader does not
// take, a token a format cannot hold).
//
// Thread safety: a TokenArray is immutable after opening; its methods may be
// called from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"

namespace fleet::data {

enum class TokenDtype { kUint16, kInt32, kUint32, kInt64 };
std::string_view TokenDtypeName(TokenDtype t);  // NumPy's: "<u2", "<i4", "<u4", "<i8"
size_t TokenDtypeSize(TokenDtype t);

class MappedFile;

// A read-only view of `size()` token ids of one dtype inside a mapped file.
class TokenArray {
 public:
  int64_t size() const { return size_; }
  TokenDtype dtype() const { return dtype_; }
  const std::string& path() const;

  // Token i as a signed 64-bit value. REQUIRES: 0 <= i < size().
  int64_t Get(int64_t i) const;
  // Copies tokens [begin, begin + n) into out, converted to int32; ids that
  // do not fit int32 (negative or too large) come out as -1 so the caller's
  // vocabulary check rejects them. REQUIRES: the range lies inside.
  void CopyTo(int64_t begin, int64_t n, int32_t* out) const;

 private:
  friend Result<TokenArray> OpenNpyTokens(const std::string& path);
  friend Result<TokenArray> OpenLlmcShard(const std::string& path);
  friend Result<TokenArray> OpenRawTokens(const std::string& path, TokenDtype dtype);
  TokenArray(std::shared_ptr<const MappedFile> file, size_t offset, int64_t size, TokenDtype dtype)
      : file_(std::move(file)), offset_(offset), size_(size), dtype_(dtype) {}

  std::shared_ptr<const MappedFile> file_;
  size_t offset_ = 0;  // byte offset of token 0 in the file
  int64_t size_ = 0;
  TokenDtype dtype_ = TokenDtype::kUint16;
};

// Maps a file that is nothing but little-endian tokens of `dtype` (e.g.
// Megatron's PREFIX.bin). Corruption when its size is not a whole number of
// tokens.
Result<TokenArray> OpenRawTokens(const std::string& path, TokenDtype dtype);

// ---- NumPy .npy -----------------------------------------------------------

struct NpyHeader {
  std::string descr;  // e.g. "<u2"
  bool fortran_order = false;
  std::vector<int64_t> shape;  // () is a scalar
  size_t data_offset = 0;      // bytes before the array data
};

// Parses the header at the start of `bytes` (versions 1.0, 2.0 and 3.0).
// `name` names the file in errors. Corruption when the magic, version,
// length or dictionary is malformed.
Result<NpyHeader> ParseNpyHeader(std::string_view bytes, const std::string& name);

// Maps a 1-D .npy of token ids (<u2, <i4, <u4 or <i8).
Result<TokenArray> OpenNpyTokens(const std::string& path);

// Reads the integer array `member` ("lens") of a .npz into int64s. The
// member must be 1-D of <i4, <i8, <u2 or <u4. NotFound when the zip has no
// such member.
Result<std::vector<int64_t>> ReadNpzIntArray(const std::string& npz_path,
                                             const std::string& member);

// The bytes of a .npy file holding `values` as a 1-D array of `dtype`.
// InvalidArgument when a value does not fit the dtype.
Result<std::string> EncodeNpy(std::span<const int64_t> values, TokenDtype dtype);

// ---- FleetX GPT data ------------------------------------------------------

// One FleetX <prefix>_ids.npy + <prefix>_idx.npz pair.
struct FleetXData {
  std::string prefix;
  TokenArray ids;
  std::vector<int64_t> lens;  // tokens of each document; sum == ids.size()
};

// Opens <prefix>_ids.npy and <prefix>_idx.npz and checks that they agree
// (lens non-negative and summing to the ids' length; docs, when present,
// starting at 0, non-decreasing and ending at lens' length).
Result<FleetXData> OpenFleetXData(const std::string& prefix);

// Writes <prefix>_ids.npy (uint16 when vocab_size <= 65535, else int32, as
// FleetX's preprocessing does) and <prefix>_idx.npz (lens, and docs with
// one entry per document) atomically: each file appears complete or not at
// all. `doc_lens` are the tokens of each document and must sum to
// tokens.size(). InvalidArgument for a token outside [0, vocab_size).
Status WriteFleetXData(const std::string& prefix, std::span<const int32_t> tokens,
                       std::span<const int64_t> doc_lens, int64_t vocab_size);

// ---- llm.c .bin shards ----------------------------------------------------

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

// Maps an llm.c shard, checking magic, version and that the file holds
// exactly the header's token count.
Result<TokenArray> OpenLlmcShard(const std::string& path);

// Writes an llm.c shard atomically. InvalidArgument for a token outside
// [0, 65535] (the format stores uint16).
Status WriteLlmcShard(const std::string& path, std::span<const int32_t> tokens);

}  // namespace fleet::data
