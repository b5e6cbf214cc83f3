#include "python/job.h"

#include <utility>

#include "worker/app.h"

namespace fleet::python {
namespace {

Status Closed() {
  return Status::FailedPrecondition("the fleetps job was closed (Job.close() or interpreter exit)");
}

// The FLEET_* values given by hand, then the process environment.
Result<EnvLookup> LookupWithOverrides(std::map<std::string, std::string> given) {
  for (const auto& [name, value] : given) {
    if (!name.starts_with("FLEET_")) {
      return Status::InvalidArgument("not a job variable (want FLEET_*)", name);
    }
  }
  EnvLookup process = ProcessEnv();
  return EnvLookup([given = std::move(given), process](const std::string& name) {
    if (auto it = given.find(name); it != given.end())
      return std::optional<std::string>(it->second);
    return process(name);
  });
}

}  // namespace

Result<std::shared_ptr<Job>> Job::Join(JobOptions options) {
  ProcessContextOptions context{.program = "fleetps", .role = Role::kWorker};
  FLEET_ASSIGN_OR_RETURN(context.env, LookupWithOverrides(std::move(options.env)));
  FLEET_ASSIGN_OR_RETURN(ps::PsProcess process, ps::StartPsProcess(std::move(context)));
  const ProcessContext& ctx = *process.context;
  if (ctx.spec().servers.empty()) {
    return Status::InvalidArgument(
        "no parameter servers given: fleetps.init(servers='ip:port,...') or FLEET_SERVERS "
        "(fleetrun sets it)");
  }
  FLEET_RETURN_IF_ERROR(worker::JoinAsWorker(ctx));
  const auto timeout =
      options.timeout.count() > 0 ? options.timeout : process.job.distributed.timeout;
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> servers,
                         ctx.PeerEndpoints(Role::kServer, timeout));

  ps::PsClientOptions co;
  co.servers = servers;
  co.worker_rank = ctx.rank();
  co.num_workers = ctx.spec().world_size;
  co.name = "fleetps worker:" + std::to_string(ctx.rank());
  co.auth = process.transport_auth;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<ps::PsClient> client,
                         ps::PsClient::Create(co, process.job));
  return std::shared_ptr<Job>(new Job(std::move(process), std::move(servers), std::move(client)));
}

Job::Job(ps::PsProcess process, std::vector<std::string> servers,
         std::shared_ptr<ps::PsClient> client)
    : process_(std::move(process)), servers_(std::move(servers)), client_(std::move(client)) {}

Job::~Job() { Close(); }

Result<std::shared_ptr<ps::PsClient>> Job::client() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (client_ == nullptr) return Closed();
  return client_;
}

Result<std::shared_ptr<CommunicatorHandle>> Job::NewCommunicator(
    worker::CommunicatorOptions options) {
  FLEET_ASSIGN_OR_RETURN(std::shared_ptr<ps::PsClient> client, this->client());
  options.num_workers = spec().world_size;
  if (options.timeout.count() == 0) options.timeout = config().distributed.timeout;
  options.max_merge = config().distributed.max_merge;
  options.k_steps = config().distributed.k_steps;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<worker::Communicator> comm,
                         worker::CreateCommunicator(client.get(), options));
  auto handle = std::make_shared<CommunicatorHandle>(client, options, std::move(comm));
  std::lock_guard<std::mutex> lock(mu_);
  if (client_ == nullptr) return Closed();  // closed meanwhile: handle's destructor ends it
  std::erase_if(handles_, [](const std::weak_ptr<CommunicatorHandle>& h) { return h.expired(); });
  handles_.push_back(handle);
  return handle;
}

void Job::Close() {
  std::vector<std::weak_ptr<CommunicatorHandle>> handles;
  std::shared_ptr<ps::PsClient> client;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handles.swap(handles_);
    client.swap(client_);
  }
  // Communicators first: an async one still sends its queue through the client.
  for (const auto& weak : handles) {
    if (std::shared_ptr<CommunicatorHandle> h = weak.lock()) h->Close();
  }
  if (client != nullptr) client->Abort();
}

CommunicatorHandle::CommunicatorHandle(std::shared_ptr<ps::PsClient> client,
                                       worker::CommunicatorOptions options,
                                       std::unique_ptr<worker::Communicator> communicator)
    : client_(std::move(client)),
      options_(std::move(options)),
      communicator_(std::move(communicator)) {}

CommunicatorHandle::~CommunicatorHandle() { Close(); }

Status CommunicatorHandle::Run(const std::function<Status(worker::Communicator&)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (communicator_ == nullptr) return Closed();
  return fn(*communicator_);
}

void CommunicatorHandle::Close() {
  std::unique_ptr<worker::Communicator> comm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm.swap(communicator_);
  }
}

}  // namespace fleet::python
