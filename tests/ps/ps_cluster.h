// PsCluster: S parameter servers and W clients in one process, on free
// ports, for tests. Servers run on their own RpcNode threads; clients are
// driven by the test (often from W threads via RunWorkers, which rethrows
// the first failure after releasing the others).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ps/client.h"
#include "ps/server.h"

namespace fleet::ps::testing {

inline JobConfig MakeJob(const std::string& yaml) {
  auto job = ParseJobConfig(YAML::Load(yaml));
  CHECK(job.ok()) << job.status().ToString();
  return std::move(job).value();
}

class PsCluster {
 public:
  // `server_options` adjusts each server's options last (may be empty).
  PsCluster(const JobConfig& job, int num_servers, int num_workers,
            const std::function<void(PsServerOptions&)>& server_options = {})
      : job_(job) {
    for (int s = 0; s < num_servers; ++s) {
      PsServerOptions o;
      o.rank = s;
      o.num_servers = num_servers;
      o.num_workers = num_workers;
      o.job = job;
      if (server_options) server_options(o);
      auto server = PsServer::Create(o);
      CHECK(server.ok()) << server.status().ToString();
      auto bound = server.value()->Start();
      CHECK(bound.ok()) << bound.status().ToString();
      endpoints_.push_back(bound.value());
      servers_.push_back(std::move(server).value());
    }
    for (int w = 0; w < num_workers; ++w) {
      PsClientOptions o;
      o.servers = endpoints_;
      o.worker_rank = w;
      o.num_workers = num_workers;
      auto client = PsClient::Create(o, job);
      CHECK(client.ok()) << client.status().ToString();
      clients_.push_back(std::move(client).value());
    }
  }

  PsServer& server(int s) { return *servers_[s]; }

  // Destroys server s without a save, as a crash would leave its files,
  // and starts a new one as fleetrun --max_restart does (restarted) on the
  // same endpoint, so the clients reconnect to it. On error (Create's or
  // Start's) server s is gone.
  Status RestartServer(int s, FileSystem* fs = nullptr) {
    servers_[s].reset();
    PsServerOptions o;
    o.rank = s;
    o.num_servers = num_servers();
    o.num_workers = num_workers();
    o.job = job_;
    o.endpoint = endpoints_[s];
    o.restarted = true;
    o.fs = fs;
    FLEET_ASSIGN_OR_RETURN(servers_[s], PsServer::Create(o));
    return servers_[s]->Start().status();
  }
  PsClient& client(int w) { return *clients_[w]; }
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  int num_servers() const { return static_cast<int>(servers_.size()); }
  int num_workers() const { return static_cast<int>(clients_.size()); }

  // Runs fn(rank) on one thread per worker and joins them all. A failed
  // gtest assertion inside fn fails the test; an exception is rethrown
  // here after every thread finished.
  void RunWorkers(const std::function<void(int rank)>& fn) {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(clients_.size());
    for (size_t w = 0; w < clients_.size(); ++w) {
      threads.emplace_back([&, w] {
        try {
          fn(static_cast<int>(w));
        } catch (...) {
          errors[w] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

 private:
  JobConfig job_;
  std::vector<std::unique_ptr<PsServer>> servers_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<PsClient>> clients_;
};

}  // namespace fleet::ps::testing
