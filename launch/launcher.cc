#include "launch/launcher.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_split.h"
#include "comm/cluster.h"
#include "comm/file_system.h"
#include "comm/job_liveness.h"
#include "comm/kv_store.h"
#include "comm/progress_report.h"
#include "comm/shm_collective.h"
#include "launch/compat_env.h"
#include "launch/config_check.h"
#include "launch/job_page.h"
#include "launch/job_secret.h"
#include "launch/log_dir_lock.h"
#include "launch/metrics.h"
#include "launch/net.h"
#include "launch/peer_watch.h"
#include "launch/supervisor.h"
#include "ps/ps.pb.h"
#include "ps/server.h"

namespace fleet::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kTailLines = 20;
constexpr milliseconds kPollTick{100};
// Between two looks at the KV store while waiting for others (publishes,
// node rendezvous, done markers): often enough to add little latency, rare
// enough to be negligible load.
constexpr milliseconds kStoreTick{200};
// Between two reads of the processes' progress reports.
constexpr milliseconds kProgressPollEvery{2000};
// What one progress read may take (PollProgress).
constexpr milliseconds kProgressPollBudget{200};
// Log lines of each process the job page shows.
constexpr size_t kPageTailLines = 12;
// Between two "still waiting for ..." lines of a rendezvous.
constexpr milliseconds kWaitNoteEvery{5000};

milliseconds Seconds(double s) { return milliseconds(static_cast<int64_t>(s * 1000)); }

std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+=.,:/@%") ==
                        std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string JoinInts(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
  return out;
}

// The "still waiting" lines of one bounded wait: at the first failed try,
// then every kWaitNoteEvery, so no user (and no test on a loaded machine)
// depends on how long the wait lasts.
class WaitNote {
 public:
  WaitNote(std::FILE* out, milliseconds limit) : out_(out), limit_(limit) {}
  void Say(const std::string& what) {
    if (Clock::now() < next_) return;
    next_ = Clock::now() + kWaitNoteEvery;
    const double waited = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(out_, "fleetrun: still waiting (%.0f of %.0f s) for %s\n", waited,
                 std::chrono::duration<double>(limit_).count(), what.c_str());
    std::fflush(out_);
  }

 private:
  std::FILE* const out_;
  const milliseconds limit_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point next_ = start_;
};

class Launcher {
 public:
  Launcher(std::vector<std::string> args, LaunchOptions options, JobLayout job, int wake_fd, LauncherIo io)
      : args_(std::move(args)),
        opts_(std::move(options)),
        job_(std::move(job)),
        io_(io),
        grace_(Seconds(opts_.grace_period_s)),
        rendezvous_(Seconds(opts_.rendezvous_timeout_s)),
        sup_(SupervisorOptions{.wake_fd = wake_fd, .tee_out = io.out}) {}

  // Runs the job and ends with its one-line status.
  int Run();
  // Removes the shared-memory segments the job's processes left behind (a
  // collective rank 0 killed during its rendezvous cannot). Call after Run().
  void RemoveShmLeftovers();
  // Says why this host will not start and, in a multi-host job, tells the
  // other hosts (AnnounceRefusal); returns the exit code (2).
  int Refuse(const std::string& why);

 private:
  int RunJob();
  // Reads the processes' progress/<role>/<rank> reports and the servers'
  // statistics into metrics_ and page_, and brings the page's process
  // table up to date (at most every kProgressPollEvery).
  void PollProgress();
  // The job page's process table: this host's processes; on a job over
  // several hosts the others' too, which each fleetrun publishes in the
  // store (page/hosts/<host>).
  void UpdatePageProcesses();
  // How the job page names this host.
  std::string PageHostName() const;
  void NoteExit(size_t index, int wait_status);
  std::string JobStatusLine(int rc) const;
  // Each returns an exit code when the job must end now, nullopt to go on.
  std::optional<int> StartRole(Role role, const std::vector<int>& ranks);
  std::optional<int> WaitPublished(Role role, const std::vector<int>& ranks);
  std::optional<int> CollectiveRendezvous();
  // On a host that does not serve the KV store: waits (up to
  // --rendezvous_timeout) until the store answers, so hosts may start in
  // any order; fails at once when it refuses this host's credential.
  std::optional<int> WaitForStore();
  // Which host serves the KV store and how it is started, for wait lines.
  std::string StoreHostHint() const;
  // On a host that does not serve the store, when a process failed: the
  // line naming the store's host when the store is gone (the process most
  // likely failed because of it), nullopt when the store answers.
  std::optional<std::string> StoreHostLost();
  // Free ports for programs not written for FleetPS (launch/compat_env.h).
  std::optional<int> PickCompatPorts();
  std::optional<int> HandleEvents(const std::vector<Supervisor::Event>& events);
  // Polls the supervisor once; the exit code when something ended the job.
  std::optional<int> Tick(milliseconds timeout);
  // Multi-host jobs: starts heartbeating and watching the other hosts
  // (launch/peer_watch.h). `self_id`/`self_name` name this host.
  void StartPeerWatch(const std::string& self_id, const std::string& self_name,
                      std::vector<PeerWatchOptions::Peer> peers, std::string processes = "");
  // A PS cluster on several machines: each host is known by its addresses
  // and watches the job's other addresses. An exit code when this host
  // may not (re)join the job.
  std::optional<int> StartPsPeerWatch();
  // Before a host starts watching: a fleetrun for a host that already
  // joined (its heartbeat is in the store) is a restart of one that died,
  // which rejoins under --max_restart in a PS job (host_generation_), or a
  // second one by mistake; both are refused otherwise, with exit 2.
  std::optional<int> RejoinOrRefuse(const std::string& self_id, const std::string& self_name);
  // A PS cluster: this machine's addresses in the job (those of its
  // processes), sorted.
  std::set<std::string> LocalJobAddresses() const;
  // The address the job knows this machine by (one of its own), for the
  // store client's source address; "" on one machine, when it is loopback
  // or not known to be this machine's.
  std::string SourceAddress() const;
  // This host's name for its own files in a log folder the job's hosts may
  // share: its address in a multi-host job, "" for a job on one machine.
  std::string HostTag() const;

  // This host failed (`what` names the process or the cause): tells the
  // other hosts at once, before the processes are stopped.
  void TellPeersFailed(const std::string& what);
  // The job failed on another host (or one died): stops everything here.
  int StopForPeer(const std::string& why);
  // Ends the peer watch as the job ends here (rc 0: "done").
  void EndPeerWatch(int rc);
  int Supervise();
  // --store_only: serves the KV store until SIGINT or SIGTERM, then exits 0.
  int ServeStoreOnly();
  int FinishJob();
  // Stops every process still running; the job's exit code.
  // `wait_status` is the failed process's: one that exited 2 (it refused
  // its input at start-up) makes the job exit 2 as well.
  int StopFailedJob(int wait_status, const std::string& what);
  void Report(size_t index, int wait_status, const std::string& action);
  // Marks `mine` done under `prefix`; the store's host then waits (bounded
  // by --rendezvous_timeout) until every id in `all` is marked, so the store
  // outlives every machine that may still use it.
  void FinishRendezvous(const std::string& prefix, const std::vector<std::string>& mine,
                        const std::vector<std::string>& all);
  bool AllWorkersDone();
  std::string JoinCommand() const;
  std::vector<Endpoint>& ListOf(Role role) {
    return role == Role::kServer ? job_.servers : role == Role::kWorker ? job_.workers : job_.heter_workers;
  }

  // Fixed after construction.
  const std::vector<std::string> args_;
  const LaunchOptions opts_;
  JobLayout job_;  // endpoint lists and collective ranks are filled in as the job starts
  const LauncherIo io_;
  const milliseconds grace_;
  const milliseconds rendezvous_;

