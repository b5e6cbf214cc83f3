// PsLiteCluster: ps-lite itself as ps_bench's peer. Runs pslite_driver
// (bench/pslite_driver.cc, built against a ps-lite built outside this
// project) as a ps-lite job of child processes: a scheduler, the servers and
// one process per worker, all on 127.0.0.1, and drives the workers' command
// lines (see pslite_driver.cc) so ps_bench can alternate ps-lite's rounds
// with FleetPS's on the same workload (bench/ps_workload.h).
//
// CPU is read from /proc for every process of the job: the workers' is the
// client side, the servers' and the scheduler's the server side.
//
// Every call waits for the workers' answers at most
// PsLiteClusterOptions::timeout and then fails with Timeout naming the
// command; a worker that died gives Unavailable. After an error the cluster
// should be destroyed.
//
// Thread safety: one thread at a time.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench/child.h"
#include "bench/ps_workload.h"
#include "comm/status.h"

namespace fleet::bench {

struct PsLiteClusterOptions {
  std::string binary;  // path of pslite_driver
  int servers = 1;
  int workers = 1;
  size_t dim = 1;
  TableRule rule;
  // Bounds every wait for the workers (start-up, each command).
  std::chrono::seconds timeout{300};
};

// One timed run of every worker.
struct PsLiteRun {
  std::vector<double> lat_us;  // every op of every worker, issue to completion
  double wall_s = 0;           // the slowest worker's
  double client_cpu_s = 0;     // the worker processes'
  double server_cpu_s = 0;     // the servers' and the scheduler's
};

class PsLiteCluster {
 public:
  // Starts the job and waits until every worker is through ps::Start.
  // IOError when a process cannot be started; Timeout / Unavailable when
  // the job does not come up (the scheduler's port taken meanwhile, a bad
  // binary).
  static Result<std::unique_ptr<PsLiteCluster>> Start(const PsLiteClusterOptions& options);
  // Tells the workers to quit (ps::Finalize) and reaps every process.
  ~PsLiteCluster();
  PsLiteCluster(const PsLiteCluster&) = delete;
  PsLiteCluster& operator=(const PsLiteCluster&) = delete;

  // Worker w's request key sets: KeySets(universe, starts[w], keys), and
  // `window` requests in flight. REQUIRES: starts.size() == workers.
  Status Prepare(int window, size_t keys, uint64_t universe, const std::vector<uint64_t>& starts);
  // On worker 0: two pushes of VerifyGradient to n fresh keys (KeyOf(first
  // + i)), pulled back and compared with the rule. Corruption when wrong.
  Status Verify(size_t n, uint64_t first_index);
  // On worker 0: every row KeyOf(0 .. universe-1), zero gradients.
  Status Populate(uint64_t universe);
  // `ops` requests on every worker at once (after Prepare).
  Result<PsLiteRun> Run(bool push, int64_t ops);

  // The worker processes, and the servers' and the scheduler's.
  std::vector<pid_t> client_pids() const;
  std::vector<pid_t> server_pids() const;

 private:
  PsLiteCluster() = default;
  // Sends `line` to the workers in `which` and returns their answers.
  Result<std::vector<std::string>> Ask(const std::vector<int>& which, const std::string& line);
  double CpuSeconds(const std::vector<Child>& processes) const;

  PsLiteClusterOptions options_;
  std::vector<Child> servers_;  // the scheduler first
  std::vector<Child> workers_;
};

}  // namespace fleet::bench
