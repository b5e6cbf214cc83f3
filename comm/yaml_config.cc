#include "comm/yaml_config.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace fleet {
namespace {

// InvalidArgument for the first map under `node` (depth first) that holds a
// key twice; `path` is the dotted key of `node`.
Status CheckUniqueKeys(const YAML::Node& node, const std::string& path, std::string_view source) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      FLEET_RETURN_IF_ERROR(CheckUniqueKeys(node[i], absl::StrCat(path, path.empty() ? "" : ".", i),
                                            source));
    }
    return Status::OK();
  }
  if (!node.IsMap()) return Status::OK();
  std::map<std::string, int> first_line;  // scalar key -> its 1-based line
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : YAML::Dump(kv.first);
    const std::string full = path.empty() ? key : absl::StrCat(path, ".", key);
    const int line = kv.first.Mark().line + 1;
    if (auto [it, fresh] = first_line.emplace(key, line); !fresh) {
      return Status::InvalidArgument(absl::StrCat("duplicate key ", full, " at line ", line,
                                                  " (first at line ", it->second, ")"),
                                     source);
    }
    FLEET_RETURN_IF_ERROR(CheckUniqueKeys(kv.second, full, source));
  }
  return Status::OK();
}

}  // namespace

Result<YAML::Node> ParseYaml(std::string_view text, std::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(absl::StrCat("YAML syntax error: ", e.what()), source);
  }
  FLEET_RETURN_IF_ERROR(CheckUniqueKeys(root, "", source));
  return root;
}

Result<YAML::Node> LoadYamlFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot open config", path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IOError("cannot read config", path);
  return ParseYaml(text.str(), path);
}

Status ApplyOverride(YAML::Node root, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return Status::InvalidArgument("override must look like Key.sub=value", assignment);
  }
  const std::vector<std::string> path = absl::StrSplit(assignment.substr(0, eq), '.');
  const std::string value = assignment.substr(eq + 1);
  // yaml-cpp's operator[] on a non-const node returns a reference-like node;
  // reset() walks without copying the subtree.
  YAML::Node node;
  node.reset(root);
  for (size_t i = 0; i < path.size(); ++i) {
    const std::string& part = path[i];
    if (part.empty()) return Status::InvalidArgument("empty key in override", assignment);
    size_t index = 0;
    YAML::Node next;
    if (node.IsSequence()) {
      if (!absl::SimpleAtoi(part, &index) || index >= node.size()) {
        return Status::InvalidArgument(
            absl::StrCat("'", part, "' is not an index of a list of ", node.size()), assignment);
      }
      next.reset(node[index]);
    } else if (node.IsMap() || node.IsNull() || !node.IsDefined()) {
      next.reset(node[part]);
    } else {
      return Status::InvalidArgument(absl::StrCat("'", part, "' is below a plain value"),
                                     assignment);
    }
    if (i + 1 == path.size()) {
      // Parsed as YAML so "[1, 2]" or "{a: 1}" work; a plain word stays a string.
      try {
        next = YAML::Load(value);
      } catch (const YAML::Exception&) {
        next = value;
      }
    }
    node.reset(next);
  }
  return Status::OK();
}

