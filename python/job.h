// Job: a Python process's place in a parameter-server job, as the fleetps
// module (python/fleetps_module.cc) sees it: the same bootstrap as ps_worker
// (ps/ps_process.h, worker::JoinAsWorker), then one PsClient and the
// communicators made over it. Everything Python calls goes through the
// public C++ API (ps::PsClient, worker::Communicator); this class only owns
// them and decides the order in which they go away.
//
//   JobOptions o;                                   // fleetps.init(servers=..., config=...)
//   o.env = {{"FLEET_SERVERS", "127.0.0.1:7000"}, {"FLEET_CONFIG", "job.yaml"}};
//   FLEET_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Job::Join(std::move(o)));
//   FLEET_ASSIGN_OR_RETURN(std::shared_ptr<ps::PsClient> client, job->client());
//
// Lifetime: Close() (fleetps calls it from atexit, or the user) ends the
// communicators first (an async one sends what it queued), then aborts the
// client: calls in flight and later ones fail with Unavailable, and later
// client() / communicator calls fail with FailedPrecondition. Objects that
// still hold the client keep it alive (its threads end when the last goes).
//
// Thread safety: every method is thread-safe. A CommunicatorHandle
// serialises the calls to its communicator (which is driven by one thread).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/status.h"
#include "ps/client.h"
#include "ps/ps_process.h"
#include "worker/communicator.h"

namespace fleet::python {

struct JobOptions {
  // FLEET_* values given by hand (fleetps.init(servers=...) sets
  // FLEET_SERVERS): they win over the process environment, which fleetrun
  // fills (comm/cluster.h lists the variables). Keys must start "FLEET_".
  std::map<std::string, std::string> env;
  // The longest wait for the servers' endpoints in the KV store (port-0
  // servers publish theirs when bound). 0: the job's Distributed.timeout_ms.
  std::chrono::milliseconds timeout{0};
};

class CommunicatorHandle;

class Job {
 public:
  // Reads the job (the role must be worker: the default, or FLEET_ROLE),
  // its config and credentials, claims the worker rank in the KV store,
  // resolves the servers' endpoints and makes the client. Blocks up to
  // options.timeout (servers not yet published) plus 10 s (rank claim).
  // Errors: InvalidArgument for anything ProcessContext, the job config or
  // TransportAuth refuses (a bad variable, a missing or unreadable config,
  // auth on and no job secret, a key not named FLEET_*), no servers, or a
  // second process given this rank; NotFound / IOError for files; Timeout
  // naming the servers that never published; the KV store's errors.
  static Result<std::shared_ptr<Job>> Join(JobOptions options);

  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const ClusterSpec& spec() const { return process_.context->spec(); }
  const ps::JobConfig& config() const { return process_.job; }
  // The servers' real endpoints, by rank.
  const std::vector<std::string>& servers() const { return servers_; }

  // The client; FailedPrecondition once closed.
  Result<std::shared_ptr<ps::PsClient>> client() const;

  // A communicator for the job's Distributed.mode over this job's client
  // (worker::CreateCommunicator). options.num_workers, max_merge and k_steps
  // are set to the job's (its worker count and config); a timeout of 0 to
  // the config's.
  // Errors: FailedPrecondition once closed; CreateCommunicator's.
  Result<std::shared_ptr<CommunicatorHandle>> NewCommunicator(worker::CommunicatorOptions options);

  // Idempotent; see Lifetime above. Blocks while an async communicator
  // flushes (at most its timeout).
  void Close();

 private:
  Job(ps::PsProcess process, std::vector<std::string> servers,
      std::shared_ptr<ps::PsClient> client);

  // Fixed after construction.
  ps::PsProcess process_;
  const std::vector<std::string> servers_;

  mutable std::mutex mu_;
  std::shared_ptr<ps::PsClient> client_;                    // guarded by mu_; null once closed
  std::vector<std::weak_ptr<CommunicatorHandle>> handles_;  // guarded by mu_
};

// One worker::Communicator, its calls serialised, and the client it uses kept
// alive. Each method returns FailedPrecondition once Close() ran (Job::Close
// calls it), else the communicator's result.
class CommunicatorHandle {
 public:
  CommunicatorHandle(std::shared_ptr<ps::PsClient> client, worker::CommunicatorOptions options,
                     std::unique_ptr<worker::Communicator> communicator);
  ~CommunicatorHandle();

  // Runs fn on the communicator under this handle's lock.
  Status Run(const std::function<Status(worker::Communicator&)>& fn);
  // Destroys the communicator (an async one flushes first); idempotent.
  void Close();

  const ps::PsClient& client() const { return *client_; }
  // The options it was made with (its tables).
  const worker::CommunicatorOptions& options() const { return options_; }

 private:
  const std::shared_ptr<ps::PsClient> client_;
  const worker::CommunicatorOptions options_;
  std::mutex mu_;
  std::unique_ptr<worker::Communicator> communicator_;  // guarded by mu_; null once closed
};

}  // namespace fleet::python
