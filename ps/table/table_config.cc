#include "ps/table/table_config.h"

#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace fleet::ps {
namespace {

// Reads the keys of one YAML map. Each Get marks its key as known; Finish
// reports the first key nobody asked for, so the accepted keys are exactly
// the Get calls (no separate list to keep in step).
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string prefix) : node_(node), prefix_(std::move(prefix)) {}

  Status CheckIsMap() const {
    if (!node_.IsMap()) return Status::InvalidArgument("expected a map", Name(""));
    return Status::OK();
  }

  template <typename T>
  Status Get(std::string_view key, T* out, bool required = false) {
    known_.insert(std::string(key));
    const YAML::Node v = node_[std::string(key)];
    if (!v.IsDefined() || v.IsNull()) {
      if (required) return Status::InvalidArgument("missing required key", Name(key));
      return Status::OK();
    }
    if (!v.IsScalar()) return Status::InvalidArgument("expected a scalar", Name(key));
    try {
      *out = v.as<T>();
    } catch (const YAML::Exception& e) {
      return Status::InvalidArgument(absl::StrCat("bad value '", v.Scalar(), "'"), Name(key));
    }
    return Status::OK();
  }

  // A string key that must be one of `names`; stores the matching enum.
  template <typename E, size_t N>
  Status GetEnum(std::string_view key, const std::pair<const char*, E> (&names)[N], E* out,
                 bool required = false) {
    std::string s;
    const bool present = node_[std::string(key)].IsDefined();
    FLEET_RETURN_IF_ERROR(Get(key, &s, required));
    if (!present) return Status::OK();
    std::string allowed;
    for (const auto& [name, value] : names) {
      if (s == name) {
        *out = value;
        return Status::OK();
      }
      absl::StrAppend(&allowed, allowed.empty() ? "" : "|", name);
    }
    return Status::InvalidArgument(absl::StrCat("'", s, "' is not one of ", allowed), Name(key));
  }

  // The sub-map under `key` (an undefined node when absent).
  YAML::Node Sub(std::string_view key) {
    known_.insert(std::string(key));
    return node_[std::string(key)];
  }

  Status Finish() const {
    for (const auto& kv : node_) {
      const std::string k = kv.first.as<std::string>();
      if (!known_.count(k)) return Status::InvalidArgument("unknown key", Name(k));
    }
    return Status::OK();
  }

  std::string Name(std::string_view key) const { return absl::StrCat(prefix_, std::string(key)); }

 private:
  const YAML::Node& node_;
  const std::string prefix_;
  std::set<std::string> known_;
};

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

template <typename E, size_t N>
const char* NameOf(const std::pair<const char*, E> (&names)[N], E value) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return "?";
}

// Parses an optional sub-map with `parse`, which fills the reader's keys.
template <typename Fn>
Status ParseSection(MapReader& parent, std::string_view key, Fn parse) {
  YAML::Node sub = parent.Sub(key);
  if (!sub.IsDefined() || sub.IsNull()) return Status::OK();
  MapReader r(sub, parent.Name(key) + ".");
  FLEET_RETURN_IF_ERROR(r.CheckIsMap());
  FLEET_RETURN_IF_ERROR(parse(r));
  return r.Finish();
}

Status Bad(std::string_view key, std::string_view what) { return Status::InvalidArgument(what, key); }

}  // namespace

