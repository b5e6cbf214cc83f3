#include "worker/config.h"

#include <functional>
#include <map>
#include <set>
#include <span>

#include "worker/task.h"

namespace fleet::worker {
namespace {

// Reads the keys of one section; each reader converts and range-checks its
// value. Unknown keys are refused.
using KeyReader = std::function<Status(const YAML::Node& value, const std::string& key)>;

Status ReadSection(const YAML::Node& root, const std::string& section, bool required,
                   const std::map<std::string, KeyReader>& readers) {
  const YAML::Node node = root[section];
  if (!node || node.IsNull()) {
    return required ? Status::InvalidArgument("missing section", section) : Status::OK();
  }
  if (!node.IsMap()) return Status::InvalidArgument("must be a map", section);
  for (const auto& kv : node) {
    const std::string name = kv.first.as<std::string>();
    const std::string key = section + "." + name;
    auto it = readers.find(name);
    if (it == readers.end()) return Status::InvalidArgument("unknown key", key);
    try {
      FLEET_RETURN_IF_ERROR(it->second(kv.second, key));
    } catch (const YAML::Exception& e) {
      return Status::InvalidArgument("wrong type of value (" + std::string(e.what()) + ")", key);
    }
  }
  return Status::OK();
}

KeyReader IntIn(int* out, int min, int max = INT32_MAX) {
  return [out, min, max](const YAML::Node& v, const std::string& key) {
    const int64_t x = v.as<int64_t>();
    if (x < min || x > max) {
      return Status::InvalidArgument(
          "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
              std::to_string(x),
          key);
    }
    *out = static_cast<int>(x);
    return Status::OK();
  };
}

KeyReader String(std::string* out) {
  return [out](const YAML::Node& v, const std::string&) {
    *out = v.as<std::string>();
    return Status::OK();
  };
}

KeyReader Widths(std::vector<int>* out, size_t min_count) {
  return [out, min_count](const YAML::Node& v, const std::string& key) {
    if (!v.IsSequence()) return Status::InvalidArgument("must be a list of widths", key);
    out->clear();
    for (const auto& e : v) {
      const int64_t w = e.as<int64_t>();
      if (w < 1 || w > kMaxWidth) {
        return Status::InvalidArgument("every width must be in [1, " + std::to_string(kMaxWidth) +
                                           "], got " + std::to_string(w),
                                       key);
      }
      out->push_back(static_cast<int>(w));
    }
    if (out->size() < min_count || out->size() > kMaxLayers) {
      return Status::InvalidArgument("needs " + std::to_string(min_count) + ".." +
                                         std::to_string(kMaxLayers) + " widths",
                                     key);
    }
    // The weights between consecutive layers, checked before any is
    // allocated (the dense table's own bound is the same).
    int64_t weights = 0;
    for (size_t i = 1; i < out->size(); ++i) weights += int64_t{(*out)[i - 1]} * (*out)[i];
    if (weights > kMaxLayerWeights) {
      return Status::InvalidArgument("the layers have " + std::to_string(weights) +
                                         " weights, more than the " +
                                         std::to_string(kMaxLayerWeights) + " allowed",
                                     key);
    }
    return Status::OK();
  };
}

}  // namespace

Result<WorkerConfig> ParseWorkerConfig(const YAML::Node& root) {
  WorkerConfig c;
  std::string kind;
  bool dense_table_given = false;
  int sparse_table = 0, dense_table = 1;
  int64_t seed = 1;
  FLEET_RETURN_IF_ERROR(ReadSection(
      root, "model", /*required=*/true,
      {{"kind", String(&kind)},
       {"sparse_table", IntIn(&sparse_table, 0)},
       {"dense_table",
        [&](const YAML::Node& v, const std::string& key) {
          dense_table_given = true;
          return IntIn(&dense_table, 0)(v, key);
        }},
       {"hidden", Widths(&c.model.hidden, 1)},
       {"sizes", Widths(&c.model.sizes, 2)},
       {"seed", [&](const YAML::Node& v, const std::string&) {
          seed = v.as<int64_t>();
          return Status::OK();
        }}}));
  const WorkerTaskType* type = FindWorkerTaskType(kind);
  if (type == nullptr) {
    return Status::InvalidArgument("must be one of " + WorkerTaskKinds() + ", got '" + kind + "'",
                                   "model.kind");
  }
  c.model.kind = kind;
  if (!dense_table_given) dense_table = static_cast<int>(type->default_dense_table);
  c.model.sparse_table = static_cast<uint32_t>(sparse_table);
  c.model.dense_table = static_cast<uint32_t>(dense_table);
  c.model.seed = static_cast<uint64_t>(seed);

  FLEET_RETURN_IF_ERROR(ReadSection(root, "data", /*required=*/true,
                                    {{"train", String(&c.data.train)},
                                     {"test", String(&c.data.test)},
                                     {"oracle", String(&c.data.oracle)},
                                     {"train_images", String(&c.data.train_images)},
                                     {"train_labels", String(&c.data.train_labels)},
                                     {"test_images", String(&c.data.test_images)},
                                     {"test_labels", String(&c.data.test_labels)}}));
  FLEET_RETURN_IF_ERROR(type->check_config(c));

  FLEET_RETURN_IF_ERROR(ReadSection(root, "train", /*required=*/false,
                                    {{"batch_size", IntIn(&c.train.batch_size, 1, kMaxBatchSize)},
                                     {"epochs", IntIn(&c.train.epochs, 0, kMaxEpochs)},
                                     {"log_interval", IntIn(&c.train.log_interval, 0)},
                                     {"blas_threads", IntIn(&c.train.blas_threads, 1, kMaxBlasThreads)},
                                     {"save_dir", String(&c.train.save_dir)},
                                     {"save_every_epochs", IntIn(&c.train.save_every_epochs, 0)}}));
  return c;
}

namespace {

// Errors without the file's name (the caller says which input is to blame).
Result<PsJobConfig> ParseWithOverrides(const YAML::Node& file,
                                       std::span<const std::string> overrides) {
  YAML::Node root = YAML::Clone(file);
  for (const std::string& o : overrides) FLEET_RETURN_IF_ERROR(ApplyOverride(root, o));
  PsJobConfig c;
  FLEET_ASSIGN_OR_RETURN(c.job, ps::ParseJobConfig(root));
  FLEET_ASSIGN_OR_RETURN(c.worker, ParseWorkerConfig(c.job.root));
  return c;
}

}  // namespace

Result<PsJobConfig> LoadPsJobConfig(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  FLEET_ASSIGN_OR_RETURN(YAML::Node file, LoadYamlFile(path));
  auto all = ParseWithOverrides(file, overrides);
  if (all.ok()) return all;
  // Blame the first override after which the config stops parsing, or the
  // file when it fails on its own: a few parses of a small tree.
  const std::span<const std::string> list(overrides);
  for (size_t n = 0; n < list.size(); ++n) {
    if (auto next = ParseWithOverrides(file, list.first(n + 1)); !next.ok()) {
      if (n == 0 && !ParseWithOverrides(file, {}).ok()) break;
      return next.status().WithContext("-o " + list[n]);
    }
  }
  return all.status().WithContext(path);
}

}  // namespace fleet::worker
