// The one YAML config reader of FleetPS. Every config goes through it: the
// PS job config (ps/job_config.h), its table entries (ps/table/table_config.h),
// the worker sections (worker/config.h) and the GPT config
// (collective/config/gpt_config.h). Configs are in FleetX's shape: a file may
// name a base (`_base_: ./base.yaml`, relative to the file), keys merge
// recursively over the base, `-o Key.sub=value` overrides apply last, and
// every key remembers where it came from so an error can say
// "Model.hidden_size: must be >= 1, got -4 (from configs/a.yaml)" or
// "train.batchsize: unknown key; ... (from -o train.batchsize=1)".
//
//   ConfigDocument   the merged document plus the source of every key.
//   ConfigSection    typed, range-checked reads of one map of a document
//                    (bool, integers, floats, strings, choices and enums,
//                    lists, nested sections, list entries); Finish() refuses
//                    the keys nobody read (unknown keys), naming the key and
//                    the file or -o that set it.
//   ApplyOverride    one "Key.sub=value" assignment onto a YAML tree.
//   ParseConfigArgs  FleetX's command line: -c FILE, -o K=V (repeatable).
//
// Each config documents its keys in one place, beside its parser: the
// header that declares the parser (CONTRIBUTING.md, "Configs", lists them).
//
// Merging (as FleetX's parse_config): a map in the child merges into the
// base's map key by key; anything else (a scalar, a list, null) replaces the
// base's value whole. A child map holding `_inherited_: false` replaces the
// base's map instead of merging into it. `_base_` chains may be any depth; a
// file that reaches itself again is refused.
//
// Thread safety: values. A ConfigSection refers to its ConfigDocument, which
// must outlive it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cfloat>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/status.h"

namespace fleet {

// Parses YAML text (one document) and refuses what yaml-cpp accepts
// silently: a map that holds the same key twice (yaml-cpp keeps both and a
// lookup sees only the first). `source` (a file name) prefixes the errors.
// Errors: InvalidArgument for a syntax error (with its line) or a duplicate
// key (naming the key path and both lines).
Result<YAML::Node> ParseYaml(std::string_view text, std::string_view source);
// Reads and parses the file at `path` as ParseYaml does. NotFound when it
// cannot be opened.
Result<YAML::Node> LoadYamlFile(const std::string& path);

// Applies one "Key.sub=value" override to root, creating maps as needed;
// numeric path parts index sequences ("tables.0.dim=16"). The value is parsed
// as YAML, so "[1, 2]", "{a: 1}", "1.5e-4", "True" and "null" work; a plain
// word stays a string.
// Errors: InvalidArgument naming the override when it has no '=' or an
// empty key, or walks through a scalar or past the end of a list.
Status ApplyOverride(YAML::Node root, const std::string& assignment);

class ConfigDocument {
 public:
  // An empty document (every key at its default).
  ConfigDocument() : root_(YAML::NodeType::Map) {}

  // Reads `path` and its `_base_` chain and merges them.
  // Errors: NotFound (a file of the chain does not exist; the message names
  // it and the file that named it), InvalidArgument (YAML syntax with line
  // and file, a top level that is not a map, `_base_` that is not a string,
  // a cycle of `_base_` files, naming the chain).
  static Result<ConfigDocument> Load(const std::string& path);

  // A document from YAML text, for tests and programs that build one;
  // `source` names it in errors. `_base_` is resolved relative to the
  // working directory. Errors as Load.
  static Result<ConfigDocument> FromString(const std::string& yaml, const std::string& source);

  // A document over a tree built elsewhere (a checkpoint manifest's table,
  // a test's YAML::Load): no `_base_`, no sources, errors name keys only.
  // Copies the tree, so documents may be built from one tree on several
  // threads at once, and Override() never changes the tree.
  static ConfigDocument FromNode(const YAML::Node& root);

  // Applies one "Key.sub=value" and records "-o Key.sub=value" as the
  // source of Key.sub and everything under it. Errors as ApplyOverride.
  Status Override(const std::string& assignment);

  // The merged tree. Shares nodes with the document: do not modify it
  // except through Override().
  const YAML::Node& root() const { return root_; }

  // The file (or "-o ..." override) that set `dotted_key`, or of its closest
  // enclosing key that has one; "" when no input mentioned it.
  std::string SourceOf(std::string_view dotted_key) const;

  // InvalidArgument "<key>: <what> (from <source>)". A key no input set
  // (a missing one) cites the file Load() read; a FromString()/FromNode()
  // document then has no parenthesis.
  Status Error(std::string_view dotted_key, std::string_view what) const;

  // " (from <source>)" as Error() appends it for `dotted_key`, or "".
  std::string Cite(std::string_view dotted_key) const;

  // The file Load() read ("" for FromString()).
  const std::string& path() const { return path_; }

 private:
  static Result<ConfigDocument> Build(const std::string& path, const std::string* text);

  std::string path_;
  YAML::Node root_;
  std::map<std::string, std::string> source_;  // dotted key -> file or "-o ..."
};

// Typed reads of the map at `path` ("Engine.save_load") of a document.
// Every reader leaves *out untouched when the key is absent or null (so the
// caller's default stands) and returns InvalidArgument naming the full key,
// the bad value and its source when the value has the wrong type or is out
// of range. Reading a key marks it known; Finish() then refuses any other key
// present in the map, so the accepted keys are exactly the ones read.
class ConfigSection {
 public:
  // A missing or null section reads as empty (every key keeps its default).
  // A section that is not a map is reported by Finish() (and every read
  // returns that error too).
  ConfigSection(const ConfigDocument& doc, std::string path);

