#include "ps/table/table_config.h"

#include <functional>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace fleet::ps {
namespace {

constexpr std::pair<const char*, TableKind> kKinds[] = {{"dense", TableKind::kDense},
                                                       {"sparse", TableKind::kSparse}};
constexpr std::pair<const char*, AccessorKind> kAccessors[] = {{"plain", AccessorKind::kPlain},
                                                              {"ctr", AccessorKind::kCtr}};
constexpr std::pair<const char*, OptimizerKind> kRules[] = {
    {"sgd", OptimizerKind::kSgd}, {"adagrad", OptimizerKind::kAdagrad}, {"adam", OptimizerKind::kAdam}};
constexpr std::pair<const char*, ClipMode> kClipModes[] = {
    {"none", ClipMode::kNone}, {"value", ClipMode::kValue}, {"norm", ClipMode::kNorm}};
constexpr std::pair<const char*, InitializerKind> kInits[] = {{"zeros", InitializerKind::kZeros},
                                                             {"uniform", InitializerKind::kUniform},
                                                             {"gaussian", InitializerKind::kGaussian}};
constexpr std::pair<const char*, Partition> kPartitions[] = {{"hash", Partition::kHash},
                                                             {"range", Partition::kRange}};
constexpr std::pair<const char*, StorageKind> kStorageKinds[] = {{"memory", StorageKind::kMemory},
                                                                 {"ssd", StorageKind::kSsd}};

template <typename E, size_t N>
const char* NameOf(const std::pair<const char*, E> (&names)[N], E value) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return "?";
}

// Reports a key that breaks a rule of CheckTableConfig.
using BadKey = std::function<Status(std::string_view key, std::string_view what)>;

// The cross-field and range rules of a table, each reported through `bad`.
Status CheckTableConfig(const TableConfig& c, const BadKey& bad);

}  // namespace

