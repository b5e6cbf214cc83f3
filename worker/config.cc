#include "worker/config.h"

#include <functional>
#include <map>
#include <set>

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

KeyReader IntAtLeast(int* out, int min) {
  return [out, min](const YAML::Node& v, const std::string& key) {
    *out = v.as<int>();
    if (*out < min) return Status::InvalidArgument("must be >= " + std::to_string(min), key);
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
      int w = e.as<int>();
      if (w < 1) return Status::InvalidArgument("every width must be >= 1", key);
      out->push_back(w);
    }
    if (out->size() < min_count) {
      return Status::InvalidArgument("needs at least " + std::to_string(min_count) + " widths",
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
       {"sparse_table", IntAtLeast(&sparse_table, 0)},
       {"dense_table",
        [&](const YAML::Node& v, const std::string& key) {
          dense_table_given = true;
          return IntAtLeast(&dense_table, 0)(v, key);
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
                                    {{"batch_size", IntAtLeast(&c.train.batch_size, 1)},
                                     {"epochs", IntAtLeast(&c.train.epochs, 0)},
                                     {"log_interval", IntAtLeast(&c.train.log_interval, 0)},
                                     {"blas_threads", IntAtLeast(&c.train.blas_threads, 1)},
                                     {"save_dir", String(&c.train.save_dir)},
                                     {"save_every_epochs", IntAtLeast(&c.train.save_every_epochs, 0)}}));
  return c;
}

}  // namespace fleet::worker