  Supervisor sup_;
  // Progress and exits of the processes, for /metrics, metrics.jsonl and the
  // closing status line.
  std::unique_ptr<JobMetrics> metrics_;
  // The job page (GET /job) the KV store serves when this fleetrun hosts it.
  std::unique_ptr<JobPage> page_;
  Clock::time_point started_at_ = Clock::now();
  Clock::time_point next_progress_poll_{};
  std::unique_ptr<KvStoreServer> kv_server_;
  std::unique_ptr<KvStoreClient> kv_;
  std::vector<size_t> servers_, heters_, workers_;  // supervisor indices by role
  std::map<size_t, int> render_rank_;               // supervisor index -> RenderProcess rank
  std::set<size_t> finished_;                       // workers that exited 0
  std::optional<LogDirLock> log_lock_;               // held from Run() on
  Clock::time_point next_done_check_{};
  // Requests the KV store refused, by peer address (its server's threads
  // write, the peer watch reads).
  std::mutex refused_mu_;
  std::map<std::string, std::string> refused_;
  // After kv_: stopped before the client it uses.
  std::unique_ptr<PeerWatch> peers_;
  bool failed_elsewhere_ = false;
  // How often a fleetrun for this host rejoined the job (RejoinOrRefuse);
  // added to every process's restart count.
  int host_generation_ = 0;
};

int Launcher::Run() {
  const int rc = RunJob();
  EndPeerWatch(rc);
  if (page_) page_->SetStatus(rc == kExitOk ? "done" : "failed, exit " + std::to_string(rc));
  if (sup_.size() > 0) {
    next_progress_poll_ = Clock::time_point();  // the last reports, for the throughput
    PollProgress();
    std::fprintf(rc == kExitOk ? io_.out : io_.err, "%s\n", JobStatusLine(rc).c_str());
    std::fflush(rc == kExitOk ? io_.out : io_.err);
  }
  return rc;
}

int ExitCodeOf(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
}

std::string Launcher::JobStatusLine(int rc) const {
  std::string procs;
  int failed = 0;
  for (size_t i = 0; i < sup_.size(); ++i) {
    const int code = ExitCodeOf(sup_.last_status(i));
    failed += !sup_.running(i) && code != 0;
    procs += (procs.empty() ? "" : ", ") + sup_.spec(i).Name() + " " +
             (sup_.running(i) ? std::string("running") : std::to_string(code));
  }
  const double wall = std::chrono::duration<double>(Clock::now() - started_at_).count();
  const std::string role = job_.mode == Mode::kCollective ? "collective" : "worker";
  const std::optional<double> throughput = metrics_ ? metrics_->Throughput(role) : std::nullopt;
  char line[256];
  if (throughput) {
    std::snprintf(line, sizeof(line),
                  "; wall %.1f s; throughput %.0f samples/s (last reports, %ss summed)", wall,
                  *throughput, role.c_str());
  } else {
    std::snprintf(line, sizeof(line),
                  "; wall %.1f s; throughput unknown (no %s reported its progress)", wall,
                  role.c_str());
  }
  return "fleetrun: job " + std::string(rc == kExitOk ? "done" : "failed") + ", exit " +
         std::to_string(rc) + "; " + std::to_string(sup_.size()) + " processes, " +
         std::to_string(failed) + " failed (exit codes: " + procs + ")" + line;
}

void Launcher::NoteExit(size_t index, int wait_status) {
  if (metrics_) {
    metrics_->Exited(std::string(RoleName(sup_.spec(index).role)), sup_.spec(index).rank,
                     ExitCodeOf(wait_status));
  }
}

void Launcher::PollProgress() {
  if (!metrics_ || !kv_ || Clock::now() < next_progress_poll_) return;
  next_progress_poll_ = Clock::now() + kProgressPollEvery;
  // Best effort, and never long: the loop that calls it also watches the
  // processes and the peers.
  UpdatePageProcesses();
  Result<std::vector<std::string>> keys = kv_->List("progress/", kProgressPollBudget);
  if (!keys.ok()) return;
  for (const std::string& key : *keys) {
    // progress/<role>/<rank>
    const size_t slash = key.rfind('/');
    const std::string role = key.substr(9, slash - 9);
    Result<std::string> value = kv_->Get(key, kProgressPollBudget);
    if (!value.ok()) return;
    Result<ProgressValue> progress = ParseProgressValue(*value);
    if (!progress.ok()) continue;
    const std::string rank = key.substr(slash + 1);
    metrics_->Progress(role, std::atoi(rank.c_str()), *progress);
    if (page_) page_->AddReport(role + " " + rank, *progress);
  }
  const std::string stats_prefix(ps::PsServer::kStatsKeyPrefix);
  Result<std::vector<std::string>> servers = kv_->List(stats_prefix, kProgressPollBudget);
  if (!servers.ok()) return;
  for (const std::string& key : *servers) {
    Result<std::string> value = kv_->Get(key, kProgressPollBudget);
    if (!value.ok()) return;
    pb::PsStatsReply stats;
    if (stats.ParseFromString(*value)) {
      metrics_->ServerStats(std::atoi(key.c_str() + stats_prefix.size()), stats);
    }
  }
}

std::string Launcher::PageHostName() const {
  if (job_.mode == Mode::kPsCluster) {
    const std::set<std::string> mine = LocalJobAddresses();
    if (!mine.empty()) return *mine.begin();
  }
  if (job_.mode == Mode::kCollective && job_.collective.nnodes > 1)
    return job_.collective.node_host;
  return "localhost";
}

void Launcher::UpdatePageProcesses() {
  std::vector<JobPage::Process> processes;
  for (size_t i = 0; i < sup_.size(); ++i) {
    const ProcessSpec& spec = sup_.spec(i);
    JobPage::Process p;
    p.host = PageHostName();
    p.name = spec.Name();
    p.role = std::string(RoleName(spec.role));
    p.rank = spec.rank;
    p.pid = static_cast<int>(sup_.pid(i));
    const int status = sup_.last_status(i);
    p.state = sup_.running(i)     ? "running"
              : WIFEXITED(status) ? "exited " + std::to_string(WEXITSTATUS(status))
                                  : Supervisor::DescribeWaitStatus(status);
    p.restarts = sup_.restarts(i);
    p.endpoint = spec.endpoint;
    p.log = spec.log_path;
    for (absl::string_view line : absl::StrSplit(sup_.LogTail(i, kPageTailLines), '\n')) {
      if (!line.empty()) p.tail.emplace_back(line);
    }
    processes.push_back(std::move(p));
  }
  if (job_.mode == Mode::kStoreOnly && kv_) {
    // Processes started by hand beat in the store (comm/job_liveness.h).
    const std::string prefix(kAliveKeyPrefix);
    Result<std::vector<std::string>> keys = kv_->List(prefix, kProgressPollBudget);
    for (const std::string& key : keys.ok() ? *keys : std::vector<std::string>()) {
      Result<std::string> text = kv_->Get(key, kProgressPollBudget);
      Result<AliveValue> alive = text.ok() ? ParseAliveValue(*text) : text.status();
      if (!alive.ok()) continue;
      // alive/<role>/<rank>
      const std::string place = key.substr(prefix.size());
      JobPage::Process p;
      p.role = place.substr(0, place.find('/'));
      p.rank = std::atoi(place.c_str() + p.role.size() + 1);
      p.name = p.role + " " + std::to_string(p.rank);
      p.host = alive->done ? "-" : alive->host;
      p.pid = alive->pid;
      p.state = alive->done ? "exited 0" : "running";
      p.log = "(started by hand)";
      processes.push_back(std::move(p));
    }
  }
  if (page_) {
    page_->SetProcesses(std::move(processes));
    if (job_.mode == Mode::kCollective ? job_.collective.nnodes <= 1
                                       : job_.mode != Mode::kPsCluster) {
      return;
    }
    Result<std::vector<std::string>> hosts = kv_->List("page/hosts/", kProgressPollBudget);
    if (!hosts.ok()) return;
    for (const std::string& key : *hosts) {
      if (Result<std::string> json = kv_->Get(key, kProgressPollBudget); json.ok()) {
        page_->SetRemoteProcesses(key.substr(11), *json);
      }
    }
  } else if (kv_) {
    // Another host's: the store's host shows them.
    (void)kv_->Set("page/hosts/" + PageHostName(), JobPage::ProcessesJson(processes),
                   kProgressPollBudget);
  }
}