Result<TableConfig> ParseTableConfig(ConfigSection& r) {
  TableConfig c;
  FLEET_RETURN_IF_ERROR(r.Require("id"));
  FLEET_RETURN_IF_ERROR(r.Int("id", &c.id));
  FLEET_RETURN_IF_ERROR(r.Require("kind"));
  FLEET_RETURN_IF_ERROR(r.Enum("kind", kKinds, &c.kind));
  FLEET_RETURN_IF_ERROR(r.Require("dim"));
  FLEET_RETURN_IF_ERROR(r.Int("dim", &c.dim));
  FLEET_RETURN_IF_ERROR(r.Enum("accessor", kAccessors, &c.accessor));
  FLEET_RETURN_IF_ERROR(r.Int("shard_num", &c.shard_num));
  FLEET_RETURN_IF_ERROR(r.Int("local_shard_num", &c.local_shard_num));
  FLEET_RETURN_IF_ERROR(r.Enum("partition", kPartitions, &c.partition));
  FLEET_RETURN_IF_ERROR(r.Section("optimizer", [&](ConfigSection& o) {
    OptimizerConfig& p = c.optimizer;
    FLEET_RETURN_IF_ERROR(o.Enum("rule", kRules, &p.rule));
    FLEET_RETURN_IF_ERROR(o.Float("learning_rate", &p.learning_rate));
    FLEET_RETURN_IF_ERROR(o.Float("l2_decay", &p.l2_decay));
    FLEET_RETURN_IF_ERROR(o.Enum("clip_mode", kClipModes, &p.clip_mode));
    FLEET_RETURN_IF_ERROR(o.Float("clip_threshold", &p.clip_threshold));
    FLEET_RETURN_IF_ERROR(o.Float("initial_g2sum", &p.initial_g2sum));
    FLEET_RETURN_IF_ERROR(o.Float("beta1", &p.beta1));
    FLEET_RETURN_IF_ERROR(o.Float("beta2", &p.beta2));
    return o.Float("epsilon", &p.epsilon);
  }));
  FLEET_RETURN_IF_ERROR(r.Section("initializer", [&](ConfigSection& o) {
    InitializerConfig& p = c.initializer;
    FLEET_RETURN_IF_ERROR(o.Enum("kind", kInits, &p.kind));
    FLEET_RETURN_IF_ERROR(o.Int("seed", &p.seed));
    FLEET_RETURN_IF_ERROR(o.Float("range", &p.range));
    return o.Float("std", &p.stddev);
  }));
  FLEET_RETURN_IF_ERROR(r.Section("ctr", [&](ConfigSection& o) {
    CtrAccessorConfig& p = c.ctr;
    FLEET_RETURN_IF_ERROR(o.Int("embed_dim", &p.embed_dim));
    FLEET_RETURN_IF_ERROR(o.Float("nonclk_coeff", &p.nonclk_coeff));
    FLEET_RETURN_IF_ERROR(o.Float("click_coeff", &p.click_coeff));
    FLEET_RETURN_IF_ERROR(o.Float("embedx_threshold", &p.embedx_threshold));
    FLEET_RETURN_IF_ERROR(o.Float("show_click_decay", &p.show_click_decay));
    FLEET_RETURN_IF_ERROR(o.Int("delete_after_unseen_passes", &p.delete_after_unseen_passes));
    return o.Float("delete_threshold", &p.delete_threshold);
  }));
  FLEET_RETURN_IF_ERROR(r.Int("max_rows_per_server", &c.max_rows_per_server));
  FLEET_RETURN_IF_ERROR(r.Section(
      "admission", [&](ConfigSection& o) { return o.Int("min_count", &c.admission_min_count); }));
  FLEET_RETURN_IF_ERROR(r.Section("storage", [&](ConfigSection& o) {
    StorageConfig& p = c.storage;
    FLEET_RETURN_IF_ERROR(o.Enum("kind", kStorageKinds, &p.kind));
    FLEET_RETURN_IF_ERROR(o.String("path", &p.path));
    FLEET_RETURN_IF_ERROR(o.Int("cache_rows", &p.cache_rows));
    FLEET_RETURN_IF_ERROR(o.Int("evict_unseen_passes", &p.evict_unseen_passes));
    FLEET_RETURN_IF_ERROR(o.Int("block_cache_mb", &p.block_cache_mb));
    return o.Int("write_buffer_mb", &p.write_buffer_mb);
  }));
  FLEET_RETURN_IF_ERROR(r.Finish());
  FLEET_RETURN_IF_ERROR(CheckTableConfig(
      c, [&](std::string_view key, std::string_view what) { return r.Error(key, what); }));
  return c;
}

Result<TableConfig> ParseTableConfig(const YAML::Node& node) {
  const ConfigDocument doc = ConfigDocument::FromNode(node);
  ConfigSection r(doc, "");
  return ParseTableConfig(r);
}

Status ValidateTableConfig(const TableConfig& c) {
  return CheckTableConfig(c, [](std::string_view key, std::string_view what) {
    return Status::InvalidArgument(what, key);
  });
}

