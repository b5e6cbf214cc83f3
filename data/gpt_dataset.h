// GPT pretraining samples: sequences of seq_len + 1 token ids (inputs and
// the targets shifted by one) cut from a corpus of token files, split into
// train / eval / test parts.
//
//   TokenCorpus   token files read as one stream (documents back to back,
//                 files in the order given), with document boundaries when
//                 the format has them (FleetX) and none when not (llm.c).
//   GptDataset    one part of a corpus as numbered samples.
//
// How samples are made. Part k of the corpus is a contiguous token range:
// with a document index, the documents are divided by count in proportion
// to the split weights exactly as FleetX's get_train_valid_test_split_
// rounds; without one, the tokens are (rounded to the nearest token). Sample
// i of a part holds tokens [begin + i*T, begin + i*T + T + 1): consecutive
// samples overlap by one token, so every token of the part but the first is
// a target once, and the part has (tokens - 1) / T samples. Samples run
// across document boundaries (the end-of-text token between documents tells
// the model), as in FleetX and llm.c.
//
// Order, ranks and position. Which samples a step uses is the collective
// training loop's (collective/train_loop.h), the same for every
// model: it visits sample ids [0, num_samples()) in a permutation drawn from
// (seed, epoch), gives each data rank its slice of every global batch (so
// any number of ranks sees the one-rank batch), and saves the data position
// with each checkpoint. A GPT task reports num_samples() to it and reads the
// ids it is handed with ReadSamples(). Sample i is the same tokens on every
// rank and every run over the same files, which is what makes that order
// and a resumed position exact.
//
// Thread safety: both classes are immutable after opening; they may be
// shared by threads (ranks run as threads in tests).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "data/token_files.h"

namespace fleet::data {

// What a GPT task trains on: numbered samples, each seq_len input tokens
// and the seq_len targets after them (-1: a position without loss, e.g.
// padding or a prompt). GptDataset (pretraining: every position has a
// target) and PromptResponseDataset (fine-tuning, prompt_response.h) are
// the two. Implementations are immutable and may be shared by threads.
class GptSamples {
 public:
  virtual ~GptSamples() = default;
  virtual int64_t num_samples() const = 0;
  virtual int64_t seq_len() const = 0;
  // Ids (tokens and targets) are below this (Model.vocab_size).
  virtual int64_t vocab_size() const = 0;
  // Samples `ids` into tokens and targets, each ids.size() x seq_len()
  // row-major. Allocates nothing. Errors: InvalidArgument for an id outside
  // [0, num_samples()), and the implementation's read errors (naming the
  // file); rows before the failing one are filled.
  virtual Status ReadInputsAndTargets(std::span<const int64_t> ids, int32_t* tokens,
                                      int32_t* targets) const = 0;
};

// The boundaries of the train / eval / test parts of `size` units (documents,
// or tokens) in proportion to 1 to 3 weights (missing ones 0, not all 0):
// FleetX's and Megatron's get_train_valid_test_split_, each boundary
// rounded as Python's round() does (half to even), then shifted so the last
// is exactly `size`. Part k is [b[k], b[k + 1]).
std::array<int64_t, 4> SplitBoundaries(const std::vector<double>& weights, int64_t size);

class TokenCorpus {
 public:
  // FleetX *_ids.npy + *_idx.npz pairs, named by prefix ("data/train" for
  // data/train_ids.npy and data/train_idx.npz), in the given order.
  // Errors: those of OpenFleetXData; InvalidArgument for no prefixes.
  static Result<std::shared_ptr<const TokenCorpus>> OpenFleetX(
      const std::vector<std::string>& prefixes);
  // llm.c .bin shards, in the given order. Errors: those of OpenLlmcShard;
  // InvalidArgument for no paths.
  static Result<std::shared_ptr<const TokenCorpus>> OpenLlmc(const std::vector<std::string>& paths);

  int64_t num_tokens() const { return num_tokens_; }
  // True when documents are known (FleetX); the split then divides them.
  bool has_documents() const { return !doc_starts_.empty(); }
  // Stream offsets of the document starts, then num_tokens() (FleetX only).
  const std::vector<int64_t>& doc_starts() const { return doc_starts_; }
  const std::vector<TokenArray>& files() const { return files_; }

  // Copies stream tokens [begin, begin + n) into out, across files, and
  // checks every id is in [0, vocab_size). REQUIRES: the range lies in the
  // stream. Errors: InvalidArgument naming the file, the position in it and
  // the id.
  Status Read(int64_t begin, int64_t n, int64_t vocab_size, int32_t* out) const;

  // Token range [begin, end) of split part `part` (0 train, 1 eval, 2 test)
  // under `weights` (1 to 3 non-negative numbers, not all 0; missing ones
  // are 0).
  std::pair<int64_t, int64_t> PartRange(const std::vector<double>& weights, int part) const;

  // Describes the files for errors ("data/a.bin" or "data/a.bin and 3 more").
  std::string Describe() const;

 private:
  TokenCorpus() = default;
  std::vector<TokenArray> files_;
  std::vector<int64_t> file_starts_;  // stream offset of each file, then num_tokens_
  std::vector<int64_t> doc_starts_;
  int64_t num_tokens_ = 0;
};

struct GptDatasetOptions {
  // Tokens per sequence T (Data.*.dataset.max_seq_len); each sample has
  // T + 1. >= 1.
  int64_t seq_len = 1024;
  // Ids must be in [0, vocab_size) (Model.vocab_size). >= 1.
  int64_t vocab_size = 50304;
  // Split weights (Data.*.dataset.split) and which part to read: 0 train,
  // 1 eval, 2 test.
  std::vector<double> split = {949, 50, 1};
  int part = 0;
};

class GptDataset final : public GptSamples {
 public:
  // Errors: InvalidArgument for bad options (naming the option) or a part
  // too small for one sample (the message gives the part's tokens and what
  // is needed, and names the files).
  static Result<std::unique_ptr<GptDataset>> Open(std::shared_ptr<const TokenCorpus> corpus,
                                                  const GptDatasetOptions& options);

  int64_t num_samples() const override { return num_samples_; }
  int64_t seq_len() const override { return options_.seq_len; }
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t sample_tokens() const { return options_.seq_len + 1; }
  const GptDatasetOptions& options() const { return options_; }
  const TokenCorpus& corpus() const { return *corpus_; }
  // Token range of this part in the corpus stream.
  std::pair<int64_t, int64_t> range() const { return {begin_, end_}; }

  // Sample `index` into out (sample_tokens() ids).
  // Errors: InvalidArgument for an index outside [0, num_samples()), or
  // from TokenCorpus::Read (an id beyond the vocabulary, naming the file and
  // the token's position in it).
  Status ReadSample(int64_t index, int32_t* out) const;
  // Samples `ids` into out, ids.size() x sample_tokens() row-major: the
  // batch the collective loop hands CollectiveTask::LoadBatch. Errors as
  // ReadSample; rows before the failing one are filled.
  Status ReadSamples(std::span<const int64_t> ids, int32_t* out) const;
  // Sample i's first seq_len tokens as inputs, its last seq_len as targets.
  Status ReadInputsAndTargets(std::span<const int64_t> ids, int32_t* tokens,
                              int32_t* targets) const override;

 private:
  GptDataset(std::shared_ptr<const TokenCorpus> corpus, const GptDatasetOptions& options);
  Status CheckIndex(int64_t index) const;

  const std::shared_ptr<const TokenCorpus> corpus_;
  const GptDatasetOptions options_;
  int64_t begin_ = 0, end_ = 0;
  int64_t num_samples_ = 0;
};

}  // namespace fleet::data
