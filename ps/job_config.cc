#include "ps/job_config.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

DEFINE_string(config, "", "Job YAML (configs/*.yaml). Env: FLEET_CONFIG.");
DEFINE_string(override, "",
              "';'-separated Key.sub=value overrides of the job YAML, applied in order. "
              "Env: FLEET_OVERRIDES.");

namespace fleet::ps {

HelpGroup JobConfigHelpGroup() {
  return {"Job config", {GflagsHelpFlag("config", "job.yaml"), GflagsHelpFlag("override", "'K=V;K=V'")}};
}

std::string_view SyncModeName(SyncMode mode) {
  switch (mode) {
    case SyncMode::kSync:
      return "sync";
    case SyncMode::kAsync:
      return "async";
    case SyncMode::kGeo:
      return "geo";
  }
  return "unknown";
}

const TableConfig* JobConfig::table(uint32_t id) const {
  for (const auto& t : tables) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

namespace {

Status CheckKeys(const YAML::Node& section, const std::string& name,
                 const std::set<std::string>& allowed) {
  if (!section.IsMap()) return Status::InvalidArgument("must be a map", name);
  for (const auto& kv : section) {
    const std::string key = kv.first.as<std::string>();
    if (!allowed.count(key)) {
      return Status::InvalidArgument("unknown key", absl::StrCat(name, ".", key));
    }
  }
  return Status::OK();
}

template <typename T>
Status ReadScalar(const YAML::Node& section, const std::string& section_name,
                  const std::string& key, T* out) {
  const YAML::Node v = section[key];
  if (!v.IsDefined() || v.IsNull()) return Status::OK();
  try {
    *out = v.as<T>();
  } catch (const YAML::Exception&) {
    return Status::InvalidArgument("wrong type of value", absl::StrCat(section_name, ".", key));
  }
  return Status::OK();
}

// An integer key in [min, max]; the error names the key, range and value.
template <typename T>
Status ReadInt(const YAML::Node& section, const std::string& section_name, const std::string& key,
               int64_t min, int64_t max, T* out) {
  int64_t v = static_cast<int64_t>(*out);
  FLEET_RETURN_IF_ERROR(ReadScalar(section, section_name, key, &v));
  if (v < min || v > max) {
    return Status::InvalidArgument(absl::StrCat("must be in [", min, ", ", max, "], got ", v),
                                   absl::StrCat(section_name, ".", key));
  }
  *out = static_cast<T>(v);
  return Status::OK();
}

Status ParseHeter(const YAML::Node& node, HeterConfig* out) {
  if (!node.IsDefined() || node.IsNull()) return Status::OK();
  const std::string section = "Distributed.heter";
  FLEET_RETURN_IF_ERROR(
      CheckKeys(node, section, {"pipeline_depth", "micro_batches", "down_timeout_ms"}));
  FLEET_RETURN_IF_ERROR(
      ReadInt(node, section, "pipeline_depth", 1, kMaxPipelineDepth, &out->pipeline_depth));
  FLEET_RETURN_IF_ERROR(
      ReadInt(node, section, "micro_batches", 1, kMaxMicroBatches, &out->micro_batches));
  int64_t down_ms = out->down_timeout.count();
  FLEET_RETURN_IF_ERROR(ReadInt(node, section, "down_timeout_ms", 1, kMaxTimeoutMs, &down_ms));
  out->down_timeout = std::chrono::milliseconds(down_ms);
  return Status::OK();
}

Status ParseDistributed(const YAML::Node& node, DistributedConfig* out) {
  if (!node.IsDefined() || node.IsNull()) return Status::OK();
  FLEET_RETURN_IF_ERROR(CheckKeys(
      node, "Distributed",
      {"mode", "k_steps", "max_merge", "timeout_ms", "max_request_bytes", "busy_poll_us", "heter",
       "auth", "server_restart_timeout_ms"}));
  std::string mode = "sync";
  FLEET_RETURN_IF_ERROR(ReadScalar(node, "Distributed", "mode", &mode));
  if (mode == "sync") {
    out->mode = SyncMode::kSync;
  } else if (mode == "async") {
    out->mode = SyncMode::kAsync;
  } else if (mode == "geo") {
    out->mode = SyncMode::kGeo;
  } else {
    return Status::InvalidArgument(absl::StrCat("must be sync, async or geo, got '", mode, "'"),
                                   "Distributed.mode");
  }
  FLEET_RETURN_IF_ERROR(ReadInt(node, "Distributed", "k_steps", 1, kMaxKSteps, &out->k_steps));
  FLEET_RETURN_IF_ERROR(
      ReadInt(node, "Distributed", "max_merge", 1, kMaxMaxMerge, &out->max_merge));
  int64_t timeout_ms = out->timeout.count();
  FLEET_RETURN_IF_ERROR(ReadInt(node, "Distributed", "timeout_ms", 1, kMaxTimeoutMs, &timeout_ms));
  out->timeout = std::chrono::milliseconds(timeout_ms);
  FLEET_RETURN_IF_ERROR(ReadInt(node, "Distributed", "max_request_bytes", 0, kMaxRequestBytes,
                                &out->max_request_bytes));
  int64_t busy_poll_us = out->busy_poll.count();
  FLEET_RETURN_IF_ERROR(ReadScalar(node, "Distributed", "busy_poll_us", &busy_poll_us));
  if (busy_poll_us < 0 || busy_poll_us > 1'000'000)
    return Status::InvalidArgument("must be 0..1000000 (microseconds)", "Distributed.busy_poll_us");
  out->busy_poll = std::chrono::microseconds(busy_poll_us);
  FLEET_RETURN_IF_ERROR(ReadScalar(node, "Distributed", "auth", &out->auth));
  int64_t restart_ms = out->server_restart_timeout.count();
  FLEET_RETURN_IF_ERROR(ReadInt(node, "Distributed", "server_restart_timeout_ms", 0, kMaxTimeoutMs,
                                &restart_ms));
  out->server_restart_timeout = std::chrono::milliseconds(restart_ms);
  return ParseHeter(node["heter"], &out->heter);
}

Status ParseServer(const YAML::Node& node, ServerConfig* out) {
  if (!node.IsDefined() || node.IsNull()) return Status::OK();
  FLEET_RETURN_IF_ERROR(CheckKeys(node, "server",
                                  {"threads", "save_dir", "load_dir", "recovery_dir",
                                   "checkpoint_every", "push_log_sync"}));
  FLEET_RETURN_IF_ERROR(ReadInt(node, "server", "threads", 1, kMaxServerThreads, &out->threads));
  FLEET_RETURN_IF_ERROR(ReadScalar(node, "server", "save_dir", &out->save_dir));
  FLEET_RETURN_IF_ERROR(ReadScalar(node, "server", "load_dir", &out->load_dir));
  FLEET_RETURN_IF_ERROR(ReadScalar(node, "server", "recovery_dir", &out->recovery_dir));
  FLEET_RETURN_IF_ERROR(ReadInt(node, "server", "checkpoint_every", 1, kMaxCheckpointEvery,
                                &out->checkpoint_every));
  std::string sync = std::string(LogSyncName(out->push_log_sync));
  FLEET_RETURN_IF_ERROR(ReadScalar(node, "server", "push_log_sync", &sync));
  if (sync == "none") {
    out->push_log_sync = LogSync::kNone;
  } else if (sync == "batch") {
    out->push_log_sync = LogSync::kBatch;
  } else if (sync == "every") {
    out->push_log_sync = LogSync::kEvery;
  } else {
    return Status::InvalidArgument(
        absl::StrCat("must be none, batch or every, got '", sync, "'"), "server.push_log_sync");
  }
  if (!out->recovery_dir.empty() &&
      (out->recovery_dir == out->save_dir || out->recovery_dir == out->load_dir)) {
    // The recovery checkpoints are private to each server and rotate; a
    // save or load directory shared with them would mix the two kinds.
    return Status::InvalidArgument("must differ from server.save_dir and server.load_dir",
                                   "server.recovery_dir");
  }
  return Status::OK();
}

}  // namespace

Result<JobConfig> ParseJobConfig(YAML::Node root) {
  JobConfig job;
  job.root = root;
  if (!root.IsMap()) return Status::InvalidArgument("job config must be a YAML map");
  // A misspelt section ("Distribued", "trian") would otherwise leave every
  // key of it at its default without a word.
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (std::find(std::begin(kJobSections), std::end(kJobSections), key) ==
        std::end(kJobSections)) {
      return Status::InvalidArgument(
          absl::StrCat("unknown top-level section; a job config takes ",
                       absl::StrJoin(kJobSections, ", ")),
          key);
    }
  }
  FLEET_RETURN_IF_ERROR(ParseDistributed(root["Distributed"], &job.distributed));
  FLEET_RETURN_IF_ERROR(ParseServer(root["server"], &job.server));
  const YAML::Node tables = root["tables"];
  if (tables.IsDefined() && !tables.IsNull()) {
    if (!tables.IsSequence()) return Status::InvalidArgument("must be a list", "tables");
    std::set<uint32_t> ids;
    for (size_t i = 0; i < tables.size(); ++i) {
      auto table = ParseTableConfig(tables[i]);
      if (!table.ok()) return table.status().WithContext(absl::StrCat("tables.", i));
      if (!ids.insert(table->id).second) {
        return Status::InvalidArgument(absl::StrCat("duplicate table id ", table->id),
                                       absl::StrCat("tables.", i));
      }
      job.tables.push_back(std::move(table).value());
    }
  }
  return job;
}

Result<JobConfig> LoadJobConfig(const std::string& path,
                                const std::vector<std::string>& overrides) {
  FLEET_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  for (const auto& o : overrides) {
    FLEET_RETURN_IF_ERROR(ApplyOverride(root, o).WithContext(path));
  }
  auto job = ParseJobConfig(root);
  if (!job.ok()) return job.status().WithContext(path);
  return job;
}

}  // namespace fleet::ps

namespace fleet::ps {

Result<JobConfig> JobConfigFromFlagsAndEnv(
    const std::function<std::optional<std::string>(const std::string&)>& env) {
  auto pick = [&](const char* flag, const std::string& value, const char* var) {
    if (!gflags::GetCommandLineFlagInfoOrDie(flag).is_default) return value;
    return env(var).value_or("");
  };
  const std::string path = pick("config", FLAGS_config, "FLEET_CONFIG");
  if (path.empty())
    return Status::InvalidArgument("no job config: pass --config or set FLEET_CONFIG");
  std::vector<std::string> overrides;
  for (auto part : absl::StrSplit(pick("override", FLAGS_override, "FLEET_OVERRIDES"), ';')) {
    if (!part.empty()) overrides.emplace_back(part);
  }
  return LoadJobConfig(path, overrides);
}

}  // namespace fleet::ps