int Launcher::RunJob() {
  // What can still fail before the job starts (the log folder, its lock,
  // the KV store's port) is checked first: the configuration is printed
  // once it holds, with the store's real port.
  // A link in place of the folder is refused, as everywhere FleetPS writes.
  if (Status made = DefaultFileSystem()->CreateDir(job_.log_dir); !made.ok()) {
    return Refuse("--log_dir: cannot create '" + job_.log_dir + "': " + made.message());
  }
  // The hosts of a job may share the folder (NFS): fleetrun's own files
  // there are per host; the processes' logs have job-wide names.
  const std::string host = HostTag();
  auto lock = LogDirLock::Acquire(job_.log_dir, job_.job_id, host, job_.kv_endpoint);
  if (!lock.ok()) return Refuse("--log_dir: " + lock.status().message());
  log_lock_.emplace(std::move(lock).value());
  const char* mode =
      job_.mode == Mode::kPsSimulation ? "parameter-server, simulation on this machine"
      : job_.mode == Mode::kPsCluster  ? "parameter-server, cluster"
      : job_.mode == Mode::kStoreOnly  ? "KV store only, for processes started by hand"
                                       : "collective";
  metrics_ = std::make_unique<JobMetrics>(
      job_.job_id, job_.log_dir + "/metrics" + (host.empty() ? "" : "." + host) + ".jsonl");
  const std::string listen_host = job_.kv_listen.substr(0, job_.kv_listen.rfind(':'));
  if (job_.host_kv) {
    page_ = std::make_unique<JobPage>(job_.job_id, mode);
    kv_server_ = std::make_unique<KvStoreServer>(
        KvStoreServerOptions{.listen = job_.kv_listen,
                             .auth = job_.credentials,
                             .metrics = [metrics = metrics_.get()] { return metrics->Text(); },
                             .on_refused =
                                 [this](const std::string& address, const std::string& why) {
                                   std::lock_guard<std::mutex> lock(refused_mu_);
                                   refused_.emplace(address, why);
                                 },
                             .page = std::string(JobPageHtml()),
                             .page_state = [page = page_.get()] { return page->StateJson(); },
                             .read_token = job_.metrics_token,
                             // Only this machine's users reach a store on loopback.
                             .read_open = IsLoopback(listen_host)});
    Status st = kv_server_->Start();
    if (!st.ok()) {
      std::fprintf(io_.err, "fleetrun: --http_port: cannot host the KV store: %s\n", st.message().c_str());
      return kExitBadFlags;
    }
    // Port 0: processes are told the port actually bound.
    job_.kv_endpoint = job_.kv_endpoint.substr(0, job_.kv_endpoint.rfind(':') + 1) + std::to_string(kv_server_->port());
  }
  std::fprintf(
      io_.out, "fleetrun: configuration (flags given; the others have their defaults)\n%s",
      FormatOptionsTable(
          opts_, {{"(mode)", mode}, {"(log files)", job_.log_dir}, {"(auth)", job_.auth_note}})
          .c_str());
  for (const std::string& note : job_.notes) std::fprintf(io_.out, "fleetrun: %s\n", note.c_str());
  if (job_.mode == Mode::kCollective && job_.collective.from_slurm) {
    std::fprintf(
        io_.out, "fleetrun: Slurm detected (SLURM_* variables): node %d of %d, KV store %s%s\n",
        job_.collective.node_rank, job_.collective.nnodes, job_.kv_endpoint.c_str(),
        job_.host_kv ? (" (hosted here, listening on " + kv_server_->endpoint() + ")").c_str()
                     : " (on node 0)");
  }
  if (job_.host_kv) {
    std::fprintf(io_.out, "fleetrun: KV store serving on %s (job %s)\n", job_.kv_endpoint.c_str(), job_.job_id.c_str());
    const std::string page_host = IsLoopback(listen_host) || listen_host == "0.0.0.0"
                                      ? job_.kv_endpoint.substr(0, job_.kv_endpoint.rfind(':'))
                                      : listen_host;
    const std::string base = "http://" + page_host + ":" + std::to_string(kv_server_->port());
    std::fprintf(
        io_.out, "fleetrun: job page %s/job%s, Prometheus metrics %s/metrics%s\n", base.c_str(),
        job_.metrics_token.empty() ? "" : "#token=<--metrics_token_file's token>", base.c_str(),
        !job_.metrics_token.empty() ? " (bearer token: --metrics_token_file)"
        : IsLoopback(listen_host)   ? " (this machine's users only)"
                                    : " (signed requests only: give --metrics_token_file)");
  } else {
    std::fprintf(io_.out, "fleetrun: KV store at %s (job %s)\n", job_.kv_endpoint.c_str(), job_.job_id.c_str());
  }
  std::fflush(io_.out);
  kv_ = std::make_unique<KvStoreClient>(job_.kv_endpoint, job_.job_id,
                                        KvStoreClientOptions{.request_timeout = std::chrono::seconds(2),
                                                             .auth = job_.credentials,
                                                             .source_address = SourceAddress()});

  if (job_.mode == Mode::kStoreOnly) return ServeStoreOnly();
  if (!job_.host_kv) {
    if (auto rc = WaitForStore()) return *rc;
  }
  if (job_.mode == Mode::kCollective) {
    if (auto rc = PickCompatPorts()) return *rc;
    if (auto rc = CollectiveRendezvous()) return *rc;
    std::vector<int> local(job_.collective.devices.size());
    for (size_t i = 0; i < local.size(); ++i) local[i] = i;
    if (auto rc = StartRole(Role::kCollective, local)) return *rc;
    return Supervise();
  }
  if (auto rc = StartPsPeerWatch()) return *rc;
  // Servers first; heter workers need the servers' real endpoints and
  // workers need both, so each stage waits for the previous one to publish.
  for (Role role : {Role::kServer, Role::kHeterWorker}) {
    const std::vector<int>& ranks = role == Role::kServer ? job_.local_servers : job_.local_heter_workers;
    if (auto rc = StartRole(role, ranks)) return *rc;
    if (auto rc = WaitPublished(role, ranks)) return *rc;
  }
  if (auto rc = StartRole(Role::kWorker, job_.local_workers)) return *rc;
  return Supervise();
}

