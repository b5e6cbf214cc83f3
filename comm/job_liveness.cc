#include "comm/job_liveness.h"

#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/kv_store.h"
#include "comm/process_context.h"

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kFailedKey[] = "job/failed";

std::string AliveKey(Role role, int rank) {
  return absl::StrCat(std::string(kAliveKeyPrefix), std::string(RoleName(role)), "/", rank);
}

std::string AliveText(int64_t beat, const std::string& host) {
  return absl::StrCat(beat, "|", host, "|", getpid());
}

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

Result<AliveValue> ParseAliveValue(const std::string& text) {
  AliveValue v;
  if (text == "done") {
    v.done = true;
    return v;
  }
  const std::vector<std::string> parts = absl::StrSplit(text, '|');
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &v.beat) ||
      !absl::SimpleAtoi(parts[2], &v.pid)) {
    return Status::InvalidArgument("a beat is not '<beat>|<host>|<pid>' or 'done'", text);
  }
  v.host = parts[1];
  return v;
}

bool StartedByHand(const EnvLookup& env) { return !env("FLEET_RESTART_GENERATION").has_value(); }

Result<std::unique_ptr<JobLiveness>> WatchPeersByHand(ProcessContext& ctx, const std::string& name,
                                                      int workers) {
  const ClusterSpec& spec = ctx.spec();
  if (!StartedByHand(ctx.env()) || !spec.kv_endpoint) return std::unique_ptr<JobLiveness>();
  JobLivenessOptions o;
  o.role = spec.role;
  o.rank = spec.rank;
  o.servers = static_cast<int>(spec.servers.size());
  o.workers = workers;
  o.heter_workers = static_cast<int>(spec.heter_workers.size());
  o.on_failure = [&ctx, name](const std::string& why) {
    LOG(ERROR) << name << ": " << why << "; stopping";
    ctx.RequestStop();
  };
  return JobLiveness::Start(spec, std::move(o));
}

Result<std::unique_ptr<JobLiveness>> JobLiveness::Start(const ClusterSpec& spec,
                                                        JobLivenessOptions options) {
  if (!spec.kv_endpoint) {
    return Status::InvalidArgument("watching the job's processes needs its KV store",
                                   "--kv_endpoint");
  }
  std::unique_ptr<JobLiveness> watch(new JobLiveness(spec, std::move(options)));
  watch->thread_ = std::thread([self = watch.get()] { self->Run(); });
  return watch;
}

JobLiveness::JobLiveness(const ClusterSpec& spec, JobLivenessOptions options)
    : options_(std::move(options)),
      self_key_(AliveKey(options_.role, options_.rank)),
      host_(HostName()),
      kv_(std::make_unique<KvStoreClient>(
          spec.kv_endpoint->ToString(), spec.job_id,
          KvStoreClientOptions{.request_timeout = options_.interval, .auth = spec.credentials})) {
  for (const auto& [role, count] :
       {std::pair{Role::kServer, options_.servers}, std::pair{Role::kWorker, options_.workers},
        std::pair{Role::kHeterWorker, options_.heter_workers}}) {
    for (int r = 0; r < count; ++r) {
      if (role == options_.role && r == options_.rank) continue;
      peers_[AliveKey(role, r)].name = absl::StrCat(std::string(RoleName(role)), " ", r);
    }
  }
}

JobLiveness::~JobLiveness() { Stop(); }

void JobLiveness::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::optional<std::string> JobLiveness::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::optional<std::string> JobLiveness::WaitForFailure(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return failure_.has_value() || stop_; });
  return failure_;
}

bool JobLiveness::WorkersDone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_done_;
}

void JobLiveness::MarkFailed(const std::string& why) {
  // The first failure of this run is the news: a later one is most likely
  // its echo.
  std::optional<std::string> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stale = stale_failed_;
  }
  Result<std::string> now = kv_->Get(kFailedKey);
  if (now.status().IsNotFound() || (now.ok() && stale && *now == *stale)) {
    (void)kv_->Set(kFailedKey, why);
  }
}

void JobLiveness::MarkDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  (void)kv_->Set(self_key_, "done");
}

void JobLiveness::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !failure_) {
    lock.unlock();
    Round();
    lock.lock();
    cv_.wait_for(lock, options_.interval, [this] { return stop_; });
  }
}

