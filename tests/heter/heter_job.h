// A whole heterogeneous PS job inside the test process: the servers and CPU
// workers of tests/worker/worker_test_util.h, plus H HeterWorkers on free
// ports, whose endpoints the workers are given.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "heter/heter_worker.h"
#include "tests/worker/worker_test_util.h"

namespace fleet::heter::testing {

class HeterJob {
 public:
  HeterJob(ps::JobConfig job, int num_servers, int num_workers, int num_heter_workers)
      : job_(std::move(job), num_servers, num_workers) {
    std::vector<std::string> endpoints;
    for (int h = 0; h < num_heter_workers; ++h)
      endpoints.push_back(StartHeter(h, num_heter_workers));
    job_.set_heter_workers(endpoints);
  }

  std::vector<Result<worker::PsWorkerReport>> Run() { return job_.Run(); }
  worker::testing::InProcessJob& job() { return job_; }
  HeterWorker& heter(int h) { return *heters_[h]; }

 private:
  std::string StartHeter(int rank, int count) {
    HeterWorkerOptions o;
    o.rank = rank;
    o.num_heter_workers = count;
    o.servers = job_.servers();
    o.job = job_.job();
    auto h = HeterWorker::Create(o);
    CHECK(h.ok()) << h.status().ToString();
    auto bound = h.value()->Start();
    CHECK(bound.ok()) << bound.status().ToString();
    heters_.push_back(std::move(h).value());
    return bound.value();
  }

  worker::testing::InProcessJob job_;
  std::vector<std::unique_ptr<HeterWorker>> heters_;
};

}  // namespace fleet::heter::testing
