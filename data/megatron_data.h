// Megatron-LM's GPT data: the indexed dataset its preprocess_data.py writes
// (PREFIX.bin + PREFIX.idx, MMapIndexedDataset) and its GPT dataset over
// one split of it, sampled as Megatron samples it (megatron/data/
// gpt2_dataset.py of Megatron-LM v1.1.5, the DeepSpeed Megatron GPT-2
// examples' version).
//
// The files.
//   PREFIX.idx  little endian:
//                 magic       9 bytes "MMIDIDX\0\0"
//                 version     uint64, 1
//                 dtype code  uint8: the .bin's element type (4 int32,
//                             5 int64, 8 uint16 are token types; 1 uint8,
//                             2 int8, 3 int16 and the float codes are refused)
//                 count       uint64: sequences (a document per sequence as
//                             preprocess_data.py writes without sentence
//                             splitting)
//                 doc_count   uint64: entries of the document index
//                 sizes       int32 [count]: tokens of each sequence
//                 pointers    int64 [count]: byte offset of each in the .bin
//                 doc_idx     int64 [doc_count]: first sequence of each
//                             document, then count
//   PREFIX.bin  the sequences' tokens back to back, of the dtype.
// Every size, pointer and index is checked against the files (Corruption
// naming the file and the entry); the .bin is memory-mapped.
//
// Samples (MegatronGptSamples). Split part k (Megatron's --split "949,50,1",
// rounded as get_train_valid_test_split_) is a range of sequences, its
// "documents". For `num_samples` samples of seq_len + 1 tokens Megatron
//   * takes as many epochs E over the documents as those samples need
//     ((E tokens_per_epoch - 1) / seq_len >= num_samples),
//   * doc index: the part's documents E times, shuffled as one array by
//     numpy's RandomState(seed).shuffle (MT19937, Fisher-Yates with
//     rejection-sampled bounded integers; reproduced here bit for bit),
//   * sample index: sample i starts at (doc index position, offset) where
//     the previous one ended minus one token (consecutive samples overlap by
//     the one token that is the last's target and the next's input), so
//     samples run across document boundaries,
//   * shuffle index: [0, (E tokens_per_epoch - 1) / seq_len) shuffled by
//     the same RandomState, next in its stream.
// Sample id i is Megatron's sample i: shuffle index entry i's tokens. Later
// Megatron versions shuffle a short last epoch separately; v1.1.5's single
// shuffle is what is built.
//
// Thread safety: immutable after opening; may be shared by threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "data/gpt_dataset.h"
#include "data/token_files.h"

namespace fleet::data {

inline constexpr char kMegatronIndexMagic[] = "MMIDIDX\0\0";  // 9 bytes with the 2 NULs
inline constexpr uint64_t kMegatronIndexVersion = 1;

class MegatronIndexedData {
 public:
  // Opens PREFIX.idx and PREFIX.bin. NotFound for a missing file,
  // Corruption for a malformed or inconsistent one (naming the file and
  // what), InvalidArgument for an element type that is not a token type.
  static Result<std::shared_ptr<const MegatronIndexedData>> Open(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  // Tokens of sequence i. REQUIRES: 0 <= i < num_sequences().
  int64_t size(int64_t i) const { return sizes_[i]; }
  const std::vector<int64_t>& doc_idx() const { return doc_idx_; }
  TokenDtype dtype() const { return tokens_->dtype(); }

  // Copies tokens [offset, offset + n) of sequence `seq` into out, checking
  // ids against [0, vocab_size). REQUIRES: the range lies in the sequence.
  // InvalidArgument naming the file, sequence and token for an id out of
  // range.
  Status Read(int64_t seq, int64_t offset, int64_t n, int64_t vocab_size, int32_t* out) const;

 private:
  MegatronIndexedData() = default;
  std::string prefix_;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> starts_;  // each sequence's first token in tokens_
  std::vector<int64_t> doc_idx_;
  std::optional<TokenArray> tokens_;  // the .bin (set by Open)
};

// Megatron's element type for a vocabulary (best_fitting_dtype): uint16
// below 65500 ids, else int32.
TokenDtype MegatronDtypeFor(int64_t vocab_size);

// Writes PREFIX.bin and PREFIX.idx atomically (each appears complete or not
// at all), one sequence per document: `doc_lens` are the tokens of each and
// sum to tokens.size(). InvalidArgument for a token outside [0,
// vocab_size) or lengths that do not add up; IOError naming the file.
Status WriteMegatronIndexed(const std::string& prefix, std::span<const int32_t> tokens,
                            std::span<const int64_t> doc_lens, int64_t vocab_size);

// numpy.random.RandomState(seed).shuffle of `values` (in place), continuing
// the stream `rng` (a std::mt19937 seeded with the seed is numpy's legacy
// seeding): what Megatron's index building draws. Exposed for its test.
void NumpyShuffle(std::mt19937& rng, std::span<int32_t> values);
void NumpyShuffle(std::mt19937& rng, std::span<int64_t> values);

struct MegatronSamplesOptions {
  int64_t seq_len = 1024;     // Megatron's --seq-length (each sample holds seq_len + 1 tokens)
  int64_t vocab_size = 50304;  // ids must be below this (Model.vocab_size)
  std::vector<double> split = {949, 50, 1};  // --split
  int part = 0;                              // 0 train, 1 valid, 2 test
  int64_t num_samples = 0;                   // what the run needs (>= 1)
  uint64_t seed = 1234;                      // --seed (Global.seed)
};

class MegatronGptSamples final : public GptSamples {
 public:
  // Builds the three indices. InvalidArgument for bad options (naming the
  // option), or a part without documents or tokens for one sample.
  static Result<std::unique_ptr<MegatronGptSamples>> Open(
      std::shared_ptr<const MegatronIndexedData> data, const MegatronSamplesOptions& options);

  int64_t num_samples() const override { return static_cast<int64_t>(shuffle_idx_.size()); }
  int64_t seq_len() const override { return options_.seq_len; }
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t epochs() const { return epochs_; }
  Status ReadInputsAndTargets(std::span<const int64_t> ids, int32_t* tokens,
                              int32_t* targets) const override;
  // Sample `id`'s seq_len + 1 tokens into out (no allocation). Errors as
  // ReadInputsAndTargets: InvalidArgument for an id outside [0,
  // num_samples()) or a token beyond the vocabulary.
  Status ReadSample(int64_t id, int32_t* out) const;

  // The indices, for tests: doc index (sequence ids), sample index (pairs
  // of doc index position and offset), shuffle index.
  const std::vector<int32_t>& doc_index() const { return doc_idx_; }
  const std::vector<int64_t>& sample_index() const { return sample_idx_; }
  const std::vector<int64_t>& shuffle_index() const { return shuffle_idx_; }

 private:
  // Tokens [skip, skip + n) of sample `id` into out.
  Status ReadRange(int64_t id, int64_t skip, int64_t n, int32_t* out) const;
  MegatronGptSamples(std::shared_ptr<const MegatronIndexedData> data,
                     const MegatronSamplesOptions& options)
      : data_(std::move(data)), options_(options) {}

  const std::shared_ptr<const MegatronIndexedData> data_;
  const MegatronSamplesOptions options_;
  int64_t epochs_ = 0;
  std::vector<int32_t> doc_idx_;
  std::vector<int64_t> sample_idx_;  // [samples + 1, 2]
  std::vector<int64_t> shuffle_idx_;
};

}  // namespace fleet::data