std::optional<int> Launcher::StartRole(Role role, const std::vector<int>& ranks) {
  for (int rank : ranks) {
    ProcessSpec spec = RenderProcess(job_, role, rank, host_generation_);
    if (role == Role::kCollective && rank == 0) {
      std::fprintf(io_.out, "fleetrun: the first process's environment:\n%s",
                   FormatDistributedEnvs(spec.env).c_str());
    }
    const std::string name = spec.Name(), endpoint = spec.endpoint, log = spec.log_path;
    auto index = sup_.Start(std::move(spec));
    if (!index.ok()) {
      // The first failure ends the start-up: the next ones would fail alike.
      std::fprintf(io_.err, "fleetrun: cannot start %s: %s; job failed, stopping %zu started processes\n",
                   name.c_str(), index.status().message().c_str(), sup_.Running().size());
      std::fflush(io_.err);
      sup_.StopAll(grace_);
      return kExitJobFailed;
    }
    render_rank_[*index] = rank;
    metrics_->Started(std::string(RoleName(role)), sup_.spec(*index).rank);
    (role == Role::kServer ? servers_ : role == Role::kHeterWorker ? heters_ : workers_).push_back(*index);
    std::fprintf(io_.out, "fleetrun: started %-16s endpoint %-21s pid %-8d log %s\n", name.c_str(),
                 endpoint.empty() ? "-" : endpoint.c_str(), static_cast<int>(sup_.pid(*index)), log.c_str());
    // Between two starts: Ctrl-C / SIGTERM, or a process that died already,
    // ends the start-up now rather than after the last start.
    if (auto rc = Tick(milliseconds(0))) return rc;
  }
  std::fflush(io_.out);
  return std::nullopt;
}

std::optional<int> Launcher::WaitPublished(Role role, const std::vector<int>& ranks) {
  std::vector<Endpoint>& list = ListOf(role);
  std::vector<int> missing;
  for (int r : ranks) {
    if (list[r].port == 0) missing.push_back(r);
  }
  const auto deadline = Clock::now() + rendezvous_;
  Status last_error;
  while (!missing.empty()) {
    if (auto rc = Tick(kStoreTick)) return rc;
    for (auto it = missing.begin(); it != missing.end();) {
      const std::string key = EndpointKey(role, *it);
      auto value = kv_->Get(key);
      if (!value.ok()) {
        if (!value.status().IsNotFound()) last_error = value.status();
        ++it;
        continue;
      }
      // Published by a process, so checked like any outside input.
      auto ep = ParseEndpoint(*value, key);
      if (!ep.ok() || ep->port == 0) {
        std::fprintf(io_.err, "fleetrun: %s %d published a bad endpoint under %s: '%s'\n",
                     std::string(RoleName(role)).c_str(), *it, key.c_str(), value->c_str());
        sup_.StopAll(grace_);
        return kExitJobFailed;
      }
      list[*it] = *ep;
      std::fprintf(io_.out, "fleetrun: %s %d listens on %s\n", std::string(RoleName(role)).c_str(), *it,
                   ep->ToString().c_str());
      it = missing.erase(it);
    }
    if (!missing.empty() && Clock::now() >= deadline) {
      std::fprintf(io_.err,
                   "fleetrun: Timeout: %s ranks %s never published endpoints/%s/<rank> in the KV store at %s "
                   "within %lld ms%s%s\n",
                   std::string(RoleName(role)).c_str(), JoinInts(missing).c_str(), std::string(RoleName(role)).c_str(),
                   job_.kv_endpoint.c_str(), static_cast<long long>(rendezvous_.count()),
                   last_error.ok() ? "" : "; last store error: ", last_error.ok() ? "" : last_error.message().c_str());
      sup_.StopAll(grace_);
      return kExitJobFailed;
    }
  }
  std::fflush(io_.out);
  return std::nullopt;
}

std::string Launcher::JoinCommand() const {
  // The flags this node was given, minus the ones that make it the master,
  // then PROGRAM and its arguments untouched.
  const size_t flag_count = args_.size() - (opts_.program.empty() ? 0 : 1 + opts_.program_args.size());
  std::string cmd = "fleetrun --master=" + job_.kv_endpoint + " --nnodes=" + std::to_string(job_.collective.nnodes);
  for (size_t i = 0; i < flag_count; ++i) {
    const std::string& a = args_[i];
    bool drop = false;
    for (const char* f : {"--nnodes", "--host", "--http_port"}) {
      if (a == f) drop = true, ++i;  // "--flag value": skip the value too
      if (a.starts_with(std::string(f) + "=")) drop = true;
    }
    if (!drop && a != "--") cmd += " " + ShellQuote(a);
  }
  cmd += " " + ShellQuote(opts_.program);
  // Not this node's --gloo_hostname: each node's fleetrun gives its ranks the
  // node's own address (FLEET_HOST).
  for (size_t i = 0; i < opts_.program_args.size(); ++i) {
    const std::string& a = opts_.program_args[i];
    if (a == "--gloo_hostname" || a == "-gloo_hostname") {
      ++i;
      continue;
    }
    if (a.starts_with("--gloo_hostname=") || a.starts_with("-gloo_hostname=")) continue;
    cmd += " " + ShellQuote(a);
  }
  return cmd;
}

std::optional<int> Launcher::CollectiveRendezvous() {
  CollectiveLayout& c = job_.collective;
  if (c.node_rank_source == NodeRankSource::kSingleNode) return std::nullopt;
  if (c.print_join_command) {
    std::fprintf(io_.out, "fleetrun: this node is the master; on each of the other %d nodes run:\n  %s\n", c.nnodes - 1,
                 JoinCommand().c_str());
    std::fflush(io_.out);
  }
  const auto deadline = Clock::now() + rendezvous_;
  WaitNote note(io_.out, rendezvous_);
  Status last_error;
  if (c.node_rank_source == NodeRankSource::kAssigned) {
    // The store answered (WaitForStore), so a failure now is no start-order matter.
    auto r = kv_->Add("collective/node_rank", 1);
    if (!r.ok()) {
      std::fprintf(io_.err, "fleetrun: no node rank from the KV store at %s: %s\n", job_.kv_endpoint.c_str(),
                   r.status().message().c_str());
      return kExitJobFailed;
    }
    c.node_rank = static_cast<int>(*r - 1);
    if (c.node_rank >= c.nnodes) {
      std::fprintf(io_.err, "fleetrun: --nnodes: node rank %d handed out, but the job has only %d nodes\n", c.node_rank,
                   c.nnodes);
      return kExitJobFailed;
    }
  }
  {
    std::vector<PeerWatchOptions::Peer> peers;
    for (int n = 0; n < c.nnodes; ++n) {
      if (n == c.node_rank) continue;
      const std::string address = c.node_hosts.empty() ? "" : c.node_hosts[n];
      peers.push_back({"node" + std::to_string(n),
                       "node " + std::to_string(n) + (address.empty() ? "" : " at " + address),
                       address});
    }
    const std::string self_id = "node" + std::to_string(c.node_rank),
                      self_name = "node " + std::to_string(c.node_rank) + " at " + c.node_host;
    if (auto rc = RejoinOrRefuse(self_id, self_name)) return rc;
    StartPeerWatch(self_id, self_name, std::move(peers));
  }
  // Each node publishes its process count and its ranks' endpoints (node 0
  // also torch's master) and reads everyone's.
  NodeInfo mine{static_cast<int>(c.devices.size()), c.trainer_endpoints,
                c.node_rank == 0 ? c.master : std::string()};
  const std::string my_key = "collective/nproc/" + std::to_string(c.node_rank);
  Status st = kv_->Set(my_key, FormatNodeInfo(mine));
  std::vector<std::optional<NodeInfo>> nodes(c.nnodes);
  while (true) {
    std::vector<int> missing;
    for (int n = 0; n < c.nnodes; ++n) {
      if (nodes[n]) continue;
      auto v = kv_->Get("collective/nproc/" + std::to_string(n));
      if (v.ok()) {
        Result<NodeInfo> info = ParseNodeInfo(*v);
        if (!info.ok()) {
          std::fprintf(io_.err, "fleetrun: node %d published %s\n", n, info.status().message().c_str());
          return kExitJobFailed;
        }
        nodes[n] = *std::move(info);
      } else {
        if (!v.status().IsNotFound()) last_error = v.status();
        missing.push_back(n);
      }
    }
    if (!st.ok()) st = kv_->Set(my_key, FormatNodeInfo(mine));  // our own registration failed: retry it too
    if (missing.empty()) break;
    if (Clock::now() >= deadline) {
      std::fprintf(io_.err, "fleetrun: Timeout: nodes %s never joined through the KV store at %s within %lld ms%s%s\n",
                   JoinInts(missing).c_str(), job_.kv_endpoint.c_str(), static_cast<long long>(rendezvous_.count()),
                   last_error.ok() ? "" : "; last store error: ", last_error.ok() ? "" : last_error.message().c_str());
      return kExitJobFailed;
    }
    note.Say("nodes " + JoinInts(missing) + " of " + std::to_string(c.nnodes) + " to join through the KV store at " +
         job_.kv_endpoint +
         (c.node_rank_source == NodeRankSource::kAssigned
              ? " (each runs fleetrun --master=" + job_.kv_endpoint + " --nnodes=" + std::to_string(c.nnodes) + " PROGRAM ...)"
              : std::string(" (each runs this same fleetrun command)")));
    if (auto rc = Tick(kStoreTick)) return rc;
  }
  std::vector<int> nproc(c.nnodes);
  c.trainer_endpoints.clear();
  for (int n = 0; n < c.nnodes; ++n) {
    nproc[n] = nodes[n]->nproc;
    c.trainer_endpoints.insert(c.trainer_endpoints.end(), nodes[n]->endpoints.begin(),
                               nodes[n]->endpoints.end());
  }
  c.master = nodes[0]->master;
  c.rank_offset = 0;
  c.world_size = 0;
  for (int n = 0; n < c.nnodes; ++n) {
    if (n < c.node_rank) c.rank_offset += nproc[n];
    c.world_size += nproc[n];
  }
  std::fprintf(io_.out, "fleetrun: node %d of %d; ranks %d..%d of %d\n", c.node_rank, c.nnodes, c.rank_offset,
               c.rank_offset + static_cast<int>(c.devices.size()) - 1, c.world_size);
  std::string ranks;
  for (size_t i = 0; i < c.devices.size(); ++i) {
    ranks += (ranks.empty() ? "collective " : ", collective ") + std::to_string(c.rank_offset + i);
  }
  peers_->SetProcesses(ranks);
  return std::nullopt;
}

