#include "collective/config/gpt_data.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "comm/file_io.h"
#include "data/gpt2_tokenizer.h"
#include "data/megatron_data.h"
#include "data/prompt_response.h"
#include "data/text_corpus.h"

namespace fleet::data {

using trainer::config::DatasetConfig;
using trainer::config::DatasetKind;

std::string_view DataPartName(DataPart part) {
  switch (part) {
    case DataPart::kTrain:
      return "Train";
    case DataPart::kEval:
      return "Eval";
    case DataPart::kTest:
      return "Test";
  }
  return "?";
}

namespace {

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A Megatron prefix from either file of its pair, or the prefix itself.
std::string MegatronPrefix(const std::string& path) {
  for (std::string_view suffix : {".idx", ".bin"}) {
    if (EndsWith(path, suffix)) return path.substr(0, path.size() - suffix.size());
  }
  return path;
}

// A FleetX prefix from either file of its pair.
std::optional<std::string> FleetXPrefix(const std::string& path) {
  for (std::string_view suffix : {"_idx.npz", "_ids.npy"}) {
    if (EndsWith(path, suffix)) return path.substr(0, path.size() - suffix.size());
  }
  return std::nullopt;
}

}  // namespace

Result<std::vector<std::string>> ConfiguredDataFiles(const DatasetConfig& d,
                                                     const std::string& key) {
  const bool from_dir = !d.input_dir.empty();
  const std::string spec = from_dir ? d.input_dir : d.input_files;
  const std::string spec_key = key + (from_dir ? ".input_dir" : ".input_files");
  if (spec.empty()) {
    if (d.kind == DatasetKind::kText) return DefaultCorpusFiles();
    return Status::InvalidArgument("names no data (set input_dir or input_files)", key);
  }
  if (d.kind == DatasetKind::kMegatron && !from_dir) {
    // A prefix names no file of its own (PREFIX.bin and PREFIX.idx do).
    if (spec.find(',') != std::string::npos) {
      return Status::InvalidArgument(
          "names several prefixes; Megatron's GPT dataset (v1.1.5) reads one (blending several "
          "is not built)",
          spec_key);
    }
    return std::vector<std::string>{MegatronPrefix(spec)};
  }
  auto listed = ExpandFileSpec(spec);
  if (!listed.ok()) return listed.status().WithContext(spec_key);
  std::vector<std::string> out;
  switch (d.kind) {
    case DatasetKind::kMegatron:
      for (const auto& f : *listed) {
        if (EndsWith(f, ".idx")) out.push_back(MegatronPrefix(f));
      }
      if (out.size() != 1) {
        return Status::InvalidArgument(
            absl::StrCat("holds ", out.size(), " Megatron indexes (*.idx); name one with ", key,
                         ".input_files=PREFIX"),
            spec_key);
      }
      return out;
    case DatasetKind::kFleetX:
      for (const auto& f : *listed) {
        auto prefix = FleetXPrefix(f);
        // A directory holds both files of a pair: keep one entry per pair.
        if (prefix && (!from_dir || EndsWith(f, "_idx.npz")) &&
            std::find(out.begin(), out.end(), *prefix) == out.end()) {
          out.push_back(*prefix);
        }
      }
      if (out.empty()) {
        return Status::NotFound(absl::StrCat(spec_key, ": no *_ids.npy / *_idx.npz data in"), spec);
      }
      return out;
    case DatasetKind::kTokenBin:
      for (const auto& f : *listed) {
        if (!from_dir || EndsWith(f, ".bin")) out.push_back(f);
      }
      if (out.empty())
        return Status::NotFound(absl::StrCat(spec_key, ": no *.bin shards in"), spec);
      return out;
    case DatasetKind::kText:
    case DatasetKind::kPromptResponse:
      return std::move(listed).value();
  }
  return Status::InvalidArgument("unknown dataset kind", key);
}

Result<std::unique_ptr<Tokenizer>> OpenConfiguredTokenizer(const DatasetConfig& dataset) {
  if (dataset.tokenizer == "gpt2" && !dataset.vocab_file.empty()) {
    FLEET_ASSIGN_OR_RETURN(auto t,
                           Gpt2Tokenizer::LoadFiles(dataset.vocab_file, dataset.merge_file));
    return std::unique_ptr<Tokenizer>(std::move(t));
  }
  return MakeTokenizer(dataset.tokenizer, dataset.vocab_dir);
}

Result<std::unique_ptr<GptDataset>> OpenConfiguredDataset(
    const trainer::config::GptJobConfig& config, DataPart part) {
  const trainer::config::DataSplitConfig& split = part == DataPart::kTrain  ? config.data.train
                                                  : part == DataPart::kEval ? config.data.eval
                                                                            : config.data.test;
  const std::string key = absl::StrCat("Data.", std::string(DataPartName(part)), ".dataset");
  if (!split.present) {
    return Status::FailedPrecondition("the config has no such section", key);
  }
  const DatasetConfig& d = split.dataset;
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> files, ConfiguredDataFiles(d, key));

