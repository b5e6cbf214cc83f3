#include "heter/heter_worker.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdlib>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "comm/absl_mutex_mode.h"
#include "comm/cluster.h"
#include "comm/job_liveness.h"
#include "comm/process_context.h"
#include "comm/program_help.h"
#include "ps/job_config.h"
#include "ps/ps_process.h"
#include "trainer/kernels/cpu_kernels.h"
#include "worker/config.h"

DEFINE_string(endpoint, "",
              "ip:port this heter worker listens on; port 0 picks a free port. Default: this "
              "rank's entry of --heter_workers, else 127.0.0.1:0.");

namespace fleet::heter {
namespace {

// Every this many micro-batches a progress line.
constexpr int64_t kLogEvery = 1000;

}  // namespace

HeterWorker::HeterWorker(HeterWorkerOptions options)
    : options_(std::move(options)), name_(absl::StrCat("heter worker ", options_.rank)) {}

Result<std::unique_ptr<HeterWorker>> HeterWorker::Create(HeterWorkerOptions options) {
  if (options.num_heter_workers < 1 || options.rank < 0 ||
      options.rank >= options.num_heter_workers) {
    return Status::InvalidArgument(absl::StrCat("heter worker rank ", options.rank, " not in [0, ",
                                                options.num_heter_workers, ")"));
  }
  if (options.servers.empty()) {
    return Status::InvalidArgument("no parameter servers given (--servers / FLEET_SERVERS)");
  }
  std::unique_ptr<HeterWorker> h(new HeterWorker(std::move(options)));
  const HeterWorkerOptions& o = h->options_;
  if (o.pool_threads > 0) h->pool_ = std::make_unique<ThreadPool>(o.pool_threads);
  FLEET_ASSIGN_OR_RETURN(h->section_, DenseSection::Create(o.job, o.device, h->pool_.get()));

  ps::PsClientOptions co;
  co.servers = o.servers;
  co.worker_rank = o.rank;
  co.num_workers = o.num_heter_workers;
  co.name = absl::StrCat("heter_worker:", o.rank);
  co.auth = o.auth;
  FLEET_ASSIGN_OR_RETURN(h->client_, ps::PsClient::Create(co, o.job));
  worker::CommunicatorOptions copts;
  copts.dense_table = h->section_->dense_table();
  // Geo: each heter worker trains a local copy on its share of the
  // micro-batches, so the servers take the mean of their deltas.
  copts.num_workers = o.num_heter_workers;
  copts.max_merge = o.job.distributed.max_merge;
  copts.k_steps = o.job.distributed.k_steps;
  FLEET_ASSIGN_OR_RETURN(h->comm_, worker::CreateCommunicator(h->client_.get(), copts));
  h->dense_grad_.resize(h->section_->param_count());

  RpcNodeOptions ro;
  ro.name = co.name;
  ro.handler_threads = 1;  // the handlers only queue
  ro.default_timeout = o.job.distributed.timeout;
  ro.van = ps::JobVanOptions(o.job, o.auth);
  FLEET_ASSIGN_OR_RETURN(h->rpc_, RpcNode::Create(ro));
  RpcHandlerOptions on_io;
  on_io.run_on_io_thread = true;
  HeterWorker* self = h.get();
  auto enqueue = [self](Message request, Responder responder) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (!self->stopping_) {
        self->work_.push_back({std::move(request), responder});
        self->work_cv_.notify_one();
        return;
      }
    }
    responder.ReplyError(Status::Unavailable("shutting down", self->name_));
  };
  h->rpc_->Register(pb::HETER_TRAIN, enqueue, on_io);
  h->rpc_->Register(pb::HETER_FLUSH, enqueue, on_io);
  h->compute_thread_ = std::thread([self] { self->ComputeLoop(); });
  h->reply_thread_ = std::thread([self] { self->ReplyLoop(); });
  return h;
}

HeterWorker::~HeterWorker() { (void)Shutdown(); }

Result<std::string> HeterWorker::Start() {
  FLEET_ASSIGN_OR_RETURN(std::string bound, rpc_->Listen(options_.endpoint));
  LOG(INFO) << name_ << "/" << options_.num_heter_workers << " serving on " << bound
            << ": dense section on " << section_->device().ToString() << " ("
            << section_->shape().ToString() << ", " << section_->param_count()
            << " parameters in dense table " << section_->dense_table() << "), " << comm_->name()
            << " mode";
  return bound;
}