std::string Launcher::StoreHostHint() const {
  const std::string host = job_.kv_endpoint.substr(0, job_.kv_endpoint.rfind(':'));
  if (job_.mode == Mode::kPsCluster) return "it is served by the fleetrun on " + host + ", the first server's host";
  const CollectiveLayout& c = job_.collective;
  if (c.node_rank_source == NodeRankSource::kAssigned) {
    return "it is served by the master node, started on " + host + " without --master: fleetrun --nnodes=" +
           std::to_string(c.nnodes) + " --host=" + host + " PROGRAM ... (every node given --master waits for it)";
  }
  return "it is served by node 0's fleetrun (" + host + ")";
}

std::optional<std::string> Launcher::StoreHostLost() {
  if (job_.host_kv || kv_ == nullptr || (job_.mode != Mode::kPsCluster && job_.collective.nnodes <= 1)) {
    return std::nullopt;
  }
  Result<std::string> probe = kv_->Get("store/probe");
  if (probe.ok() || !probe.status().IsUnavailable()) return std::nullopt;
  const std::string host = job_.kv_endpoint.substr(0, job_.kv_endpoint.rfind(':'));
  return "host " + host + " (the KV store's) stopped: its store at " + job_.kv_endpoint +
         " does not answer (" + probe.status().message() +
         "; its fleetrun was killed, or the host or the network failed); " + StoreHostHint();
}

std::optional<int> Launcher::WaitForStore() {
  const auto deadline = Clock::now() + rendezvous_;
  WaitNote note(io_.out, rendezvous_);
  while (true) {
    // Any answer, "not found" included, shows the store serves this host.
    Result<std::string> probe = kv_->Get("store/probe");
    if (probe.ok() || probe.status().IsNotFound()) {
      // A host that refused to start (or failed) before this one came.
      if (Result<std::string> failed = kv_->Get("job/failed"); failed.ok()) {
        std::fprintf(io_.err, "fleetrun: job failed: %s; not starting\n", failed->c_str());
        return kExitJobFailed;
      }
      return std::nullopt;
    }
    if (probe.status().code() == StatusCode::kFailedPrecondition) {
      std::fprintf(io_.err,
                   "fleetrun: the KV store at %s refused this host: %s; give every host the same "
                   "--job_secret_file (or FLEET_JOB_SECRET)\n",
                   job_.kv_endpoint.c_str(), probe.status().message().c_str());
      return kExitBadFlags;
    }
    if (Clock::now() >= deadline) {
      std::fprintf(io_.err, "fleetrun: Timeout: the KV store at %s did not answer within %lld ms (%s); %s\n",
                   job_.kv_endpoint.c_str(), static_cast<long long>(rendezvous_.count()),
                   probe.status().message().c_str(), StoreHostHint().c_str());
      return kExitJobFailed;
    }
    note.Say("the KV store at " + job_.kv_endpoint + " (" + probe.status().message() + "); " + StoreHostHint());
    if (auto rc = Tick(kStoreTick)) return rc;
  }
}

std::optional<int> Launcher::PickCompatPorts() {
  CollectiveLayout& c = job_.collective;
  const int local = static_cast<int>(c.devices.size());
  // One port per local rank, and one for torch's store should this be node 0.
  Result<std::vector<int>> ports = FreeTcpPorts(c.node_host, local + 1);
  if (!ports.ok()) {
    std::fprintf(io_.err, "fleetrun: %s\n", ports.status().ToString().c_str());
    return kExitJobFailed;
  }
  c.trainer_endpoints.clear();
  for (int i = 0; i < local; ++i) c.trainer_endpoints.push_back(c.node_host + ":" + std::to_string((*ports)[i]));
  c.master = c.node_host + ":" + std::to_string(ports->back());
  return std::nullopt;
}

void Launcher::Report(size_t index, int wait_status, const std::string& action) {
  const ProcessSpec& spec = sup_.spec(index);
  std::fprintf(io_.err, "fleetrun: %s (pid %d) %s%s\nfleetrun: last %zu lines of %s:\n", spec.Name().c_str(),
               static_cast<int>(sup_.pid(index)), Supervisor::DescribeWaitStatus(wait_status).c_str(), action.c_str(),
               kTailLines, spec.log_path.c_str());
  std::string tail = sup_.LogTail(index, kTailLines);
  size_t start = 0;
  while (start < tail.size()) {
    size_t nl = tail.find('\n', start);
    std::fprintf(io_.err, "  | %s\n", tail.substr(start, nl - start).c_str());
    start = nl + 1;
  }
  std::fflush(io_.err);
}

int Launcher::StopFailedJob(int wait_status, const std::string& what) {
  TellPeersFailed(what);
  const size_t others = sup_.Running().size();
  std::fprintf(io_.err, "fleetrun: job failed; stopping %zu other processes\n", others);
  std::fflush(io_.err);
  sup_.StopAll(grace_);
  const bool refused = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == kExitBadFlags;
  return refused ? kExitBadFlags : kExitJobFailed;
}

