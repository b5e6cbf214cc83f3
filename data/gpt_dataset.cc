#include "data/gpt_dataset.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace fleet::data {

std::array<int64_t, 4> SplitBoundaries(const std::vector<double>& weights, int64_t size) {
  std::array<double, 3> w = {0, 0, 0};
  double sum = 0;
  for (size_t i = 0; i < 3 && i < weights.size(); ++i) {
    w[i] = weights[i];
    sum += w[i];
  }
  std::array<int64_t, 4> b = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    b[i + 1] = b[i] + static_cast<int64_t>(std::nearbyint(w[i] / sum * static_cast<double>(size)));
  }
  const int64_t diff = b[3] - size;
  for (int i = 1; i < 4; ++i) b[i] = std::clamp<int64_t>(b[i] - diff, 0, size);
  return b;
}

namespace {

const char* PartName(int part) {
  static const char* kNames[] = {"train", "eval", "test"};
  return part >= 0 && part < 3 ? kNames[part] : "?";
}

}  // namespace

// ---------------------------------------------------------------- corpus

Result<std::shared_ptr<const TokenCorpus>> TokenCorpus::OpenFleetX(
    const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return Status::InvalidArgument("no FleetX *_ids.npy/*_idx.npz data given");
  std::shared_ptr<TokenCorpus> c(new TokenCorpus());
  for (const auto& prefix : prefixes) {
    FLEET_ASSIGN_OR_RETURN(FleetXData d, OpenFleetXData(prefix));
    c->file_starts_.push_back(c->num_tokens_);
    int64_t pos = c->num_tokens_;
    for (int64_t len : d.lens) {
      // Zero-length entries add no boundary of their own.
      if (len > 0) c->doc_starts_.push_back(pos);
      pos += len;
    }
    c->num_tokens_ += d.ids.size();
    c->files_.push_back(std::move(d.ids));
  }
  c->file_starts_.push_back(c->num_tokens_);
  c->doc_starts_.push_back(c->num_tokens_);
  return std::shared_ptr<const TokenCorpus>(std::move(c));
}

Result<std::shared_ptr<const TokenCorpus>> TokenCorpus::OpenLlmc(
    const std::vector<std::string>& paths) {
  if (paths.empty()) return Status::InvalidArgument("no llm.c .bin token shards given");
  std::shared_ptr<TokenCorpus> c(new TokenCorpus());
  for (const auto& path : paths) {
    FLEET_ASSIGN_OR_RETURN(TokenArray a, OpenLlmcShard(path));
    c->file_starts_.push_back(c->num_tokens_);
    c->num_tokens_ += a.size();
    c->files_.push_back(std::move(a));
  }
  c->file_starts_.push_back(c->num_tokens_);
  return std::shared_ptr<const TokenCorpus>(std::move(c));
}

std::string TokenCorpus::Describe() const {
  if (files_.empty()) return "no files";
  if (files_.size() == 1) return files_[0].path();
  return absl::StrCat(files_[0].path(), " and ", files_.size() - 1, " more");
}

Status TokenCorpus::Read(int64_t begin, int64_t n, int64_t vocab_size, int32_t* out) const {
  CHECK(begin >= 0 && n >= 0 && begin + n <= num_tokens_) << begin << "+" << n;
  // The file holding `begin`: the last whose start is <= begin.
  size_t f =
      std::upper_bound(file_starts_.begin(), file_starts_.end(), begin) - file_starts_.begin() - 1;
  int64_t done = 0;
  while (done < n) {
    const int64_t in_file = begin + done - file_starts_[f];
    const int64_t take = std::min(n - done, files_[f].size() - in_file);
    files_[f].CopyTo(in_file, take, out + done);
    for (int64_t i = 0; i < take; ++i) {
      const int32_t id = out[done + i];
      if (id < 0 || id >= vocab_size) {
        const int64_t real = files_[f].Get(in_file + i);
        return Status::InvalidArgument(absl::StrCat("token id ", real, " at token ", in_file + i,
                                                    " is outside the vocabulary [0, ", vocab_size,
                                                    ") (Model.vocab_size or the data is wrong)"),
                                       files_[f].path());
      }
    }
    done += take;
    ++f;
  }
  return Status::OK();
}