void HeterWorker::ComputeLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stopping_ || !work_.empty(); });
    if (work_.empty()) break;  // stopping, and everything received was run
    Work w = std::move(work_.front());
    work_.pop_front();
    lock.unlock();
    if (w.request.header.command() == pb::HETER_FLUSH) {
      QueueReply(
          {worker::PendingPush(comm_->Flush()), Message(), w.responder, {}, name_ + " flush"});
    } else {
      Train(std::move(w));
    }
    lock.lock();
  }
  computing_done_ = true;
  reply_cv_.notify_all();
}

void HeterWorker::ReplyLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    reply_cv_.wait(lock, [&] { return computing_done_ || !replies_.empty(); });
    if (replies_.empty()) return;
    Reply r = std::move(replies_.front());
    replies_.pop_front();
    lock.unlock();
    // Sync: the step is applied once every worker's micro-batches are in;
    // the push's deadline bounds the wait.
    Status s = r.push.Wait();
    if (s.ok()) {
      r.responder.Reply(std::move(r.message));
    } else {
      r.responder.Reply(EncodeFailureReply(r.id, s.WithContext(r.what)));
    }
    lock.lock();
  }
}

void HeterWorker::QueueReply(Reply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  replies_.push_back(std::move(reply));
  reply_cv_.notify_one();
}

Status HeterWorker::LoadParams(int64_t step) {
  const bool sync = options_.job.distributed.mode == ps::SyncMode::kSync;
  // Sync: every micro-batch of a step sees the same parameters (the step
  // before it applied), so one pull serves them all.
  if (sync && params_step_ == step) return Status::OK();
  FLEET_RETURN_IF_ERROR(comm_->Pull({.dense_values = section_->host_params()}));
  FLEET_RETURN_IF_ERROR(section_->LoadParams());
  params_step_ = sync ? step : -1;
  return Status::OK();
}

void HeterWorker::Train(Work work) {
  auto request = DecodeTrainRequest(work.request, section_->shape());
  if (!request.ok()) {
    LOG(WARNING) << name_ << ": refused a request: " << request.status().ToString();
    work.responder.ReplyError(request.status().WithContext(name_));
    return;
  }
  const TrainRequest& r = *request;
  const std::string what = absl::StrCat(name_, ", ", r.id.ToString());
  const bool sync = options_.job.distributed.mode == ps::SyncMode::kSync;
  TrainReply reply;
  reply.id = r.id;
  worker::PushRequest push;
  if (r.batch() > 0) {
    Status s = LoadParams(r.id.mini_batch);
    if (s.ok()) s = section_->Run(r, &reply, dense_grad_);
    if (!s.ok()) {
      LOG(WARNING) << what << ": " << s.ToString();
      work.responder.Reply(EncodeFailureReply(r.id, s.WithContext(what)));
      return;
    }
    push.dense_grads = dense_grad_;
  }
  worker::PendingPush pending;
  if (sync) {
    // Empty micro-batches too: the step waits for every slot (zeros).
    push.sync_slot =
        worker::SyncSlot{r.id.mini_batch, r.id.contributor(), r.id.contributors(r.num_workers)};
    pending = comm_->StartPush(push);
  } else if (r.batch() > 0 && r.attempt == 0) {
    // A resent micro-batch's gradient may have been pushed by the heter
    // worker that failed: never twice.
    pending = comm_->StartPush(push);
  }
  QueueReply({std::move(pending), EncodeTrainReply(reply), work.responder, r.id, what});
  if (const int64_t n = ++computed_; n % kLogEvery == 0) {
    LOG(INFO) << name_ << ": " << n << " micro-batches";
  }
}

Status HeterWorker::Shutdown(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return Status::OK();
    shut_down_ = true;
  }
  // (A worker whose Create failed half way has no threads, node or
  // communicator yet.)
  if (rpc_ == nullptr) return Status::OK();
  if (Status s = rpc_->StopServing(grace); !s.ok()) LOG(WARNING) << name_ << ": " << s.ToString();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (compute_thread_.joinable()) compute_thread_.join();
  if (reply_thread_.joinable()) reply_thread_.join();
  Status flushed = comm_->Flush();
  if (!flushed.ok()) {
    LOG(ERROR) << name_ << ": dense gradients not delivered at shutdown: " << flushed.ToString();
  }
  rpc_->Stop();
  LOG(INFO) << name_ << ": stopped after " << computed_.load() << " micro-batches";
  return flushed;
}