namespace {

Status CheckTableConfig(const TableConfig& c, const BadKey& Bad) {
  if (c.dim < 1) return Bad("dim", "must be >= 1");
  if (c.kind == TableKind::kSparse && c.dim > kMaxSparseDim)
    return Bad("dim", absl::StrCat("must be <= ", kMaxSparseDim, " for a sparse table, got ", c.dim));
  if (c.kind == TableKind::kDense && c.dim > kMaxDenseDim)
    return Bad("dim", absl::StrCat("must be <= ", kMaxDenseDim, " for a dense table, got ", c.dim));
  if (c.kind == TableKind::kDense && c.accessor != AccessorKind::kPlain)
    return Bad("accessor", "a dense table takes the plain accessor only");
  if (c.kind == TableKind::kDense && c.partition != Partition::kHash)
    return Bad("partition",
               "a dense table is split by element ranges; partition is for sparse tables");
  if (c.shard_num < 1 || c.shard_num > kMaxShardNum)
    return Bad("shard_num", absl::StrCat("must be in [1, ", kMaxShardNum, "], got ", c.shard_num));
  if (c.local_shard_num < 1 || c.local_shard_num > kMaxLocalShardNum)
    return Bad("local_shard_num",
               absl::StrCat("must be in [1, ", kMaxLocalShardNum, "], got ", c.local_shard_num));
  const OptimizerConfig& o = c.optimizer;
  if (!(o.learning_rate >= 0)) return Bad("optimizer.learning_rate", "must be >= 0");
  if (!(o.l2_decay >= 0)) return Bad("optimizer.l2_decay", "must be >= 0");
  if (o.clip_mode != ClipMode::kNone && !(o.clip_threshold > 0))
    return Bad("optimizer.clip_threshold", "must be > 0 when clip_mode is value or norm");
  if (!(o.initial_g2sum >= 0)) return Bad("optimizer.initial_g2sum", "must be >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return Bad("optimizer.beta1", "must be in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return Bad("optimizer.beta2", "must be in [0, 1)");
  if (!(o.epsilon > 0)) return Bad("optimizer.epsilon", "must be > 0");
  if (!(c.initializer.range >= 0)) return Bad("initializer.range", "must be >= 0");
  if (!(c.initializer.stddev >= 0)) return Bad("initializer.std", "must be >= 0");
  const CtrAccessorConfig& t = c.ctr;
  if (t.embed_dim < 1 || t.embed_dim > 1024) return Bad("ctr.embed_dim", "must be in [1, 1024]");
  if (!(t.show_click_decay > 0 && t.show_click_decay <= 1))
    return Bad("ctr.show_click_decay", "must be in (0, 1]");
  if (t.delete_after_unseen_passes < 1) return Bad("ctr.delete_after_unseen_passes", "must be >= 1");
  if (c.admission_min_count < 1) return Bad("admission.min_count", "must be >= 1");
  const StorageConfig& st = c.storage;
  if (st.kind == StorageKind::kSsd) {
    if (c.kind != TableKind::kSparse) return Bad("storage.kind", "ssd is for sparse tables only");
    if (c.accessor != AccessorKind::kCtr)
      return Bad("storage.kind",
                 "ssd needs accessor: ctr (its show/click statistics choose the rows kept in "
                 "memory; a plain table has none)");
    if (st.path.empty()) return Bad("storage.path", "required with storage.kind ssd");
    if (c.max_rows_per_server != 0)
      return Bad("max_rows_per_server",
                 "not supported with storage.kind ssd (storage.cache_rows bounds the rows in "
                 "memory; the disk tier has no row quota): leave it 0");
  }
  if (st.cache_rows < 1) return Bad("storage.cache_rows", "must be >= 1");
  if (st.evict_unseen_passes < 1) return Bad("storage.evict_unseen_passes", "must be >= 1");
  if (st.block_cache_mb < 1 || st.block_cache_mb > (1u << 20))
    return Bad("storage.block_cache_mb", "must be in [1, 1048576]");
  if (st.write_buffer_mb < 1 || st.write_buffer_mb > (1u << 16))
    return Bad("storage.write_buffer_mb", "must be in [1, 65536]");
  return Status::OK();
}

}  // namespace

std::string TableConfigToYaml(const TableConfig& c) {
  YAML::Emitter e;
  e.SetFloatPrecision(9);
  e << YAML::BeginMap;
  e << YAML::Key << "id" << YAML::Value << c.id;
  e << YAML::Key << "kind" << YAML::Value << NameOf(kKinds, c.kind);
  e << YAML::Key << "dim" << YAML::Value << c.dim;
  e << YAML::Key << "accessor" << YAML::Value << NameOf(kAccessors, c.accessor);
  e << YAML::Key << "shard_num" << YAML::Value << c.shard_num;
  e << YAML::Key << "local_shard_num" << YAML::Value << c.local_shard_num;
  e << YAML::Key << "partition" << YAML::Value << NameOf(kPartitions, c.partition);
  const OptimizerConfig& o = c.optimizer;
  e << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "rule" << YAML::Value << NameOf(kRules, o.rule);
  e << YAML::Key << "learning_rate" << YAML::Value << o.learning_rate;
  e << YAML::Key << "l2_decay" << YAML::Value << o.l2_decay;
  e << YAML::Key << "clip_mode" << YAML::Value << NameOf(kClipModes, o.clip_mode);
  e << YAML::Key << "clip_threshold" << YAML::Value << o.clip_threshold;
  e << YAML::Key << "initial_g2sum" << YAML::Value << o.initial_g2sum;
  e << YAML::Key << "beta1" << YAML::Value << o.beta1;
  e << YAML::Key << "beta2" << YAML::Value << o.beta2;
  e << YAML::Key << "epsilon" << YAML::Value << o.epsilon;
  e << YAML::EndMap;
  const InitializerConfig& i = c.initializer;
  e << YAML::Key << "initializer" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << NameOf(kInits, i.kind);
  e << YAML::Key << "seed" << YAML::Value << i.seed;
  e << YAML::Key << "range" << YAML::Value << i.range;
  e << YAML::Key << "std" << YAML::Value << i.stddev;
  e << YAML::EndMap;
  const CtrAccessorConfig& t = c.ctr;
  e << YAML::Key << "ctr" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "embed_dim" << YAML::Value << t.embed_dim;
  e << YAML::Key << "nonclk_coeff" << YAML::Value << t.nonclk_coeff;
  e << YAML::Key << "click_coeff" << YAML::Value << t.click_coeff;
  e << YAML::Key << "embedx_threshold" << YAML::Value << t.embedx_threshold;
  e << YAML::Key << "show_click_decay" << YAML::Value << t.show_click_decay;
  e << YAML::Key << "delete_after_unseen_passes" << YAML::Value << t.delete_after_unseen_passes;
  e << YAML::Key << "delete_threshold" << YAML::Value << t.delete_threshold;
  e << YAML::EndMap;
  e << YAML::Key << "max_rows_per_server" << YAML::Value << c.max_rows_per_server;
  e << YAML::Key << "admission" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "min_count" << YAML::Value << c.admission_min_count;
  e << YAML::EndMap;
  const StorageConfig& st = c.storage;
  e << YAML::Key << "storage" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << NameOf(kStorageKinds, st.kind);
  e << YAML::Key << "path" << YAML::Value << st.path;
  e << YAML::Key << "cache_rows" << YAML::Value << st.cache_rows;
  e << YAML::Key << "evict_unseen_passes" << YAML::Value << st.evict_unseen_passes;
  e << YAML::Key << "block_cache_mb" << YAML::Value << st.block_cache_mb;
  e << YAML::Key << "write_buffer_mb" << YAML::Value << st.write_buffer_mb;
  e << YAML::EndMap;
  e << YAML::EndMap;
  return e.c_str();
}

Status CheckCheckpointCompatible(const TableConfig& saved, const TableConfig& current) {
  auto mismatch = [&](const char* field, auto a, auto b) {
    return Status::InvalidArgument(
        absl::StrCat("table ", current.id, " ", field, " differs: checkpoint has ", a, ", table has ", b));
  };
  if (saved.id != current.id) return mismatch("id", saved.id, current.id);
  if (saved.kind != current.kind)
    return mismatch("kind", NameOf(kKinds, saved.kind), NameOf(kKinds, current.kind));
  if (saved.dim != current.dim) return mismatch("dim", saved.dim, current.dim);
  if (saved.optimizer.rule != current.optimizer.rule)
    return mismatch("optimizer.rule", NameOf(kRules, saved.optimizer.rule), NameOf(kRules, current.optimizer.rule));
  if (saved.kind == TableKind::kSparse) {
    if (saved.accessor != current.accessor)
      return mismatch("accessor", NameOf(kAccessors, saved.accessor), NameOf(kAccessors, current.accessor));
    if (saved.shard_num != current.shard_num) return mismatch("shard_num", saved.shard_num, current.shard_num);
    // A checkpoint from before the key existed has the hash partition.
    if (saved.partition != current.partition)
      return mismatch("partition", NameOf(kPartitions, saved.partition),
                      NameOf(kPartitions, current.partition));
    if (saved.accessor == AccessorKind::kCtr && saved.ctr.embed_dim != current.ctr.embed_dim)
      return mismatch("ctr.embed_dim", saved.ctr.embed_dim, current.ctr.embed_dim);
  }
  return Status::OK();
}

}  // namespace fleet::ps