namespace {

using SourceMap = std::map<std::string, std::string>;

// A map key as text; a key that is itself a list or map (YAML allows it) as
// its YAML, so it is reported as an unknown key instead of throwing.
std::string KeyText(const YAML::Node& key) {
  return key.IsScalar() ? key.Scalar() : YAML::Dump(key);
}

std::string Join(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : std::string(prefix) + "." + std::string(key);
}

// Records `source` for `prefix` and every key below it.
void RecordAll(const YAML::Node& node, const std::string& prefix, const std::string& source,
               SourceMap* sources) {
  if (!prefix.empty()) (*sources)[prefix] = source;
  if (!node.IsMap()) return;
  for (const auto& kv : node) {
    RecordAll(kv.second, Join(prefix, KeyText(kv.first)), source, sources);
  }
}

// Forgets the sources of `prefix` and of every key below it.
void EraseUnder(const std::string& prefix, SourceMap* sources) {
  auto it = sources->lower_bound(prefix);
  while (it != sources->end() &&
         (it->first == prefix ||
          (it->first.size() > prefix.size() && it->first.compare(0, prefix.size(), prefix) == 0 &&
           it->first[prefix.size()] == '.'))) {
    it = sources->erase(it);
  }
}

bool ReplacesBase(const YAML::Node& child) {
  if (!child.IsMap()) return false;
  const YAML::Node flag = child["_inherited_"];
  if (!flag.IsDefined() || flag.IsNull()) return false;
  try {
    return !flag.as<bool>();
  } catch (const YAML::Exception&) {
    return false;  // reported as an unknown key by the section that holds it
  }
}

// Merges `child` (read from `source`) into `base` under `prefix`.
void Merge(YAML::Node base, const YAML::Node& child, const std::string& prefix,
           const std::string& source, SourceMap* sources) {
  for (const auto& kv : child) {
    const std::string key = KeyText(kv.first);
    if (key == "_inherited_") continue;
    const std::string full = Join(prefix, key);
    YAML::Node target = base[key];
    if (kv.second.IsMap() && target.IsMap() && !ReplacesBase(kv.second)) {
      Merge(target, kv.second, full, source, sources);
      continue;
    }
    YAML::Node value = YAML::Clone(kv.second);
    if (value.IsMap()) value.remove("_inherited_");
    base[key] = value;
    EraseUnder(full, sources);
    RecordAll(value, full, source, sources);
  }
}

struct Loaded {
  YAML::Node root;
  SourceMap sources;
};

Result<Loaded> LoadChain(const std::string& path, const std::string* text,
                         std::vector<std::string>* chain) {
  FLEET_ASSIGN_OR_RETURN(YAML::Node file,
                         text != nullptr ? ParseYaml(*text, path) : LoadYamlFile(path));
  if (file.IsNull() || !file.IsDefined()) file = YAML::Node(YAML::NodeType::Map);
  if (!file.IsMap()) return Status::InvalidArgument("a config must be a YAML map", path);

  Loaded out;
  const YAML::Node base_name = file["_base_"];
  if (base_name.IsDefined() && !base_name.IsNull()) {
    if (!base_name.IsScalar()) {
      return Status::InvalidArgument("_base_ must be a file name", path);
    }
    namespace fs = std::filesystem;
    const fs::path base_path =
        (fs::path(path).parent_path() / base_name.Scalar()).lexically_normal();
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(base_path, ec);
    const std::string id = ec ? base_path.string() : canonical.string();
    for (const auto& seen : *chain) {
      if (seen == id) {
        return Status::InvalidArgument(
            absl::StrCat("_base_ files form a cycle: ", absl::StrJoin(*chain, " -> "), " -> ", id),
            path);
      }
    }
    chain->push_back(id);
    auto base = LoadChain(base_path.string(), nullptr, chain);
    chain->pop_back();
    if (!base.ok()) {
      if (base.status().IsNotFound()) {
        return Status::NotFound(
            absl::StrCat("cannot open _base_ file ", base_path.string(), " named by"), path);
      }
      return base.status();
    }
    out = std::move(base).value();
  } else {
    out.root = YAML::Node(YAML::NodeType::Map);
  }
  file.remove("_base_");
  Merge(out.root, file, "", path, &out.sources);
  return out;
}

}  // namespace

Result<ConfigDocument> ConfigDocument::Build(const std::string& path, const std::string* text) {
  std::vector<std::string> chain;
  std::error_code ec;
  const auto canonical = std::filesystem::weakly_canonical(path, ec);
  chain.push_back(ec ? path : canonical.string());
  FLEET_ASSIGN_OR_RETURN(Loaded loaded, LoadChain(path, text, &chain));
  ConfigDocument doc;
  doc.path_ = text == nullptr ? path : "";
  doc.root_ = loaded.root;
  doc.source_ = std::move(loaded.sources);
  return doc;
}

Result<ConfigDocument> ConfigDocument::Load(const std::string& path) {
  return Build(path, nullptr);
}

Result<ConfigDocument> ConfigDocument::FromString(const std::string& yaml,
                                                  const std::string& source) {
  return Build(source, &yaml);
}

ConfigDocument ConfigDocument::FromNode(const YAML::Node& root) {
  ConfigDocument doc;
  // A deep copy, read through const access only: yaml-cpp's node assignment
  // and non-const lookups write the shared tree's memory bookkeeping, and
  // the threads of an in-process job each parse the one job root.
  if (root.IsDefined() && !root.IsNull()) doc.root_ = YAML::Clone(root);
  return doc;
}

Status ConfigDocument::Override(const std::string& assignment) {
  FLEET_RETURN_IF_ERROR(ApplyOverride(root_, assignment));
  const std::string key = assignment.substr(0, assignment.find('='));
  EraseUnder(key, &source_);
  source_[key] = absl::StrCat("-o ", assignment);
  return Status::OK();
}