bool JobLiveness::Dead(Peer& peer, const std::string& value, std::string* why) const {
  const Clock::time_point now = Clock::now();
  if (value == "done") {  // AliveValue::done
    peer.done = true;
    return false;
  }
  if (value != peer.last || !peer.seen) {
    peer.seen = true;
    peer.last = value;
    peer.changed = now;
  }
  const Result<AliveValue> beat = ParseAliveValue(value);
  const std::string where =
      beat.ok() ? absl::StrCat(" (host ", beat->host, " pid ", beat->pid, ")") : "";
  if (beat.ok() && beat->host == host_) {
    const int pid = beat->pid;
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      *why = absl::StrCat(peer.name, where,
                          " stopped: its process is gone (it was killed or "
                          "it crashed; its log says which)");
      return true;
    }
  }
  if (now - peer.changed >= options_.peer_timeout) {
    *why = absl::StrCat(peer.name, where, " stopped: no heartbeat through the KV store for ",
                        std::chrono::duration<double>(now - peer.changed).count(),
                        " s (its process was killed or froze, or its host or the network "
                        "failed)");
    return true;
  }
  return false;
}

void JobLiveness::Round() {
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = done_;
  }
  if (!done) {
    (void)kv_->Set(self_key_, AliveText(++beat_, host_));
  }
  std::optional<std::string> why;
  bool told_by_store = false;  // `why` is job/failed's, not this watch's finding
  Result<std::string> failed = kv_->Get(kFailedKey);
  if (failed.ok() || failed.status().IsNotFound()) {
    const std::string text = failed.ok() ? *failed : "";
    std::lock_guard<std::mutex> lock(mu_);
    if (!stale_failed_) stale_failed_ = text;
    if (failed.ok() && text != *stale_failed_) {
      why = absl::StrCat("the job failed: ", text);
      told_by_store = true;
    }
  }
  bool workers_done = options_.workers > 0;
  // Looks at one peer's key: sets `why` when it died.
  auto look = [&](const std::string& key, Peer& peer) {
    Result<std::string> value = kv_->Get(key);
    if (!peer.looked && (value.ok() || value.status().IsNotFound())) {
      peer.looked = true;
      peer.stale = value.ok() ? *value : "";
      // A beat of a live process of this host is this run's, whenever
      // this process first looked (a slow store may delay the first look
      // past a peer's last beat before it dies).
      const Result<AliveValue> beat =
          value.ok() ? ParseAliveValue(*value) : Result<AliveValue>(value.status());
      peer.fresh = beat.ok() && !beat->done && beat->host == host_ && beat->pid > 0 &&
                   kill(beat->pid, 0) == 0;
    }
    if (value.ok() && !peer.fresh) peer.fresh = peer.looked && *value != peer.stale;
    if (!peer.fresh) return;  // not started yet: an earlier run's value, or none
    std::string dead;
    if (value.ok() && Dead(peer, *value, &dead)) why = dead;
    // Not beating yet (NotFound), or the store did not answer this time:
    // a beat seen before ages meanwhile.
    if (!value.ok() && peer.seen && Dead(peer, peer.last, &dead)) why = dead;
  };
  // The workers first: once every one is done, the servers and heter
  // workers are ending too, and their exits are no failure.
  for (auto& [key, peer] : peers_) {
    if (!key.starts_with("alive/worker/")) continue;
    if (!peer.done && !why) look(key, peer);
    if (!peer.done) workers_done = false;
  }
  if (options_.role == Role::kWorker && !done) workers_done = false;
  for (auto& [key, peer] : peers_) {
    if (key.starts_with("alive/worker/") || workers_done) continue;
    if (!peer.done && !why) look(key, peer);
  }
  std::function<void(const std::string&)> tell;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_done_ = workers_done;
    if (why && !failure_ && !stop_) {
      failure_ = *why;
      tell = options_.on_failure;
    }
  }
  // A dead peer found here is the job's news: the others read it in
  // job/failed before they might notice this process stop (its echo).
  if (tell && !told_by_store) MarkFailed(*why);
  cv_.notify_all();
  if (tell) tell(*why);
}

}  // namespace fleet