namespace {

ProgramHelp HeterHelp() {
  ProgramHelp help{"heter_worker --endpoint=ip:port --config=job.yaml --servers=ip:port,... [flags]",
                   "One heter worker: runs the dense part of the CPU workers' steps on cuda:K "
                   "(--device / FLEET_DEVICE) or the CPU (fleetrun starts it).",
                   {{"This heter worker",
                     {GflagsHelpFlag("endpoint", "ip:port"), GflagsHelpFlag("device", "cpu|cuda:K")}},
                    ps::JobConfigHelpGroup()}};
  help.override_flag = "override";
  for (HelpGroup& g : ClusterHelpGroups()) help.groups.push_back(std::move(g));
  return help;
}

}  // namespace

int HeterWorkerMain(int argc, char** argv) {
  if (std::optional<int> done = ParseFlagsOrHelp(HeterHelp(), &argc, &argv, std::cout)) {
    return *done;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  UseReleaseMutexChecksInOptimizedBuilds();

  ProcessContextOptions context{.program = "heter_worker", .role = Role::kHeterWorker};
  context.endpoint_flag = FLAGS_endpoint;
  context.watch_stop_signals = true;
  context.on_stop = [](int sig) { LOG(INFO) << "heter_worker: signal " << sig << ", stopping"; };
  Result<ps::PsProcess> process = ps::StartPsProcess(std::move(context));
  if (!process.ok()) {
    LOG(ERROR) << "heter_worker: " << process.status().ToString();
    return 2;
  }
  ProcessContext& ctx = *process->context;
  const ClusterSpec& spec = ctx.spec();
  HeterWorkerOptions o;
  o.rank = spec.rank;
  o.num_heter_workers =
      std::max<int>(spec.world_size, static_cast<int>(spec.heter_workers.size()));
  o.endpoint = ctx.listen_endpoint();
  auto parsed = trainer::ParseDevice(ctx.device());
  if (!parsed.ok()) {
    LOG(ERROR) << "heter_worker: " << parsed.status().ToString();
    return 2;
  }
  o.device = *parsed;
  o.job = std::move(process->job);
  o.auth = std::move(process->transport_auth);
  auto servers = ctx.PeerEndpoints(Role::kServer, o.job.distributed.timeout);
  if (!servers.ok()) {
    LOG(ERROR) << "heter_worker: " << servers.status().ToString();
    return 2;
  }
  o.servers = std::move(servers).value();
  // The same BLAS setting as a CPU worker of the job.
  auto config = worker::ParseWorkerConfig(o.job.root);
  if (config.ok()) trainer::kernels::SetBlasThreads(config->train.blas_threads);
  LOG(INFO) << "heter_worker: " << spec.ToString();

  auto heter = HeterWorker::Create(std::move(o));
  if (!heter.ok()) {
    LOG(ERROR) << "heter_worker: " << heter.status().ToString();
    return heter.status().IsInvalidArgument() ? 2 : 1;
  }
  auto bound = heter.value()->Start();
  if (!bound.ok()) {
    LOG(ERROR) << "heter_worker: " << bound.status().ToString();
    return 2;
  }
  if (Status s = ctx.Announce(bound.value()); !s.ok()) {
    LOG(ERROR) << "heter_worker: " << s.ToString();
    return 2;
  }
  // Started by hand: ends with the job (every worker done, or a process
  // failed), which the KV store tells (comm/job_liveness.h).
  const std::string name = "heter_worker " + std::to_string(spec.rank);
  Result<std::unique_ptr<JobLiveness>> liveness =
      WatchPeersByHand(ctx, name, std::max<int>(1, static_cast<int>(spec.workers.size())));
  if (!liveness.ok()) {
    LOG(ERROR) << name << ": " << liveness.status().ToString();
    return 1;
  }
  JobLiveness* watch = liveness->get();
  // Serves until told to stop; the loop only bounds each wait.
  while (!ctx.WaitForStop(std::chrono::milliseconds(watch != nullptr ? 250 : 1000))) {
    if (watch != nullptr && watch->WorkersDone()) {
      LOG(INFO) << name << ": every worker is done; stopping";
      break;
    }
  }
  const bool shut = heter.value()->Shutdown().ok();
  if (watch != nullptr && watch->failure()) return 1;
  return shut ? 0 : 1;
}

}  // namespace fleet::heter