std::string ConfigDocument::SourceOf(std::string_view dotted_key) const {
  std::string key(dotted_key);
  if (auto it = source_.find(key); it != source_.end()) return it->second;
  // A key only its children were recorded for (an override that created it).
  if (auto it = source_.lower_bound(key + ".");
      it != source_.end() && it->first.starts_with(key + ".")) {
    return it->second;
  }
  while (true) {
    const size_t dot = key.rfind('.');
    if (dot == std::string::npos) return "";
    key.resize(dot);
    if (auto it = source_.find(key); it != source_.end()) return it->second;
  }
}

std::string ConfigDocument::Cite(std::string_view dotted_key) const {
  std::string source = SourceOf(dotted_key);
  if (source.empty()) source = path_;  // a key the file lacks: the file is to blame
  return source.empty() ? "" : " (from " + source + ")";
}

Status ConfigDocument::Error(std::string_view dotted_key, std::string_view what) const {
  return Status::InvalidArgument(std::string(dotted_key) + ": " + std::string(what) +
                                 Cite(dotted_key));
}

// ---------------------------------------------------------------------------

namespace {

std::string Describe(const YAML::Node& v) {
  if (v.IsScalar()) return absl::StrCat("'", v.Scalar(), "'");
  if (v.IsSequence()) return "a list";
  if (v.IsMap()) return "a map";
  return "nothing";
}

}  // namespace

ConfigSection::ConfigSection(const ConfigDocument* doc, std::string path, YAML::Node node)
    : doc_(doc), path_(std::move(path)) {
  node_.reset(node);
}

ConfigSection::ConfigSection(const ConfigDocument& doc, std::string path)
    : doc_(&doc), path_(std::move(path)) {
  YAML::Node node;
  node.reset(doc.root());
  if (!path_.empty()) {
    for (const auto& part : absl::StrSplit(path_, '.')) {
      // A missing key yields an invalid node on which type queries throw:
      // check IsDefined() first. Const lookups never insert into the document.
      if (!node.IsDefined() || !node.IsMap()) {
        node.reset(YAML::Node());
        break;
      }
      const YAML::Node& parent = node;
      YAML::Node next = parent[std::string(part)];
      if (!next.IsDefined()) {
        node.reset(YAML::Node());
        break;
      }
      node.reset(next);
    }
  }
  node_.reset(node);
}

bool ConfigSection::Has(std::string_view key) const {
  if (!node_.IsMap()) return false;
  const YAML::Node& map = node_;
  const YAML::Node v = map[std::string(key)];
  return v.IsDefined() && !v.IsNull();
}

std::string ConfigSection::FullKey(std::string_view key) const { return Join(path_, key); }

Status ConfigSection::Error(std::string_view key, std::string_view what) const {
  return doc_->Error(FullKey(key), what);
}

Status ConfigSection::ShapeError() const {
  return doc_->Error(path_.empty() ? "the config" : path_,
                     absl::StrCat("must be a map, got ", Describe(node_)));
}

namespace {

// The scalar `v` as a T, or nothing when it is not a scalar or not a T.
template <typename T>
std::optional<T> As(const YAML::Node& v) {
  if (!v.IsScalar()) return std::nullopt;
  try {
    return v.as<T>();
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

}  // namespace

Status ConfigSection::Lookup(std::string_view key, std::optional<YAML::Node>* v) {
  known_.emplace(key);
  if (present() && !node_.IsMap()) return ShapeError();
  if (!Has(key)) return Status::OK();
  const YAML::Node& map = node_;
  *v = map[std::string(key)];
  return Status::OK();
}

namespace {

// "in [min, max]", or one side when the other is the type's own limit.
template <typename T>
std::string RangeText(T min, T max) {
  if (max == std::numeric_limits<T>::max()) return absl::StrCat(">= ", min);
  if (min == std::numeric_limits<T>::min()) return absl::StrCat("<= ", max);
  return absl::StrCat("in [", min, ", ", max, "]");
}

}  // namespace

Status ConfigSection::ReadInt64(std::string_view key, int64_t min, int64_t max, int64_t* out) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  const std::optional<int64_t> x = As<int64_t>(*v);
  if (!x) return Error(key, absl::StrCat("must be an integer, got ", Describe(*v)));
  if (*x < min || *x > max) {
    return Error(key, absl::StrCat("must be ", RangeText(min, max), ", got ", *x));
  }
  *out = *x;
  return Status::OK();
}

Status ConfigSection::ReadUint64(std::string_view key, uint64_t min, uint64_t max, uint64_t* out) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  // yaml-cpp 0.7 reads "-1" as an unsigned 2^64 - 1.
  if (v->IsScalar() && v->Scalar().starts_with('-') && As<int64_t>(*v)) {
    return Error(key, absl::StrCat("must be ", RangeText(min, max), ", got ", v->Scalar()));
  }
  const std::optional<uint64_t> x = As<uint64_t>(*v);
  if (!x) return Error(key, absl::StrCat("must be an integer, got ", Describe(*v)));
  if (*x < min || *x > max) {
    return Error(key, absl::StrCat("must be ", RangeText(min, max), ", got ", *x));
  }
  *out = *x;
  return Status::OK();
}