Result<TableConfig> ParseTableConfig(const YAML::Node& node) {
  TableConfig c;
  MapReader r(node, "");
  FLEET_RETURN_IF_ERROR(r.CheckIsMap());
  FLEET_RETURN_IF_ERROR(r.Get("id", &c.id, /*required=*/true));
  FLEET_RETURN_IF_ERROR(r.GetEnum("kind", kKinds, &c.kind, /*required=*/true));
  FLEET_RETURN_IF_ERROR(r.Get("dim", &c.dim, /*required=*/true));
  FLEET_RETURN_IF_ERROR(r.GetEnum("accessor", kAccessors, &c.accessor));
  FLEET_RETURN_IF_ERROR(r.Get("shard_num", &c.shard_num));
  FLEET_RETURN_IF_ERROR(r.Get("local_shard_num", &c.local_shard_num));
  FLEET_RETURN_IF_ERROR(ParseSection(r, "optimizer", [&](MapReader& o) {
    OptimizerConfig& p = c.optimizer;
    FLEET_RETURN_IF_ERROR(o.GetEnum("rule", kRules, &p.rule));
    FLEET_RETURN_IF_ERROR(o.Get("learning_rate", &p.learning_rate));
    FLEET_RETURN_IF_ERROR(o.Get("l2_decay", &p.l2_decay));
    FLEET_RETURN_IF_ERROR(o.GetEnum("clip_mode", kClipModes, &p.clip_mode));
    FLEET_RETURN_IF_ERROR(o.Get("clip_threshold", &p.clip_threshold));
    FLEET_RETURN_IF_ERROR(o.Get("initial_g2sum", &p.initial_g2sum));
    FLEET_RETURN_IF_ERROR(o.Get("beta1", &p.beta1));
    FLEET_RETURN_IF_ERROR(o.Get("beta2", &p.beta2));
    return o.Get("epsilon", &p.epsilon);
  }));
  FLEET_RETURN_IF_ERROR(ParseSection(r, "initializer", [&](MapReader& o) {
    InitializerConfig& p = c.initializer;
    FLEET_RETURN_IF_ERROR(o.GetEnum("kind", kInits, &p.kind));
    FLEET_RETURN_IF_ERROR(o.Get("seed", &p.seed));
    FLEET_RETURN_IF_ERROR(o.Get("range", &p.range));
    return o.Get("std", &p.stddev);
  }));
  FLEET_RETURN_IF_ERROR(ParseSection(r, "ctr", [&](MapReader& o) {
    CtrAccessorConfig& p = c.ctr;
    FLEET_RETURN_IF_ERROR(o.Get("embed_dim", &p.embed_dim));
    FLEET_RETURN_IF_ERROR(o.Get("nonclk_coeff", &p.nonclk_coeff));
    FLEET_RETURN_IF_ERROR(o.Get("click_coeff", &p.click_coeff));
    FLEET_RETURN_IF_ERROR(o.Get("embedx_threshold", &p.embedx_threshold));
    FLEET_RETURN_IF_ERROR(o.Get("show_click_decay", &p.show_click_decay));
    FLEET_RETURN_IF_ERROR(o.Get("delete_after_unseen_passes", &p.delete_after_unseen_passes));
    return o.Get("delete_threshold", &p.delete_threshold);
  }));
  FLEET_RETURN_IF_ERROR(r.Get("max_rows_per_server", &c.max_rows_per_server));
  FLEET_RETURN_IF_ERROR(ParseSection(
      r, "admission", [&](MapReader& o) { return o.Get("min_count", &c.admission_min_count); }));
  FLEET_RETURN_IF_ERROR(r.Finish());
  FLEET_RETURN_IF_ERROR(ValidateTableConfig(c));
  return c;
}

Status ValidateTableConfig(const TableConfig& c) {
  if (c.dim < 1) return Bad("dim", "must be >= 1");
  if (c.kind == TableKind::kSparse && c.dim > kMaxSparseDim)
    return Bad("dim", absl::StrCat("must be <= ", kMaxSparseDim, " for a sparse table, got ", c.dim));
  if (c.kind == TableKind::kDense && c.dim > kMaxDenseDim)
    return Bad("dim", absl::StrCat("must be <= ", kMaxDenseDim, " for a dense table, got ", c.dim));
  if (c.kind == TableKind::kDense && c.accessor != AccessorKind::kPlain)
    return Bad("accessor", "a dense table takes the plain accessor only");
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
  return Status::OK();
}

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
    if (saved.accessor == AccessorKind::kCtr && saved.ctr.embed_dim != current.ctr.embed_dim)
      return mismatch("ctr.embed_dim", saved.ctr.embed_dim, current.ctr.embed_dim);
  }
  return Status::OK();
}

}  // namespace fleet::ps