std::optional<int> Launcher::HandleEvents(const std::vector<Supervisor::Event>& events) {
  for (const Supervisor::Event& ev : events) {
    if (ev.kind == Supervisor::Event::kSignal) {
      TellPeersFailed(std::string("fleetrun received ") + strsignal(ev.signo));
      std::fprintf(io_.err, "fleetrun: received %s; stopping %zu processes\n", strsignal(ev.signo),
                   sup_.Running().size());
      std::fflush(io_.err);
      sup_.StopAll(grace_);
      return 128 + ev.signo;
    }
    const ProcessSpec& spec = sup_.spec(ev.index);
    NoteExit(ev.index, ev.wait_status);
    const bool ok = WIFEXITED(ev.wait_status) && WEXITSTATUS(ev.wait_status) == 0;
    if (ok) {
      if (spec.role == Role::kWorker || spec.role == Role::kCollective) {
        finished_.insert(ev.index);
        if (job_.mode == Mode::kPsCluster) {
          Status st = kv_->Set("done/worker/" + std::to_string(spec.rank), "0");
          if (!st.ok()) std::fprintf(io_.err, "fleetrun: cannot mark %s done: %s\n", spec.Name().c_str(), st.message().c_str());
        }
      } else {
        std::fprintf(io_.err, "fleetrun: warning: %s exited with status 0 before the workers finished\n",
                     spec.Name().c_str());
      }
      continue;
    }
    RemoveShmSegmentsOf(sup_.pid(ev.index));  // before a restart replaces the pid
    if (sup_.restarts(ev.index) < opts_.max_restart) {
      Report(ev.index, ev.wait_status,
             "; restarting (" + std::to_string(sup_.restarts(ev.index) + 1) + " of " + std::to_string(opts_.max_restart) + ")");
      // Rendered again so a restarted server keeps the endpoint it published
      // and a restarted worker gets today's endpoint lists, with its restart
      // count (FLEET_RESTART: reload a checkpoint; FLEET_RESTART_GENERATION:
      // fresh rendezvous keys).
      ProcessSpec again = RenderProcess(job_, spec.role, render_rank_[ev.index],
                                        host_generation_ + sup_.restarts(ev.index) + 1);
      Status st = sup_.Restart(ev.index, std::move(again));
      if (st.ok()) {
        metrics_->Restarted(std::string(RoleName(spec.role)), spec.rank);
        std::fprintf(io_.out, "fleetrun: restarted %s pid %d\n", sup_.spec(ev.index).Name().c_str(),
                     static_cast<int>(sup_.pid(ev.index)));
        std::fflush(io_.out);
        continue;
      }
      std::fprintf(io_.err, "fleetrun: restart failed: %s\n", st.message().c_str());
    }
    // A process that failed because the store's host went away: the host
    // is the news (the process's own error only says a request failed).
    if (std::optional<std::string> lost = StoreHostLost()) {
      std::fprintf(io_.err, "fleetrun: %s; %s failed after it\n", lost->c_str(), spec.Name().c_str());
    }
    Report(ev.index, ev.wait_status, "");
    // Processes that died in the same tick are shown too: the one listed
    // first is often the victim (e.g. a worker whose all-reduce peer exited)
    // and the cause is in another's log.
    for (const Supervisor::Event* other = &ev + 1; other != events.data() + events.size(); ++other) {
      if (other->kind == Supervisor::Event::kSignal) continue;
      if (WIFEXITED(other->wait_status) && WEXITSTATUS(other->wait_status) == 0) continue;
      Report(other->index, other->wait_status, "");
    }
    return StopFailedJob(ev.wait_status, spec.Name() + " (pid " +
                                             std::to_string(sup_.pid(ev.index)) + ") " +
                                             Supervisor::DescribeWaitStatus(ev.wait_status));
  }
  return std::nullopt;
}

std::optional<int> Launcher::Tick(milliseconds timeout) {
  if (auto rc = HandleEvents(sup_.Poll(timeout))) return rc;
  if (peers_) {
    if (std::optional<std::string> why = peers_->failure()) return StopForPeer(*why);
  }
  return std::nullopt;
}

std::set<std::string> Launcher::LocalJobAddresses() const {
  std::set<std::string> mine;
  for (const auto& [list, ranks] : {std::pair{&job_.servers, &job_.local_servers},
                                    std::pair{&job_.heter_workers, &job_.local_heter_workers},
                                    std::pair{&job_.workers, &job_.local_workers}}) {
    for (int r : *ranks) mine.insert((*list)[r].host);
  }
  return mine;
}

std::string Launcher::HostTag() const {
  if (job_.mode == Mode::kPsCluster) {
    std::set<std::string> hosts;
    for (const auto* list : {&job_.servers, &job_.heter_workers, &job_.workers}) {
      for (const Endpoint& e : *list) hosts.insert(e.host);
    }
    const std::set<std::string> mine = LocalJobAddresses();
    return hosts.size() > 1 && !mine.empty() ? *mine.begin() : "";
  }
  if (job_.mode == Mode::kCollective && job_.collective.nnodes > 1)
    return job_.collective.node_host;
  return "";
}

int Launcher::Refuse(const std::string& why) {
  std::fprintf(io_.err, "fleetrun: %s\n", why.c_str());
  std::fflush(io_.err);
  const std::string host = HostTag();
  if (host.empty()) return kExitBadFlags;
  std::fprintf(io_.err, "fleetrun: telling the job's other hosts through the KV store at %s\n",
               job_.kv_endpoint.c_str());
  AnnounceRefusal({.job_id = job_.job_id,
                   .kv_endpoint = job_.kv_endpoint,
                   .kv_listen = job_.kv_listen,
                   .host_kv = job_.host_kv,
                   .auth = job_.credentials,
                   .source_address = SourceAddress(),
                   .text = "host " + host + " refused to start: " + why});
  return kExitBadFlags;
}

std::string Launcher::SourceAddress() const {
  std::string address;
  if (job_.mode == Mode::kPsCluster) {
    const std::set<std::string> mine = LocalJobAddresses();
    if (!mine.empty()) address = *mine.begin();
  } else if (job_.mode == Mode::kCollective && !job_.collective.node_hosts.empty()) {
    // --ips: the address listed that is this machine's (--host may name
    // anything, so it is left to the kernel).
    address = job_.collective.node_host;
  }
  const std::string store_host = job_.kv_endpoint.substr(0, job_.kv_endpoint.rfind(':'));
  const auto loopback = [](const std::string& a) { return a.starts_with("127.") || a == "localhost"; };
  return address.empty() || loopback(address) || loopback(store_host) ? "" : address;
}

std::optional<int> Launcher::StartPsPeerWatch() {
  std::set<std::string> hosts;  // the job's addresses
  for (const auto* list : {&job_.servers, &job_.heter_workers, &job_.workers}) {
    for (const Endpoint& e : *list) hosts.insert(e.host);
  }
  const std::set<std::string> mine = LocalJobAddresses();
  std::string processes;
  for (const auto& [role, ranks] : {std::pair{Role::kServer, &job_.local_servers},
                                    std::pair{Role::kHeterWorker, &job_.local_heter_workers},
                                    std::pair{Role::kWorker, &job_.local_workers}}) {
    for (int r : *ranks) {
      processes +=
          (processes.empty() ? "" : ", ") + std::string(RoleName(role)) + " " + std::to_string(r);
    }
  }
  if (job_.mode != Mode::kPsCluster || hosts.size() < 2 || mine.empty()) return std::nullopt;
  std::vector<PeerWatchOptions::Peer> peers;
  for (const std::string& h : hosts) {
    if (!mine.count(h)) peers.push_back({h, "host " + h, h});
  }
  // A machine named under several addresses beats under each (its peers
  // watch each), and is named by all of them.
  std::string self_name = "host ";
  for (const std::string& m : mine) self_name += (m == *mine.begin() ? "" : "/") + m;
  if (auto rc = RejoinOrRefuse(*mine.begin(), self_name)) return rc;
  StartPeerWatch(*mine.begin(), self_name, std::move(peers), processes);
  peers_->SetProcesses(processes);  // in the store before any process starts
  return std::nullopt;
}

