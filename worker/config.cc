#include "worker/config.h"

#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "data/ctr_reader.h"
#include "worker/task.h"

namespace fleet::worker {
namespace {

// Layer widths: each 1..kMaxWidth, min_count..kMaxLayers of them, and at
// most kMaxLayerWeights weights between consecutive layers, checked before
// any is allocated (the dense table's own bound is the same).
Status Widths(ConfigSection& s, std::string_view key, size_t min_count, std::vector<int>* out) {
  const bool given = s.Has(key);
  std::vector<int64_t> widths;
  FLEET_RETURN_IF_ERROR(s.IntList(key, &widths, min_count, kMaxLayers, 1, kMaxWidth));
  if (!given) return Status::OK();
  int64_t weights = 0;
  for (size_t i = 1; i < widths.size(); ++i) weights += widths[i - 1] * widths[i];
  if (weights > kMaxLayerWeights) {
    return s.Error(key, "the layers have " + std::to_string(weights) + " weights, more than the " +
                            std::to_string(kMaxLayerWeights) + " allowed");
  }
  out->assign(widths.begin(), widths.end());
  return Status::OK();
}

Status ParseModel(ConfigSection& s, WorkerModelConfig* m) {
  FLEET_RETURN_IF_ERROR(s.String("kind", &m->kind));
  const WorkerTaskType* type = FindWorkerTaskType(m->kind);
  if (type == nullptr) {
    return s.Error("kind", "must be one of " + WorkerTaskKinds() + ", got '" + m->kind + "'");
  }
  m->dense_table = type->default_dense_table;
  FLEET_RETURN_IF_ERROR(s.Int("sparse_table", &m->sparse_table, 0, INT32_MAX));
  FLEET_RETURN_IF_ERROR(s.Int("dense_table", &m->dense_table, 0, INT32_MAX));
  FLEET_RETURN_IF_ERROR(Widths(s, "hidden", 1, &m->hidden));
  FLEET_RETURN_IF_ERROR(Widths(s, "sizes", 2, &m->sizes));
  FLEET_RETURN_IF_ERROR(s.Int("cross_layers", &m->cross_layers, 1, kMaxCrossLayers));
  // Any integer: a negative seed is taken modulo 2^64.
  int64_t seed = static_cast<int64_t>(m->seed);
  FLEET_RETURN_IF_ERROR(s.Int("seed", &seed));
  m->seed = static_cast<uint64_t>(seed);
  return Status::OK();
}

Status ParseData(ConfigSection& s, WorkerDataConfig* d) {
  for (auto [key, out] : {std::pair{"train", &d->train}, {"test", &d->test}, {"oracle", &d->oracle},
                          {"train_images", &d->train_images}, {"train_labels", &d->train_labels},
                          {"test_images", &d->test_images}, {"test_labels", &d->test_labels}}) {
    FLEET_RETURN_IF_ERROR(s.String(key, out));
  }
  return s.Int("field_buckets", &d->field_buckets, 0, data::kMaxFieldBuckets);
}

Status ParseTrain(ConfigSection& s, WorkerTrainConfig* t) {
  FLEET_RETURN_IF_ERROR(s.Int("batch_size", &t->batch_size, 1, kMaxBatchSize));
  FLEET_RETURN_IF_ERROR(s.Int("epochs", &t->epochs, 0, kMaxEpochs));
  FLEET_RETURN_IF_ERROR(s.Int("log_interval", &t->log_interval, 0));
  FLEET_RETURN_IF_ERROR(s.Int("blas_threads", &t->blas_threads, 1, kMaxBlasThreads));
  FLEET_RETURN_IF_ERROR(s.String("save_dir", &t->save_dir));
  return s.Int("save_every_epochs", &t->save_every_epochs, 0);
}

}  // namespace

Result<WorkerConfig> ParseWorkerConfig(const ConfigDocument& doc) {
  WorkerConfig c;
  ConfigSection top(doc, "");
  FLEET_RETURN_IF_ERROR(top.Require("model", "section"));
  FLEET_RETURN_IF_ERROR(top.Section("model", [&](ConfigSection& s) { return ParseModel(s, &c.model); }));
  FLEET_RETURN_IF_ERROR(top.Require("data", "section"));
  FLEET_RETURN_IF_ERROR(top.Section("data", [&](ConfigSection& s) { return ParseData(s, &c.data); }));
  FLEET_RETURN_IF_ERROR(FindWorkerTaskType(c.model.kind)->check_config(c));
  FLEET_RETURN_IF_ERROR(top.Section("train", [&](ConfigSection& s) { return ParseTrain(s, &c.train); }));
  // The other top-level sections are the servers' (ps::ParseJobConfig).
  return c;
}

Result<WorkerConfig> ParseWorkerConfig(const YAML::Node& root) {
  return ParseWorkerConfig(ConfigDocument::FromNode(root));
}

namespace {

Result<PsJobConfig> ParseAll(const ConfigDocument& doc) {
  PsJobConfig c;
  FLEET_ASSIGN_OR_RETURN(c.job, ps::ParseJobConfig(doc));
  FLEET_ASSIGN_OR_RETURN(c.worker, ParseWorkerConfig(doc));
  return c;
}

Result<PsJobConfig> LoadAndParse(const std::string& path, std::span<const std::string> overrides) {
  FLEET_ASSIGN_OR_RETURN(ConfigDocument doc,
                         ps::LoadJobDocument(path, {overrides.begin(), overrides.end()}));
  return ParseAll(doc);
}

// `error`, which appears once `-o assignment` is applied, with the override
// named first (as fleetrun prints it) rather than cited at the end.
Status BlameOverride(const Status& error, const std::string& assignment) {
  const std::string named = "-o " + assignment;
  if (error.message().starts_with(named)) return error;  // the override itself is malformed
  std::string message = error.message();
  const std::string cite = " (from " + named + ")";
  if (const size_t at = message.find(cite); at != std::string::npos) message.erase(at, cite.size());
  // An override that names no key reads "-o k=v: unknown key: k", the
  // wording fleetrun's users (and scripts grepping its stderr) have seen.
  const std::string key = assignment.substr(0, assignment.find('='));
  if (const std::string reader_form = key + ": unknown key"; message.starts_with(reader_form)) {
    message = "unknown key: " + key + message.substr(reader_form.size());
  }
  return Status::InvalidArgument(message).WithContext(named);
}

}  // namespace

Result<PsJobConfig> LoadPsJobConfig(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  auto all = LoadAndParse(path, overrides);
  if (all.ok() || !all.status().IsInvalidArgument()) return all;
  // Blame the first override after which the config stops parsing, or the
  // file when it fails on its own (a key's error names its file or -o, but
  // a rule across keys can break only once an override changes one of them):
  // a few parses of a small tree.
  const std::span<const std::string> list(overrides);
  for (size_t n = 0; n < list.size(); ++n) {
    if (auto next = LoadAndParse(path, list.first(n + 1)); !next.ok()) {
      if (n == 0 && !LoadAndParse(path, {}).ok()) break;
      return BlameOverride(next.status(), list[n]);
    }
  }
  if (all.status().message().find(path) != std::string::npos) return all;
  return all.status().WithContext(path);
}

}  // namespace fleet::worker