  Result<std::shared_ptr<const TokenCorpus>> corpus = Status::Internal("unset");
  switch (d.kind) {
    case DatasetKind::kPromptResponse:
      return Status::InvalidArgument("PromptResponseDataset is not a token stream", key + ".name");
    case DatasetKind::kMegatron:
      return Status::InvalidArgument(
          "MegatronGPTDataset samples by Megatron's indices, not by position "
          "(OpenConfiguredSamples)",
          key + ".name");
    case DatasetKind::kFleetX:
      corpus = TokenCorpus::OpenFleetX(files);
      break;
    case DatasetKind::kTokenBin:
      corpus = TokenCorpus::OpenLlmc(files);
      break;
    case DatasetKind::kText: {
      FLEET_ASSIGN_OR_RETURN(auto tokenizer, OpenConfiguredTokenizer(d));
      TextCorpusOptions text;
      text.files = files;
      const bool default_corpus = d.input_dir.empty() && d.input_files.empty();
      if (default_corpus) {
        text.format = TextFormat::kPercent;
      } else {
        FLEET_ASSIGN_OR_RETURN(text.format, ParseTextFormat(d.text_format));
      }
      auto prefix =
          BuildTokenCache(text, *tokenizer, d.cache_dir, default_corpus ? "fortunes" : "text");
      if (!prefix.ok()) return prefix.status().WithContext(key);
      corpus = TokenCorpus::OpenFleetX({*prefix});
      break;
    }
  }
  if (!corpus.ok()) return corpus.status().WithContext(key);

  GptDatasetOptions o;
  o.seq_len = d.max_seq_len;
  o.vocab_size = config.model.vocab_size;
  o.split = d.split;
  o.part = static_cast<int>(part);
  auto dataset = GptDataset::Open(*corpus, o);
  if (!dataset.ok()) return dataset.status().WithContext(key);
  return dataset;
}

int64_t MegatronSamplesFor(const trainer::config::GptJobConfig& config, DataPart part) {
  const trainer::config::EngineConfig& e = config.engine;
  const int64_t batch = config.global.global_batch_size;
  switch (part) {
    case DataPart::kTrain:
      return e.max_steps * batch;
    case DataPart::kEval:
      return std::max<int64_t>(
          1, (e.eval_freq > 0 ? e.max_steps / e.eval_freq + 1 : 1) * e.eval_iters * batch);
    case DataPart::kTest:
      return std::max<int64_t>(1, e.test_iters * batch);
  }
  return 1;
}

Result<std::unique_ptr<GptSamples>> OpenConfiguredSamples(
    const trainer::config::GptJobConfig& config, DataPart part) {
  const trainer::config::DataSplitConfig& split = part == DataPart::kTrain  ? config.data.train
                                                  : part == DataPart::kEval ? config.data.eval
                                                                            : config.data.test;
  if (split.dataset.kind == DatasetKind::kMegatron) {
    const std::string key = absl::StrCat("Data.", std::string(DataPartName(part)), ".dataset");
    if (!split.present) return Status::FailedPrecondition("the config has no such section", key);
    const DatasetConfig& d = split.dataset;
    FLEET_ASSIGN_OR_RETURN(std::vector<std::string> prefixes, ConfiguredDataFiles(d, key));
    auto data = MegatronIndexedData::Open(prefixes[0]);
    if (!data.ok()) return data.status().WithContext(key);
    MegatronSamplesOptions o;
    o.seq_len = d.max_seq_len;
    o.vocab_size = config.model.vocab_size;
    o.split = d.split;
    o.part = static_cast<int>(part);
    o.num_samples = MegatronSamplesFor(config, part);
    o.seed = static_cast<uint64_t>(config.global.seed);
    auto samples = MegatronGptSamples::Open(*std::move(data), o);
    if (!samples.ok()) return samples.status().WithContext(key);
    return std::unique_ptr<GptSamples>(std::move(samples).value());
  }
  if (split.dataset.kind != DatasetKind::kPromptResponse) {
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<GptDataset> d, OpenConfiguredDataset(config, part));
    return std::unique_ptr<GptSamples>(std::move(d));
  }
  const std::string key = absl::StrCat("Data.", std::string(DataPartName(part)), ".dataset");
  if (!split.present) return Status::FailedPrecondition("the config has no such section", key);
  const DatasetConfig& d = split.dataset;
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> files, ConfiguredDataFiles(d, key));
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, OpenConfiguredTokenizer(d));
  PromptResponseOptions o;
  o.seq_len = d.max_seq_len;
  o.vocab_size = config.model.vocab_size;
  o.split = d.split;
  o.part = static_cast<int>(part);
  auto dataset = PromptResponseDataset::Open(files, *tokenizer, o);
  if (!dataset.ok()) return dataset.status().WithContext(key);
  return std::unique_ptr<GptSamples>(std::move(dataset).value());
}

}  // namespace fleet::data