std::optional<int> Launcher::RejoinOrRefuse(const std::string& self_id,
                                            const std::string& self_name) {
  const std::string key = "hosts/" + self_id;
  Result<std::string> before = kv_->Get(key);
  if (before.status().IsNotFound()) return std::nullopt;
  if (!before.ok()) {
    std::fprintf(io_.err, "fleetrun: cannot read this host's heartbeat (%s) from the KV store: %s\n",
                 key.c_str(), before.status().message().c_str());
    return kExitJobFailed;
  }
  const std::string job = "job " + job_.job_id + " (KV store at " + job_.kv_endpoint + ")";
  if (Result<std::string> failed = kv_->Get("job/failed"); failed.ok()) {
    std::fprintf(io_.err,
                 "fleetrun: %s already failed (%s); it cannot be rejoined: start it again on "
                 "every host\n",
                 job.c_str(), failed->c_str());
    return kExitJobFailed;
  }
  const bool ended = before->starts_with("done|") || before->starts_with("stopped|");
  const bool ps = job_.mode == Mode::kPsCluster;
  if (ended || !ps || opts_.max_restart == 0) {
    std::fprintf(io_.err,
                 "fleetrun: %s already joined %s (%s): another fleetrun runs for this host, or one "
                 "that stopped was started again; %s\n",
                 self_name.c_str(), job.c_str(),
                 ended ? "and has ended there" : "its heartbeat is in the store",
                 ended ? "start the job again on every host, with a new --job_id"
                 : !ps ? "a collective job across hosts cannot be rejoined: start it again on "
                         "every host, with a new --job_id"
                       : "rejoining a running job needs --max_restart on every host (this job "
                         "has 0)");
    return kExitBadFlags;
  }
  // Another fleetrun for this host that still beats: not a restart.
  WaitNote note(io_.out, std::chrono::milliseconds(2500));
  const auto deadline = Clock::now() + std::chrono::milliseconds(2500);
  while (Clock::now() < deadline) {
    note.Say("the heartbeat of the fleetrun this one replaces to stay silent");
    if (auto rc = Tick(kStoreTick)) return rc;
    if (Result<std::string> now = kv_->Get(key); now.ok() && *now != *before) {
      std::fprintf(io_.err,
                   "fleetrun: %s already joined %s and its fleetrun still runs (its heartbeat "
                   "goes on); not starting a second one\n",
                   self_name.c_str(), job.c_str());
      return kExitBadFlags;
    }
  }
  Result<int64_t> generation = kv_->Add("rejoins/" + self_id, 1);
  if (!generation.ok()) {
    std::fprintf(io_.err, "fleetrun: cannot count this host's rejoins in the KV store: %s\n",
                 generation.status().message().c_str());
    return kExitJobFailed;
  }
  if (*generation > opts_.max_restart) {
    const std::string why = self_name + ": its fleetrun was started again " +
                            std::to_string(*generation) + " times, more than --max_restart=" +
                            std::to_string(opts_.max_restart);
    if (kv_->Get("job/failed").status().IsNotFound()) (void)kv_->Set("job/failed", why);
    std::fprintf(io_.err, "fleetrun: %s; job failed on every host\n", why.c_str());
    return kExitJobFailed;
  }
  host_generation_ = static_cast<int>(*generation);
  std::fprintf(io_.out,
               "fleetrun: %s rejoins %s (rejoin %d of --max_restart=%d): its processes restart "
               "and take their places back\n",
               self_name.c_str(), job.c_str(), host_generation_, opts_.max_restart);
  std::fflush(io_.out);
  return std::nullopt;
}

void Launcher::StartPeerWatch(const std::string& self_id, const std::string& self_name,
                              std::vector<PeerWatchOptions::Peer> peers, std::string processes) {
  std::vector<std::string> also_ids;
  if (job_.mode == Mode::kPsCluster) {
    for (const std::string& m : LocalJobAddresses()) {
      if (m != self_id) also_ids.push_back(m);
    }
  }
  // A PS job's processes can take their places back (servers recover,
  // workers rejoin); a collective job's group cannot be rejoined.
  const bool may_rejoin = job_.mode == Mode::kPsCluster && opts_.max_restart > 0;
  PeerWatchOptions o{.self_id = self_id,
                     .self_name = self_name,
                     .also_ids = std::move(also_ids),
                     .processes = std::move(processes),
                     .peers = std::move(peers),
                     .peer_timeout = Seconds(opts_.peer_timeout_s),
                     .join_timeout = rendezvous_,
                     .rejoin_timeout = may_rejoin ? rendezvous_ : milliseconds(0),
                     .note =
                         [out = io_.out](const std::string& line) {
                           std::fprintf(out, "fleetrun: %s\n", line.c_str());
                           std::fflush(out);
                         },
                     .refused = [this](const std::string& address) -> std::optional<std::string> {
                       std::lock_guard<std::mutex> lock(refused_mu_);
                       auto it = refused_.find(address);
                       if (it == refused_.end()) return std::nullopt;
                       return it->second;
                     }};
  peers_ = std::make_unique<PeerWatch>(kv_.get(), std::move(o));
}

void Launcher::TellPeersFailed(const std::string& what) {
  if (peers_ && !failed_elsewhere_) peers_->MarkFailed(what);
}

int Launcher::StopForPeer(const std::string& why) {
  failed_elsewhere_ = true;
  std::fprintf(io_.err, "fleetrun: %s; stopping %zu processes on this host\n", why.c_str(),
               sup_.Running().size());
  std::fflush(io_.err);
  sup_.StopAll(grace_);
  return kExitJobFailed;
}

void Launcher::EndPeerWatch(int rc) {
  if (!peers_) return;
  if (rc == kExitOk) {
    peers_->MarkEnded("done");
  } else {
    // Failures with no process to name (a wait that timed out) tell here.
    TellPeersFailed("fleetrun failed (exit " + std::to_string(rc) + "; its output says why)");
    peers_->MarkEnded("stopped");
    // The store goes with this fleetrun: let the others read why first.
    if (job_.host_kv) peers_->AwaitPeersEnded(std::chrono::seconds(3));
  }
  peers_.reset();
}

bool Launcher::AllWorkersDone() {
  for (size_t i : workers_) {
    if (!finished_.count(i)) return false;
  }
  if (job_.mode != Mode::kPsCluster) return true;
  // Workers on other machines report through the store.
  if (Clock::now() < next_done_check_) return false;
  next_done_check_ = Clock::now() + kStoreTick;
  auto done = kv_->List("done/worker/");
  return done.ok() && done->size() >= job_.workers.size();
}

int Launcher::Supervise() {
  while (true) {
    PollProgress();
    if (auto rc = Tick(kPollTick)) return *rc;
    if (AllWorkersDone()) return FinishJob();
  }
}

int Launcher::ServeStoreOnly() {
  std::fprintf(io_.out,
               "fleetrun: give every process --kv_endpoint=%s --job_id=%s%s; Ctrl-C or SIGTERM stops "
               "the store\n",
               job_.kv_endpoint.c_str(), job_.job_id.c_str(),
               job_.auth ? " and the same job secret" : " --auth=off");
  std::fflush(io_.out);
  while (true) {
    PollProgress();
    for (const Supervisor::Event& ev : sup_.Poll(kPollTick)) {
      if (ev.kind != Supervisor::Event::kSignal) continue;
      std::fprintf(io_.out, "fleetrun: received %s; KV store stopped\n", strsignal(ev.signo));
      return kExitOk;
    }
  }
}