  const std::string& path() const { return path_; }
  // True when the map is present and not null.
  bool present() const { return node_.IsDefined() && !node_.IsNull(); }
  // True when `key` is present with a non-null value.
  bool Has(std::string_view key) const;

  // An integer of T's range within [min, max]; the error names the range.
  template <typename T>
    requires(std::integral<T> && !std::same_as<T, bool>)
  Status Int(std::string_view key, T* out,
             std::type_identity_t<T> min = std::numeric_limits<T>::min(),
             std::type_identity_t<T> max = std::numeric_limits<T>::max()) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) == sizeof(uint64_t)) {
      uint64_t x = *out;
      FLEET_RETURN_IF_ERROR(ReadUint64(key, min, max, &x));
      *out = static_cast<T>(x);
    } else {
      int64_t x = static_cast<int64_t>(*out);
      FLEET_RETURN_IF_ERROR(ReadInt64(key, static_cast<int64_t>(min), static_cast<int64_t>(max), &x));
      *out = static_cast<T>(x);
    }
    return Status::OK();
  }
  // Null or absent leaves *out as it was (std::nullopt for "not given").
  Status OptionalInt(std::string_view key, std::optional<int64_t>* out, int64_t min = INT64_MIN,
                     int64_t max = INT64_MAX);
  // A finite number in [min, max].
  Status Double(std::string_view key, double* out, double min = -DBL_MAX, double max = DBL_MAX);
  // A finite number in [min, max] that fits a float.
  Status Float(std::string_view key, float* out, double min = -FLT_MAX, double max = FLT_MAX);
  Status Bool(std::string_view key, bool* out);
  Status String(std::string_view key, std::string* out);
  // One of `allowed` (exact spelling); the error lists them.
  Status Choice(std::string_view key, std::string* out, const std::vector<std::string>& allowed);
  // Choice() over a table of {name, value}: stores the value of the name given.
  template <typename E, size_t N>
  Status Enum(std::string_view key, const std::pair<const char*, E> (&names)[N], E* out) {
    std::vector<std::string> allowed;
    for (const auto& [name, value] : names) allowed.emplace_back(name);
    std::string chosen;
    FLEET_RETURN_IF_ERROR(Choice(key, &chosen, allowed));
    for (const auto& [name, value] : names) {
      if (chosen == name) *out = value;
    }
    return Status::OK();
  }
  // A list of numbers, each in [min, max], with min_count..max_count entries.
  Status DoubleList(std::string_view key, std::vector<double>* out, size_t min_count,
                    size_t max_count, double min, double max);
  // A list of integers, each in [min, max], with min_count..max_count entries.
  Status IntList(std::string_view key, std::vector<int64_t>* out, size_t min_count,
                 size_t max_count, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  // A non-empty list of distinct entries, each one of `allowed`; the error
  // names the entry and lists the allowed ones.
  Status ChoiceList(std::string_view key, std::vector<std::string>* out,
                    const std::vector<std::string>& allowed);
  // Accepts the key with any value. For keys of FleetX configs that name
  // Python objects (collate_fn, module, op lists) and mean nothing here.
  void Accept(std::string_view key);
  // InvalidArgument "missing <what>: <path.key> (from <source>)" when `key`
  // is absent or null; marks it known.
  Status Require(std::string_view key, std::string_view what = "required key");

  // A nested section ("Engine" -> "Engine.save_load"), marked known. The
  // caller calls its Finish(); Section() does that itself.
  ConfigSection Sub(std::string_view key);
  // Reads the nested section `key` with `read`, then refuses its unknown keys.
  Status Section(std::string_view key, const std::function<Status(ConfigSection&)>& read);
  // The entries of the list at `key` as sections ("tables.0", "tables.1"),
  // marked known; none when absent or null. Each entry must be a map (its
  // reads and Finish() say so otherwise). Errors: the value is not a list.
  Status Entries(std::string_view key, std::vector<ConfigSection>* out);

  // InvalidArgument for path.key via ConfigDocument::Error.
  Status Error(std::string_view key, std::string_view what) const;

  // InvalidArgument "<path.key>: <unknown> (from <source>); <path> takes
  // <the keys read>" for the first unknown key of the map, or naming the
  // section when it is not a map. `unknown` says what an unknown key is
  // ("unknown key", or "unknown top-level section" for a job config).
  Status Finish(std::string_view unknown = "unknown key") const;

 private:
  ConfigSection(const ConfigDocument* doc, std::string path, YAML::Node node);

  std::string FullKey(std::string_view key) const;
  // Marks `key` known and sets *v to its value when present and non-null.
  // Errors: the section is not a map.
  Status Lookup(std::string_view key, std::optional<YAML::Node>* v);
  Status ReadInt64(std::string_view key, int64_t min, int64_t max, int64_t* out);
  Status ReadUint64(std::string_view key, uint64_t min, uint64_t max, uint64_t* out);
  // `v` as a number in [min, max]; `what` prefixes the error ("entry 2 ").
  Status ReadDouble(std::string_view key, const YAML::Node& v, std::string_view what, double min,
                    double max, double* out) const;
  Status ShapeError() const;

  const ConfigDocument* doc_;
  std::string path_;
  YAML::Node node_;
  std::set<std::string, std::less<>> known_;
};

// FleetX's command line. "-c FILE" / "--config FILE" / "--config=FILE"
// names the config; "-o K=V" / "--override K=V" / "--override=K=V" adds an
// override (repeatable, applied in order). Everything else is returned in
// `rest` in its order, for gflags or the program.
struct ConfigArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::vector<std::string> rest;
};
// Errors: InvalidArgument when -c or -o lacks its value or -c is given twice.
Result<ConfigArgs> ParseConfigArgs(const std::vector<std::string>& args);

}  // namespace fleet