Status ConfigSection::OptionalInt(std::string_view key, std::optional<int64_t>* out, int64_t min,
                                  int64_t max) {
  int64_t x = 0;
  if (!Has(key)) return ReadInt64(key, min, max, &x);  // marks it known, checks the shape
  FLEET_RETURN_IF_ERROR(ReadInt64(key, min, max, &x));
  *out = x;
  return Status::OK();
}

Status ConfigSection::ReadDouble(std::string_view key, const YAML::Node& v, std::string_view what,
                                 double min, double max, double* out) const {
  const std::optional<double> x = As<double>(v);
  if (!x) return Error(key, absl::StrCat(std::string(what), "must be a number, got ", Describe(v)));
  if (!std::isfinite(*x) || *x < min || *x > max) {
    const std::string range = min == -DBL_MAX && max == DBL_MAX
                                  ? "a finite number"
                                  : absl::StrCat("in [", min, ", ", max, "]");
    return Error(key, absl::StrCat(std::string(what), "must be ", range, ", got ", v.Scalar()));
  }
  *out = *x;
  return Status::OK();
}

Status ConfigSection::Double(std::string_view key, double* out, double min, double max) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  return ReadDouble(key, *v, "", min, max, out);
}

Status ConfigSection::Float(std::string_view key, float* out, double min, double max) {
  double x = *out;
  FLEET_RETURN_IF_ERROR(Double(key, &x, std::max(min, double{-FLT_MAX}), std::min(max, double{FLT_MAX})));
  *out = static_cast<float>(x);
  return Status::OK();
}

Status ConfigSection::Bool(std::string_view key, bool* out) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  const std::optional<bool> x = As<bool>(*v);
  if (!x) return Error(key, absl::StrCat("must be true or false, got ", Describe(*v)));
  *out = *x;
  return Status::OK();
}

Status ConfigSection::String(std::string_view key, std::string* out) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  if (!v->IsScalar()) return Error(key, absl::StrCat("must be a string, got ", Describe(*v)));
  *out = v->Scalar();
  return Status::OK();
}

Status ConfigSection::Choice(std::string_view key, std::string* out,
                             const std::vector<std::string>& allowed) {
  if (!Has(key)) return String(key, out);  // absent: the default stands
  std::string value;
  FLEET_RETURN_IF_ERROR(String(key, &value));
  for (const auto& a : allowed) {
    if (value == a) {
      *out = value;
      return Status::OK();
    }
  }
  return Error(
      key, absl::StrCat("must be one of ", absl::StrJoin(allowed, ", "), "; got '", value, "'"));
}

Status ConfigSection::DoubleList(std::string_view key, std::vector<double>* out, size_t min_count,
                                 size_t max_count, double min, double max) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  if (!v->IsSequence()) return Error(key, absl::StrCat("must be a list, got ", Describe(*v)));
  if (v->size() < min_count || v->size() > max_count) {
    return Error(
        key, absl::StrCat("must have ", min_count, "..", max_count, " entries, got ", v->size()));
  }
  std::vector<double> values(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    FLEET_RETURN_IF_ERROR(
        ReadDouble(key, (*v)[i], absl::StrCat("entry ", i, " "), min, max, &values[i]));
  }
  *out = std::move(values);
  return Status::OK();
}

Status ConfigSection::IntList(std::string_view key, std::vector<int64_t>* out, size_t min_count,
                              size_t max_count, int64_t min, int64_t max) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  if (!v->IsSequence()) return Error(key, absl::StrCat("must be a list, got ", Describe(*v)));
  std::vector<int64_t> values(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const YAML::Node& entry = (*v)[i];
    const std::optional<int64_t> x = As<int64_t>(entry);
    if (!x) {
      return Error(key, absl::StrCat("entry ", i, " must be an integer, got ", Describe(entry)));
    }
    if (*x < min || *x > max) {
      return Error(key, absl::StrCat("entry ", i, " must be ", RangeText(min, max), ", got ", *x));
    }
    values[i] = *x;
  }
  if (values.size() < min_count || values.size() > max_count) {
    return Error(key,
                 absl::StrCat("must have ", min_count, "..", max_count, " entries, got ", values.size()));
  }
  *out = std::move(values);
  return Status::OK();
}

