#include "ps/job_config.h"

#include <gflags/gflags.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

DEFINE_string(config, "", "Job YAML (configs/*.yaml). Env: FLEET_CONFIG.");
DEFINE_string(override, "",
              "';'-separated Key.sub=value overrides of the job YAML, applied in order. "
              "Env: FLEET_OVERRIDES.");

namespace fleet::ps {

HelpGroup JobConfigHelpGroup() {
  return {"Job config",
          {GflagsHelpFlag("config", "job.yaml"),
           {"-o", "Key.sub=value",
            "override one key of the job YAML (repeatable; appended to --override)", ""},
           GflagsHelpFlag("override", "'K=V;K=V'")}};
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

VanOptions JobVanOptions(const JobConfig& job, std::shared_ptr<const JobAuth> auth,
                         bool encrypt) {
  VanOptions van;
  van.busy_poll = job.distributed.busy_poll;
  van.max_message_bytes = MessageLimit(job);
  van.auth = std::move(auth);
  van.encrypt = encrypt;
  return van;
}

int64_t MessageLimit(const JobConfig& job) {
  if (job.distributed.max_message_bytes != 0) return job.distributed.max_message_bytes;
  int64_t limit = std::max(int64_t{64} << 20, 4 * job.distributed.max_request_bytes);
  for (const TableConfig& t : job.tables) {
    // A dense pull or push moves a server's range of the table in one frame;
    // a request's header and keys ride in frames of their own.
    if (t.kind == TableKind::kDense) {
      limit = std::max(limit, static_cast<int64_t>(t.dim * sizeof(float)) + (int64_t{1} << 20));
    }
  }
  return limit;
}

namespace {

constexpr std::pair<const char*, SyncMode> kSyncModes[] = {
    {"sync", SyncMode::kSync}, {"async", SyncMode::kAsync}, {"geo", SyncMode::kGeo}};
constexpr std::pair<const char*, LogSync> kLogSyncs[] = {
    {"none", LogSync::kNone}, {"batch", LogSync::kBatch}, {"every", LogSync::kEvery}};

// A duration key in whole units of D, in [min, max].
template <typename D>
Status Duration(ConfigSection& s, std::string_view key, int64_t min, int64_t max, D* out) {
  int64_t count = out->count();
  FLEET_RETURN_IF_ERROR(s.Int(key, &count, min, max));
  *out = D(count);
  return Status::OK();
}

Status ParseHeter(ConfigSection& s, HeterConfig* out) {
  FLEET_RETURN_IF_ERROR(s.Int("pipeline_depth", &out->pipeline_depth, 1, kMaxPipelineDepth));
  FLEET_RETURN_IF_ERROR(s.Int("micro_batches", &out->micro_batches, 1, kMaxMicroBatches));
  return Duration(s, "down_timeout_ms", 1, kMaxTimeoutMs, &out->down_timeout);
}

Status ParseDistributed(ConfigSection& s, DistributedConfig* out) {
  FLEET_RETURN_IF_ERROR(s.Enum("mode", kSyncModes, &out->mode));
  FLEET_RETURN_IF_ERROR(s.Int("k_steps", &out->k_steps, 1, kMaxKSteps));
  FLEET_RETURN_IF_ERROR(s.Int("max_merge", &out->max_merge, 1, kMaxMaxMerge));
  FLEET_RETURN_IF_ERROR(Duration(s, "timeout_ms", 1, kMaxTimeoutMs, &out->timeout));
  FLEET_RETURN_IF_ERROR(s.Int("max_request_bytes", &out->max_request_bytes, 0, kMaxRequestBytes));
  FLEET_RETURN_IF_ERROR(s.Int("max_message_bytes", &out->max_message_bytes, 0, kMaxMessageBytes));
  if (out->max_message_bytes != 0 && out->max_message_bytes < kMinMessageBytes) {
    return s.Error("max_message_bytes", absl::StrCat("must be 0 (derived) or at least ",
                                                     kMinMessageBytes, ", got ",
                                                     out->max_message_bytes));
  }
  FLEET_RETURN_IF_ERROR(Duration(s, "busy_poll_us", 0, kMaxBusyPollUs, &out->busy_poll));
  FLEET_RETURN_IF_ERROR(s.Bool("auth", &out->auth));
  FLEET_RETURN_IF_ERROR(
      Duration(s, "server_restart_timeout_ms", 0, kMaxTimeoutMs, &out->server_restart_timeout));
  return s.Section("heter", [&](ConfigSection& h) { return ParseHeter(h, &out->heter); });
}

Status ParseServer(ConfigSection& s, ServerConfig* out) {
  FLEET_RETURN_IF_ERROR(s.Int("threads", &out->threads, 1, kMaxServerThreads));
  FLEET_RETURN_IF_ERROR(s.String("save_dir", &out->save_dir));
  FLEET_RETURN_IF_ERROR(s.String("load_dir", &out->load_dir));
  FLEET_RETURN_IF_ERROR(s.String("recovery_dir", &out->recovery_dir));
  FLEET_RETURN_IF_ERROR(s.Int("checkpoint_every", &out->checkpoint_every, 1, kMaxCheckpointEvery));
  FLEET_RETURN_IF_ERROR(
      s.Int("checkpoint_every_mib", &out->checkpoint_every_mib, 1, int64_t{1} << 20));
  FLEET_RETURN_IF_ERROR(s.Bool("keep_recovery", &out->keep_recovery));
  FLEET_RETURN_IF_ERROR(s.Enum("push_log_sync", kLogSyncs, &out->push_log_sync));
  if (!out->recovery_dir.empty() &&
      (out->recovery_dir == out->save_dir || out->recovery_dir == out->load_dir)) {
    // The recovery checkpoints are private to each server and rotate; a
    // save or load directory shared with them would mix the two kinds.
    return s.Error("recovery_dir", "must differ from server.save_dir and server.load_dir");
  }
  return Status::OK();
}

Status ParseTables(ConfigSection& top, std::vector<TableConfig>* out) {
  std::vector<ConfigSection> entries;
  FLEET_RETURN_IF_ERROR(top.Entries("tables", &entries));
  std::set<uint32_t> ids;
  for (ConfigSection& entry : entries) {
    FLEET_ASSIGN_OR_RETURN(TableConfig table, ParseTableConfig(entry));
    if (!ids.insert(table.id).second) {
      return entry.Error("id", absl::StrCat("duplicate table id ", table.id));
    }
    out->push_back(std::move(table));
  }
  return Status::OK();
}

}  // namespace

Result<JobConfig> ParseJobConfig(const ConfigDocument& doc) {
  JobConfig job;
  job.root = doc.root();
  ConfigSection top(doc, "");
  FLEET_RETURN_IF_ERROR(top.Section(
      "Distributed", [&](ConfigSection& s) { return ParseDistributed(s, &job.distributed); }));
  FLEET_RETURN_IF_ERROR(
      top.Section("server", [&](ConfigSection& s) { return ParseServer(s, &job.server); }));
  FLEET_RETURN_IF_ERROR(ParseTables(top, &job.tables));
  for (const char* worker_section : kWorkerSections) top.Accept(worker_section);
  // A misspelt section ("Distribued", "trian") would otherwise leave every
  // key of it at its default without a word.
  FLEET_RETURN_IF_ERROR(top.Finish("unknown top-level section"));
  return job;
}

Result<JobConfig> ParseJobConfig(YAML::Node root) {
  if (!root.IsMap()) return Status::InvalidArgument("job config must be a YAML map");
  return ParseJobConfig(ConfigDocument::FromNode(root));
}

Result<ConfigDocument> LoadJobDocument(const std::string& path,
                                       const std::vector<std::string>& overrides) {
  FLEET_ASSIGN_OR_RETURN(ConfigDocument doc, ConfigDocument::Load(path));
  for (const auto& o : overrides) FLEET_RETURN_IF_ERROR(doc.Override(o).WithContext("-o " + o));
  return doc;
}

Result<JobConfig> LoadJobConfig(const std::string& path,
                                const std::vector<std::string>& overrides) {
  FLEET_ASSIGN_OR_RETURN(ConfigDocument doc, LoadJobDocument(path, overrides));
  return ParseJobConfig(doc);
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