void Launcher::FinishRendezvous(const std::string& prefix, const std::vector<std::string>& mine,
                                const std::vector<std::string>& all) {
  for (const std::string& id : mine) {
    Status st = kv_->Set(prefix + id, "done");
    if (!st.ok()) std::fprintf(io_.err, "fleetrun: warning: cannot mark %s%s: %s\n", prefix.c_str(), id.c_str(), st.message().c_str());
  }
  if (!job_.host_kv) return;
  const auto deadline = Clock::now() + rendezvous_;
  while (true) {
    std::vector<std::string> missing;
    for (const std::string& id : all) {
      if (!kv_->Get(prefix + id).ok()) missing.push_back(id);
    }
    if (missing.empty()) return;
    if (Clock::now() >= deadline) {
      std::string names;
      for (const std::string& m : missing) names += " " + m;
      std::fprintf(io_.err, "fleetrun: warning: stopping the KV store although%s did not report done within %lld ms\n",
                   names.c_str(), static_cast<long long>(rendezvous_.count()));
      return;
    }
    std::vector<Supervisor::Event> ignored = sup_.Poll(kStoreTick);
    for (const auto& ev : ignored) {
      if (ev.kind == Supervisor::Event::kSignal) return;  // asked to stop: stop waiting
    }
  }
}

void Launcher::RemoveShmLeftovers() {
  for (size_t i = 0; i < sup_.size(); ++i) {
    if (sup_.pid(i) > 0 && !sup_.running(i)) RemoveShmSegmentsOf(sup_.pid(i));
  }
}

int Launcher::FinishJob() {
  int rc = kExitOk;
  if (job_.mode == Mode::kCollective) {
    std::fprintf(io_.out, "fleetrun: all %zu processes finished\n", workers_.size());
    const CollectiveLayout& c = job_.collective;
    if (c.nnodes > 1) {
      std::vector<std::string> all;
      for (int n = 0; n < c.nnodes; ++n) all.push_back(std::to_string(n));
      FinishRendezvous("collective/done/", {std::to_string(c.node_rank)}, all);
    }
    return rc;
  }
  std::vector<size_t> stop = servers_;
  stop.insert(stop.end(), heters_.begin(), heters_.end());
  std::fprintf(io_.out, "fleetrun: all workers finished; stopping %zu servers and heter workers (SIGTERM, %lld ms grace)\n",
               stop.size(), static_cast<long long>(grace_.count()));
  std::fflush(io_.out);
  std::vector<int> statuses = sup_.Stop(stop, grace_, Supervisor::StopReason::kFinished);
  for (size_t k = 0; k < stop.size(); ++k) {
    const int s = statuses[k];
    NoteExit(stop[k], s);
    if (sup_.killed_by_supervisor(stop[k])) {
      std::fprintf(io_.err, "fleetrun: warning: %s did not stop within %lld ms of SIGTERM; killed\n",
                   sup_.spec(stop[k]).Name().c_str(), static_cast<long long>(grace_.count()));
    } else if ((WIFEXITED(s) && WEXITSTATUS(s) != 0) || (WIFSIGNALED(s) && WTERMSIG(s) != SIGTERM)) {
      // A server that fails, or is killed by another signal than our SIGTERM
      // (kill -9, the OOM killer), while stopping may not have saved.
      Report(stop[k], s, " while stopping");
      rc = kExitJobFailed;
    }
  }
  if (job_.mode == Mode::kPsCluster) {
    std::set<std::string> all_hosts;
    for (const auto* list : {&job_.servers, &job_.heter_workers, &job_.workers})
      for (const Endpoint& e : *list) all_hosts.insert(e.host);
    const std::set<std::string> my_hosts = LocalJobAddresses();
    FinishRendezvous("done/machine/", {my_hosts.begin(), my_hosts.end()}, {all_hosts.begin(), all_hosts.end()});
  }
  return rc;
}

}  // namespace

Result<MachineInfo> GatherMachineInfo() {
  MachineInfo m;
  FLEET_ASSIGN_OR_RETURN(std::vector<InterfaceAddress> interfaces, LocalIPv4Interfaces());
  for (const InterfaceAddress& i : interfaces) {
    m.local_addresses.push_back(i.address);
    m.interface_of[i.address] = i.interface;
  }
  if (const char* ifname = std::getenv("NCCL_SOCKET_IFNAME")) m.nccl_socket_ifname = ifname;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) m.cuda_visible_devices = visible;
  m.gpu_count = VisibleGpuCount(m.cuda_visible_devices, CountGpus());
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) m.self_dir = std::filesystem::path(std::string(buf, n)).parent_path().string();
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  m.path_env = env("PATH");
  m.slurm_procid = env("SLURM_PROCID");
  m.slurm_nnodes = env("SLURM_NNODES");
  m.slurm_nodelist = env("SLURM_NODELIST");
  m.slurm_nodeid = env("SLURM_NODEID");
  if (!m.slurm_nodelist.empty()) {
    auto first = FirstSlurmHost(m.slurm_nodelist);
    if (first.ok()) {
      auto ip = ResolveIPv4(*first);
      if (ip.ok()) m.slurm_master_ip = *ip;
    }
  }
  return m;
}

int RunFleetrun(const std::vector<std::string>& args, const MachineInfo& machine, int wake_fd, LauncherIo io) {
  auto options = ParseLaunchArgs(args);
  if (!options.ok()) {
    std::fprintf(io.err, "fleetrun: %s\n", options.status().message().c_str());
    return kExitBadFlags;
  }
  if (options->help) {
    std::fputs(FormatHelp().c_str(), io.out);
    return kExitOk;
  }
  auto job = ResolveLayout(*options, machine);
  if (!job.ok()) {
    std::fprintf(io.err, "fleetrun: %s\n", job.status().message().c_str());
    return kExitBadFlags;
  }
  auto secret = LoadJobSecret(*options, ProcessEnv(), *job);
  if (!secret.ok()) {
    std::fprintf(io.err, "fleetrun: %s\n", secret.status().message().c_str());
    return kExitBadFlags;
  }
  job->auth_note = std::string(SecretSourceName(*secret));
  auto token = LoadMetricsToken(*options);
  if (!token.ok()) {
    std::fprintf(io.err, "fleetrun: %s\n", token.status().message().c_str());
    return kExitBadFlags;
  }
  job->metrics_token = std::move(token).value();
  // A PS job's config is checked before anything starts; a collective job's
  // belongs to its program, and --store_only runs no job.
  Status config_checked;
  if (job->mode == Mode::kPsSimulation || job->mode == Mode::kPsCluster) {
    auto recovery = DefaultRecoveryDir(&*job, options->max_restart);
    config_checked = recovery.ok() ? CheckPsJobConfig(*job) : recovery.status();
    if (config_checked.ok() && !recovery->empty()) {
      std::fprintf(io.out, "fleetrun: --max_restart without server.recovery_dir: servers keep their push log and "
                           "recovery checkpoints in %s\n", recovery->c_str());
    }
  }
  // Segments a rank left when it and its fleetrun were killed (kill -9
  // during the rendezvous): nothing else would ever remove them.
  if (const int orphans = RemoveOrphanedShmSegments(); orphans > 0) {
    std::fprintf(io.out, "fleetrun: removed %d shared-memory segment(s) of dead processes from /dev/shm\n",
                 orphans);
  }
  Launcher launcher(args, std::move(*options), std::move(*job), wake_fd, io);
  // A config this host refuses: the other hosts are told too.
  if (!config_checked.ok()) return launcher.Refuse(config_checked.message());
  const int rc = launcher.Run();
  launcher.RemoveShmLeftovers();
  return rc;
}

}  // namespace fleet::launch