std::pair<int64_t, int64_t> TokenCorpus::PartRange(const std::vector<double>& weights,
                                                   int part) const {
  CHECK(part >= 0 && part < 3) << part;
  if (has_documents()) {
    const int64_t docs = static_cast<int64_t>(doc_starts_.size()) - 1;
    const auto b = SplitBoundaries(weights, docs);
    return {doc_starts_[b[part]], doc_starts_[b[part + 1]]};
  }
  const auto b = SplitBoundaries(weights, num_tokens_);
  return {b[part], b[part + 1]};
}

// ---------------------------------------------------------------- dataset

GptDataset::GptDataset(std::shared_ptr<const TokenCorpus> corpus, const GptDatasetOptions& options)
    : corpus_(std::move(corpus)), options_(options) {}

Result<std::unique_ptr<GptDataset>> GptDataset::Open(std::shared_ptr<const TokenCorpus> corpus,
                                                     const GptDatasetOptions& o) {
  CHECK(corpus != nullptr);
  if (o.seq_len < 1) return Status::InvalidArgument("must be >= 1", "seq_len");
  if (o.vocab_size < 1) return Status::InvalidArgument("must be >= 1", "vocab_size");
  if (o.part < 0 || o.part > 2) return Status::InvalidArgument("must be 0, 1 or 2", "part");
  if (o.split.empty() || o.split.size() > 3) {
    return Status::InvalidArgument("needs 1 to 3 weights", "split");
  }
  double sum = 0;
  for (double w : o.split) {
    if (!(w >= 0) || !std::isfinite(w)) {
      return Status::InvalidArgument("weights must be finite and >= 0", "split");
    }
    sum += w;
  }
  if (sum <= 0) return Status::InvalidArgument("weights must not all be 0", "split");

  std::unique_ptr<GptDataset> d(new GptDataset(std::move(corpus), o));
  std::tie(d->begin_, d->end_) = d->corpus_->PartRange(o.split, o.part);
  const int64_t tokens = d->end_ - d->begin_;
  d->num_samples_ = tokens > o.seq_len ? (tokens - 1) / o.seq_len : 0;
  if (d->num_samples_ == 0) {
    return Status::InvalidArgument(
        absl::StrCat("the ", PartName(o.part), " part has ", tokens, " tokens; one sample of ",
                     "max_seq_len ", o.seq_len, " needs ", o.seq_len + 1,
                     " (more data, a shorter max_seq_len or another split)"),
        d->corpus_->Describe());
  }
  return d;
}

Status GptDataset::CheckIndex(int64_t index) const {
  if (index < 0 || index >= num_samples_) {
    return Status::InvalidArgument(
        absl::StrCat("sample ", index, " is outside the ", num_samples_, " samples of the ",
                     PartName(options_.part), " part"),
        corpus_->Describe());
  }
  return Status::OK();
}

Status GptDataset::ReadSample(int64_t index, int32_t* out) const {
  FLEET_RETURN_IF_ERROR(CheckIndex(index));
  return corpus_->Read(begin_ + index * options_.seq_len, options_.seq_len + 1, options_.vocab_size,
                       out);
}

Status GptDataset::ReadInputsAndTargets(std::span<const int64_t> ids, int32_t* tokens,
                                        int32_t* targets) const {
  const int64_t T = options_.seq_len;
  for (size_t i = 0; i < ids.size(); ++i) {
    FLEET_RETURN_IF_ERROR(CheckIndex(ids[i]));
    // Two overlapping reads straight into the rows: no sample buffer.
    const int64_t begin = begin_ + ids[i] * T;
    FLEET_RETURN_IF_ERROR(corpus_->Read(begin, T, options_.vocab_size, tokens + i * T));
    FLEET_RETURN_IF_ERROR(corpus_->Read(begin + 1, T, options_.vocab_size, targets + i * T));
  }
  return Status::OK();
}

Status GptDataset::ReadSamples(std::span<const int64_t> ids, int32_t* out) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    FLEET_RETURN_IF_ERROR(ReadSample(ids[i], out + i * sample_tokens()));
  }
  return Status::OK();
}

}  // namespace fleet::data