Status ConfigSection::ChoiceList(std::string_view key, std::vector<std::string>* out,
                                 const std::vector<std::string>& allowed) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  if (!v) return Status::OK();
  if (!v->IsSequence() || v->size() == 0) {
    return Error(key, absl::StrCat("must be a non-empty list of ", absl::StrJoin(allowed, ", "),
                                   "; got ", Describe(*v)));
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < v->size(); ++i) {
    const YAML::Node& entry = (*v)[i];
    const std::string text = entry.IsScalar() ? entry.Scalar() : Describe(entry);
    if (std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
      return Error(key, absl::StrCat("entry ", i, " must be one of ", absl::StrJoin(allowed, ", "),
                                     "; got '", text, "'"));
    }
    if (std::find(values.begin(), values.end(), text) != values.end()) {
      return Error(key, absl::StrCat("entry ", i, " '", text, "' is listed twice"));
    }
    values.push_back(text);
  }
  *out = std::move(values);
  return Status::OK();
}

void ConfigSection::Accept(std::string_view key) { known_.emplace(key); }

Status ConfigSection::Require(std::string_view key, std::string_view what) {
  known_.emplace(key);
  if (present() && !node_.IsMap()) return ShapeError();
  if (Has(key)) return Status::OK();
  const std::string full = FullKey(key);
  return Status::InvalidArgument(absl::StrCat("missing ", std::string(what), ": ", full, doc_->Cite(full)));
}

ConfigSection ConfigSection::Sub(std::string_view key) {
  known_.emplace(key);
  YAML::Node child;  // null: absent, or this section is not a map (reported by its Finish)
  if (node_.IsDefined() && node_.IsMap()) {
    const YAML::Node& map = node_;  // a const lookup never inserts
    if (YAML::Node v = map[std::string(key)]; v.IsDefined()) child.reset(v);
  }
  return ConfigSection(doc_, FullKey(key), child);
}

Status ConfigSection::Section(std::string_view key,
                              const std::function<Status(ConfigSection&)>& read) {
  ConfigSection sub = Sub(key);
  FLEET_RETURN_IF_ERROR(read(sub));
  return sub.Finish();
}

Status ConfigSection::Entries(std::string_view key, std::vector<ConfigSection>* out) {
  std::optional<YAML::Node> v;
  FLEET_RETURN_IF_ERROR(Lookup(key, &v));
  out->clear();
  if (!v) return Status::OK();
  if (!v->IsSequence()) return Error(key, absl::StrCat("must be a list, got ", Describe(*v)));
  for (size_t i = 0; i < v->size(); ++i) {
    out->push_back(ConfigSection(doc_, absl::StrCat(FullKey(key), ".", i), (*v)[i]));
  }
  return Status::OK();
}

Status ConfigSection::Finish(std::string_view unknown) const {
  if (!present()) return Status::OK();
  if (!node_.IsMap()) return ShapeError();
  for (const auto& kv : node_) {
    const std::string key = KeyText(kv.first);
    if (!known_.contains(key)) {
      return Status::InvalidArgument(absl::StrCat(
          FullKey(key), ": ", std::string(unknown), doc_->Cite(FullKey(key)), "; ",
          path_.empty() ? "the top level" : path_, " takes ", absl::StrJoin(known_, ", ")));
    }
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------

Result<ConfigArgs> ParseConfigArgs(const std::vector<std::string>& args) {
  ConfigArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value_of = [&](std::string_view flag, std::string* value) -> Status {
      if (a == flag) {
        if (i + 1 >= args.size()) return Status::InvalidArgument("needs a value", a);
        *value = args[++i];
      } else {
        *value = a.substr(flag.size() + 1);
      }
      return Status::OK();
    };
    auto is = [&](std::string_view flag) {
      return a == flag || (flag.starts_with("--") && a.starts_with(std::string(flag) + "="));
    };
    if (is("-c") || is("--config")) {
      std::string path;
      FLEET_RETURN_IF_ERROR(value_of(is("-c") ? "-c" : "--config", &path));
      if (!out.config.empty()) {
        return Status::InvalidArgument(
            absl::StrCat("config given twice (", out.config, " and ", path, ")"), "-c");
      }
      out.config = path;
    } else if (is("-o") || is("--override")) {
      std::string assignment;
      FLEET_RETURN_IF_ERROR(value_of(is("-o") ? "-o" : "--override", &assignment));
      out.overrides.push_back(std::move(assignment));
    } else {
      out.rest.push_back(a);
    }
  }
  return out;
}

}  // namespace fleet
