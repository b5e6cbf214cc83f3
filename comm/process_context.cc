#include "comm/process_context.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "comm/kv_store.h"

namespace fleet {
namespace {

// How long a process refused a rank waits to read who holds it.
constexpr std::chrono::seconds kRegisterTimeout{10};

// `env` with FLEET_ROLE defaulting to `role`: a program started by hand
// needs no role, and no process-wide flag default is changed (tests build
// contexts of several roles in one process).
EnvLookup WithDefaultRole(EnvLookup env, Role role) {
  return [env = std::move(env), role](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> value = env(name);
    if (!value && name == "FLEET_ROLE") return std::string(RoleName(role));
    return value;
  };
}

}  // namespace

Result<std::unique_ptr<ProcessContext>> ProcessContext::Create(ProcessContextOptions options) {
  std::unique_ptr<ProcessContext> ctx(new ProcessContext());
  ctx->program_ = std::move(options.program);
  FLEET_ASSIGN_OR_RETURN(LauncherEnv launcher, ReadLauncherEnv(options.role, options.env));
  const EnvLookup own = WithDefaultRole(options.env, options.role);
  ctx->env_ = WithLauncherEnv(own, launcher);
  ctx->on_stop_ = std::move(options.on_stop);
  // Before anything else, so no thread exists yet (StopSignalWatcher).
  if (options.watch_stop_signals) {
    ProcessContext* self = ctx.get();
    ctx->watcher_ = std::make_unique<StopSignalWatcher>([self](int sig) { self->OnSignal(sig); });
  }

  // The launcher's values are named by their own variables in errors.
  FLEET_ASSIGN_OR_RETURN(ctx->spec_, ClusterSpecFromFlagsAndEnv(own, launcher));
  const ClusterSpec& spec = ctx->spec_;
  if (std::optional<std::string> visible = ctx->env_("CUDA_VISIBLE_DEVICES");
      visible && !visible->empty() && CountGpus() == 0) {
    LOG(INFO) << ctx->program_ << ": note: CUDA_VISIBLE_DEVICES=" << *visible
              << " is set but this machine has no GPU (no /dev/nvidia<N>): running on the CPU";
  }
  if (launcher.host_kv_store && spec.rank == 0 && spec.kv_endpoint &&
      spec.kv_endpoint->ToString() == *launcher.host_kv_store) {
    FLEET_RETURN_IF_ERROR(
        ctx->HostKvStore(*launcher.host_kv_store, launcher.values.at("FLEET_KV_ENDPOINT").second));
  }
  if (spec.role != options.role) {
    return Status::InvalidArgument(
        absl::StrCat(ctx->program_, " runs as role ", std::string(RoleName(options.role)),
                     " only; --role / FLEET_ROLE says"),
        RoleName(spec.role));
  }
  FLEET_ASSIGN_OR_RETURN(ctx->device_, CanonicalDevice(spec.device, "--device / FLEET_DEVICE"));
  ctx->device_given_ = !gflags::GetCommandLineFlagInfoOrDie("device").is_default ||
                       ctx->env_("FLEET_DEVICE").has_value();

  const std::vector<Endpoint>& mine = spec.RoleEndpoints();
  if (!options.endpoint_flag.empty()) {
    ctx->listen_endpoint_ = options.endpoint_flag;
  } else if (spec.rank < static_cast<int>(mine.size())) {
    ctx->listen_endpoint_ = mine[spec.rank].ToString();
  } else {
    ctx->listen_endpoint_ = "127.0.0.1:0";
  }
  return ctx;
}

Status ProcessContext::HostKvStore(const std::string& listen, const std::string& from) {
  if (spec_.auth && !spec_.credentials) {
    return Status::InvalidArgument(
        absl::StrCat("rank 0 hosts the job's KV store on ", from, " (", listen,
                     ", as torch's env:// does) and auth is on: give every rank the same job "
                     "secret (FLEET_JOB_SECRET, or --job_secret_file=FILE of mode 600), or "
                     "--auth=off on a trusted network"),
        absl::StrCat("torchrun's ", from));
  }
  hosted_store_ = std::make_unique<KvStoreServer>(
      KvStoreServerOptions{.listen = listen, .auth = spec_.credentials});
  if (Status st = hosted_store_->Start(); !st.ok()) {
    return Status::Unavailable(
        absl::StrCat("rank 0 cannot host the job's KV store on ", from, " (", st.message(),
                     "): another process holds that port; give torchrun another "
                     "--master_port, or start the ranks with fleetrun --nproc_per_node=N"),
        listen);
  }
  LOG(INFO) << program_ << ": rank 0 hosts the job's KV store on " << hosted_store_->endpoint()
            << " (torchrun's " << from << ")";
  return Status::OK();
}

ProcessContext::~ProcessContext() { watcher_.reset(); }

std::optional<std::string> ProcessContext::assigned_device() const {
  if (!device_given_) return std::nullopt;
  return device_;
}

Result<std::shared_ptr<const JobAuth>> ProcessContext::TransportAuthFor(bool config_auth) const {
  return TransportAuth(spec_, config_auth);
}

Result<std::vector<std::string>> ProcessContext::PeerEndpoints(
    Role role, std::chrono::milliseconds timeout) const {
  return ResolveEndpoints(spec_.EndpointsOf(role), role, spec_, timeout);
}

Status ProcessContext::ClaimRank(const std::string& who) const {
  return RegisterRank(spec_, who, kRegisterTimeout);
}

Status ProcessContext::Announce(const std::string& bound) const {
  FLEET_RETURN_IF_ERROR(ClaimRank(bound));
  return PublishEndpoint(spec_, bound);
}

bool ProcessContext::ReceivedSignal(int signal) const {
  return signal > 0 && signal < 32 && (signals_received_.load() & (1u << signal)) != 0;
}

bool ProcessContext::WaitForStop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  return stop_cv_.wait_for(lock, timeout, [&] { return stop_requested_.load(); });
}

void ProcessContext::RequestStop() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_requested_.store(true);
  }
  stop_cv_.notify_all();
}

void ProcessContext::OnSignal(int signal) {
  if (signal > 0 && signal < 32) signals_received_.fetch_or(1u << signal);
  RequestStop();
  if (on_stop_) on_stop_(signal);
}

}  // namespace fleet
