#include "ps/server_app.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <algorithm>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "comm/absl_mutex_mode.h"
#include "comm/cluster.h"
#include "comm/job_liveness.h"
#include "comm/kv_store.h"
#include "comm/process_context.h"
#include "comm/program_help.h"
#include "ps/ps_process.h"
#include "ps/server.h"

DEFINE_string(endpoint, "",
              "ip:port this server listens on; port 0 picks a free port. Default: this rank's "
              "entry of --servers, else 127.0.0.1:0.");
DEFINE_double(status_every_s, 30,
              "Seconds between the server's status lines (requests/s by kind, bytes in and out, "
              "rows per table, memory, push-log records to replay); 0 = none.");
DEFINE_int32(num_workers, 0,
             "Workers pushing to this server (sync mode waits for all). Default: the length of "
             "--workers / FLEET_WORKERS, else 1.");

namespace fleet::ps {
namespace {

// How often the server reports its statistics to the KV store, and how long
// one report may take (it is skipped when the store is slow).
constexpr std::chrono::seconds kStatsEvery{2};
constexpr std::chrono::milliseconds kStatsBudget{500};

ProgramHelp ServerHelp() {
  ProgramHelp help{"ps_server --endpoint=ip:port --config=job.yaml [--servers=... --rank=N] [flags]",
                   "One parameter server: serves the job's sparse and dense tables to the workers "
                   "(fleetrun starts it; see README.md for starting it by hand).",
                   {{"This server",
                     {GflagsHelpFlag("endpoint", "ip:port"), GflagsHelpFlag("num_workers", "N"),
                      GflagsHelpFlag("status_every_s", "S")}},
                    JobConfigHelpGroup()}};
  help.override_flag = "override";
  for (HelpGroup& g : ClusterHelpGroups()) help.groups.push_back(std::move(g));
  return help;
}

}  // namespace

int PsServerMain(int argc, char** argv) {
  if (std::optional<int> done = ParseFlagsOrHelp(ServerHelp(), &argc, &argv, std::cout)) {
    return *done;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  UseReleaseMutexChecksInOptimizedBuilds();

  // SIGTERM: the job finished (fleetrun, when every worker exited 0): save
  // into server.save_dir and stop. SIGINT: the job was abandoned (a process
  // failed, Ctrl-C): stop without that save, so save_dir keeps the last
  // finished job's model instead of an unfinished state; server.recovery_dir
  // (when set) still holds a restartable one.
  std::atomic<PsServer*> running{nullptr};
  ProcessContextOptions context{.program = "ps_server", .role = Role::kServer};
  context.endpoint_flag = FLAGS_endpoint;
  context.watch_stop_signals = true;
  context.on_stop = [&running](int sig) {
    LOG(INFO) << "ps_server: signal " << sig
              << (sig == SIGINT ? ", stopping without the final save (the job did not finish)"
                                : ", stopping");
    if (PsServer* s = running.load()) s->RequestStop();
  };
  Result<PsProcess> process = StartPsProcess(std::move(context));
  if (!process.ok()) {
    LOG(ERROR) << "ps_server: " << process.status().ToString();
    return 2;
  }
  ProcessContext& ctx = *process->context;
  const ClusterSpec& spec = ctx.spec();
  PsServerOptions options;
  options.rank = spec.rank;
  options.num_servers = std::max<int>(1, static_cast<int>(spec.servers.size()));
  if (spec.world_size > options.num_servers) options.num_servers = spec.world_size;
  const int num_workers =
      FLAGS_num_workers > 0 ? FLAGS_num_workers : std::max<int>(1, spec.workers.size());
  options.num_workers = num_workers;
  options.endpoint = ctx.listen_endpoint();
  // The job's servers on this machine share its memory (the row quota).
  const std::string host = options.endpoint.substr(0, options.endpoint.rfind(':'));
  options.servers_on_host = std::max<int>(
      1, static_cast<int>(std::count_if(spec.servers.begin(), spec.servers.end(),
                                        [&host](const Endpoint& e) { return e.host == host; })));
  options.job = std::move(process->job);
  options.auth = std::move(process->transport_auth);
  options.restarted = ctx.restarted();

  auto server = PsServer::Create(std::move(options));
  if (!server.ok()) {
    LOG(ERROR) << "ps_server: " << server.status().ToString();
    return 2;
  }
  auto bound = server.value()->Start();
  if (!bound.ok()) {
    LOG(ERROR) << "ps_server: " << bound.status().ToString();
    return 2;
  }
  running.store(server.value().get());
  if (ctx.stop_requested().load()) server.value()->RequestStop();

  if (Status s = ctx.Announce(bound.value()); !s.ok()) {
    LOG(ERROR) << "ps_server: " << s.ToString();
    return 2;
  }
  LOG(INFO) << "ps_server " << spec.rank << " listening on " << bound.value() << "; "
            << spec.ToString();
  // Started by hand: the job's other processes are watched through the KV
  // store, and the server ends with the job (every worker done: saved as on
  // SIGTERM; a process failed: as on SIGINT).
  const std::string name = "ps_server " + std::to_string(spec.rank);
  Result<std::unique_ptr<JobLiveness>> liveness = WatchPeersByHand(ctx, name, num_workers);
  if (!liveness.ok()) {
    LOG(ERROR) << name << ": " << liveness.status().ToString();
    return 1;
  }
  JobLiveness* watch = liveness->get();

  // A server serves until told to stop; the loop bounds each wait and logs
  // the status line every --status_every_s.
  auto next_status = std::chrono::steady_clock::now();
  const auto status_every = std::chrono::milliseconds(static_cast<int64_t>(FLAGS_status_every_s * 1000));
  auto wait = std::chrono::milliseconds(watch != nullptr ? 250 : 1000);
  if (status_every.count() > 0) {
    next_status += status_every;
    wait = std::min(wait, status_every);
  }
  // With a KV store, the server's traffic and tables are reported there
  // every kStatsEvery, for fleetrun's /metrics (best effort).
  std::unique_ptr<KvStoreClient> stats_kv;
  if (spec.kv_endpoint) {
    stats_kv = std::make_unique<KvStoreClient>(
        spec.kv_endpoint->ToString(), spec.job_id,
        KvStoreClientOptions{.request_timeout = kStatsBudget, .auth = spec.credentials});
  }
  const std::string stats_key = absl::StrCat(std::string(PsServer::kStatsKeyPrefix), spec.rank);
  auto next_stats = std::chrono::steady_clock::now();
  bool job_done = false;
  while (!server.value()->WaitForStopRequest(wait)) {
    const auto now = std::chrono::steady_clock::now();
    if (status_every.count() > 0 && now >= next_status) {
      next_status += status_every;
      LOG(INFO) << server.value()->StatusLine();
    }
    if (stats_kv != nullptr && now >= next_stats) {
      next_stats = now + kStatsEvery;
      (void)stats_kv->Set(stats_key, server.value()->StatsReply().SerializeAsString());
    }
    if (watch != nullptr && (ctx.stop_requested().load() || watch->WorkersDone())) {
      job_done = watch->WorkersDone() && !watch->failure();
      if (job_done) LOG(INFO) << name << ": every worker is done; stopping";
      server.value()->RequestStop();
    }
  }
  // The last interval's traffic too, so every request shows in some line.
  if (status_every.count() > 0) LOG(INFO) << server.value()->StatusLine();
  const bool failed_elsewhere = watch != nullptr && watch->failure().has_value();
  const bool save = !ctx.ReceivedSignal(SIGINT) && !failed_elsewhere &&
                    (watch == nullptr || job_done || ctx.ReceivedSignal(SIGTERM));
  Status saved = server.value()->Shutdown(save);
  running.store(nullptr);
  if (watch != nullptr) {
    if (!saved.ok()) watch->MarkFailed(name + ": " + saved.ToString());
    watch->Stop();
  }
  if (failed_elsewhere) return 1;
  return saved.ok() ? 0 : 1;
}

}  // namespace fleet::ps
