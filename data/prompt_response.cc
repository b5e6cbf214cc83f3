#include "data/prompt_response.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "comm/file_io.h"

namespace fleet::data {
namespace {

// Pairs [begin, end) of part `part` out of n under `weights` (cumulative
// weights rounded to whole pairs).
std::pair<int64_t, int64_t> PartOf(const std::vector<double>& weights, int part, int64_t n) {
  double total = 0;
  for (double w : weights) total += w;
  double before = 0;
  for (int k = 0; k < part && k < static_cast<int>(weights.size()); ++k) before += weights[k];
  const double mine = part < static_cast<int>(weights.size()) ? weights[part] : 0.0;
  const auto at = [&](double w) { return static_cast<int64_t>(std::llround(n * (w / total))); };
  return {at(before), at(before + mine)};
}

}  // namespace

Result<std::unique_ptr<PromptResponseDataset>> PromptResponseDataset::Open(
    const std::vector<std::string>& files, const Tokenizer& tokenizer,
    const PromptResponseOptions& o) {
  if (o.seq_len < 1) return Status::InvalidArgument("must be >= 1", "seq_len");
  if (tokenizer.vocab_size() > o.vocab_size) {
    return Status::InvalidArgument(
        absl::StrCat("the ", std::string(tokenizer.name()), " tokenizer's ", tokenizer.vocab_size(),
                     " ids exceed the model's vocabulary of ", o.vocab_size),
        "Model.vocab_size");
  }
  double total = 0;
  for (double w : o.split) total += (w >= 0 && std::isfinite(w)) ? w : -1e300;
  if (!(total > 0) || o.part < 0 || o.part > 2) {
    return Status::InvalidArgument("split weights must be >= 0 and not all 0", "split");
  }
  // Every pair is read (the parts are cut by count over all of them); only
  // this part's are kept.
  struct Pair {
    std::vector<int32_t> ids;
    int64_t prompt = 0;
  };
  std::vector<Pair> pairs;
  const int64_t max_ids = o.seq_len + 1;
  for (const std::string& file : files) {
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> in, InputFile::Open(file));
    LineReader lines(std::move(in));
    std::string_view line;
    while (true) {
      FLEET_ASSIGN_OR_RETURN(bool more, lines.Next(&line));
      if (!more) break;
      const std::string where = absl::StrCat(file, ":", lines.line_number());
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (doc.is_discarded() || !doc.is_object()) {
        return Status::InvalidArgument(
            "not a JSON object (each line must be {\"prompt\": ..., \"response\": ...})", where);
      }
      const auto prompt = doc.find("prompt");
      const auto response = doc.find("response");
      if (prompt == doc.end() || response == doc.end() || !prompt->is_string() ||
          !response->is_string()) {
        return Status::InvalidArgument("needs string fields \"prompt\" and \"response\"", where);
      }
      Pair p;
      tokenizer.Encode(prompt->get<std::string>(), &p.ids);
      p.prompt = static_cast<int64_t>(p.ids.size());
      if (p.prompt >= max_ids) {
        return Status::InvalidArgument(
            absl::StrCat("the prompt is ", p.prompt,
                         " tokens, leaving no room for the response "
                         "in max_seq_len ",
                         o.seq_len, " (shorten it or raise max_seq_len)"),
            where);
      }
      tokenizer.Encode(response->get<std::string>(), &p.ids);
      p.ids.push_back(tokenizer.eot_id());
      if (static_cast<int64_t>(p.ids.size()) > max_ids) p.ids.resize(max_ids);
      pairs.push_back(std::move(p));
    }
  }
  const auto [begin, end] = PartOf(o.split, o.part, static_cast<int64_t>(pairs.size()));
  if (begin == end) {
    return Status::InvalidArgument(
        absl::StrCat("part ", o.part, " of split has no pairs (", pairs.size(),
                     " pairs in all; more data or another split)"),
        files.empty() ? std::string("no files") : files.front());
  }
  std::unique_ptr<PromptResponseDataset> d(new PromptResponseDataset(o, tokenizer.eot_id()));
  for (int64_t i = begin; i < end; ++i) {
    d->ids_.insert(d->ids_.end(), pairs[i].ids.begin(), pairs[i].ids.end());
    d->starts_.push_back(static_cast<int64_t>(d->ids_.size()));
    d->prompt_tokens_.push_back(pairs[i].prompt);
  }
  return d;
}

Status PromptResponseDataset::ReadInputsAndTargets(std::span<const int64_t> ids, int32_t* tokens,
                                                   int32_t* targets) const {
  const int64_t T = options_.seq_len;
  for (size_t row = 0; row < ids.size(); ++row) {
    const int64_t i = ids[row];
    if (i < 0 || i >= num_samples()) {
      return Status::InvalidArgument(
          absl::StrCat("sample ", i, " is outside the ", num_samples(), " prompt/response pairs"));
    }
    const std::span<const int32_t> pair = pair_ids(i);
    const int64_t n = static_cast<int64_t>(pair.size());
    int32_t* tok = tokens + row * T;
    int32_t* tgt = targets + row * T;
    for (int64_t t = 0; t < T; ++t) {
      tok[t] = t < n ? pair[t] : pad_;
      // Position t predicts pair[t + 1]: a loss only where that is the response's.
      tgt[t] = (t + 1 < n && t + 1 >= prompt_tokens_[i]) ? pair[t + 1] : -1;
    }
  }
  return Status::OK();
}

}  // namespace fleet::data
