// A silent parameter server (alive but never answering: SIGSTOP, a hung
// handler) in sync mode. A worker's push to it also waits at a live server
// for another worker that is itself stuck on the silent one; the live
// server gives up a tenth of the deadline earlier ("no push from worker
// 0"), but the push must report the silent server, the cause, naming it and
// its endpoint (tests/launch/chaos_test.cc shows the same through fleetrun).
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "comm/rpc.h"
#include "ps/ps.pb.h"
#include "tests/ps/ps_cluster.h"
#include "tests/worker/worker_test_util.h"

namespace fleet::ps {
namespace {

using Clock = std::chrono::steady_clock;

TEST(SilentServerTest, ASyncPushNamesTheSilentServerNotTheWorkerItHolds) {
  const JobConfig job = testing::MakeJob(
      "Distributed: {mode: sync, timeout_ms: 1000}\n"
      "tables:\n"
      "  - {id: 0, kind: dense, dim: 10, optimizer: {rule: sgd, learning_rate: 1.0}}\n");
  // Server 0: a real one, expecting 2 workers.
  PsServerOptions so;
  so.rank = 0;
  so.num_servers = 2;
  so.num_workers = 2;
  so.job = job;
  auto server = PsServer::Create(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto live = server.value()->Start();
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  // Server 1: takes the pushes and never answers.
  RpcNodeOptions ro;
  ro.name = "silent server 1";
  auto silent = RpcNode::Create(ro);
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  std::mutex mu;
  std::vector<Responder> held;
  silent.value()->Register(pb::PS_PUSH_DENSE_GRAD, [&](Message, Responder r) {
    std::lock_guard<std::mutex> lock(mu);
    held.push_back(std::move(r));
  });
  auto silent_endpoint = silent.value()->Listen("127.0.0.1:0");
  ASSERT_TRUE(silent_endpoint.ok()) << silent_endpoint.status().ToString();

  // Worker 1 of 2 pushes step 0; worker 0 never does (stuck on server 1).
  PsClientOptions co;
  co.servers = {live.value(), silent_endpoint.value()};
  co.worker_rank = 1;
  co.num_workers = 2;
  auto client = PsClient::Create(co, job);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::vector<float> grads(10, 1.0f);
  PushOptions po;
  po.step = 0;
  const auto start = Clock::now();
  const Status s = client.value()->PushDenseGrad(0, grads, po);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  EXPECT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_NE(s.ToString().find("on server 1 got no reply within"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find(silent_endpoint.value()), std::string::npos) << s.ToString();
  EXPECT_EQ(s.ToString().find("no push from worker 0"), std::string::npos) << s.ToString();
  EXPECT_GE(seconds, 0.9);  // the deadline, not an earlier answer
  EXPECT_LT(seconds, 3.0);
  client.value().reset();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(held.size(), 1u);
  held.clear();
}

// A worker told to stop (SIGTERM) while its step waits on a server that
// never answers (frozen, or on a host that froze) ends within a second or
// two, although the request's deadline is a minute away: fleetrun's grace
// (5 s) would otherwise run out and SIGKILL it, so that a cluster whose
// host froze failed only after 10 s.
TEST(SilentServerTest, AWorkerToldToStopDoesNotWaitOutTheDeadline) {
  const std::string dir = worker::testing::FreshDir("stop_while_waiting");
  worker::testing::MakeCtrData(dir, 2000);
  auto ctr = worker::testing::LoadCtrJob(dir);
  ASSERT_TRUE(ctr.ok()) << ctr.status().ToString();
  ctr->job.distributed.timeout = std::chrono::seconds(60);
  // A server that takes every request and answers none.
  RpcNodeOptions ro;
  ro.name = "silent server";
  auto silent = RpcNode::Create(ro);
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  std::mutex mu;
  std::vector<Responder> held;
  for (int command = 0; command < 64; ++command) {
    silent.value()->Register(static_cast<uint32_t>(command), [&](Message, Responder r) {
      std::lock_guard<std::mutex> lock(mu);
      held.push_back(std::move(r));
    });
  }
  auto endpoint = silent.value()->Listen("127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  std::atomic<bool> stop{false};
  worker::PsWorkerOptions o;
  o.servers = {endpoint.value()};
  o.job = ctr->job;
  o.stop = &stop;
  Result<worker::PsWorkerReport> report = Status::Internal("not run");
  std::thread run([&] { report = worker::RunPsWorker(o); });
  // Wait until the worker's first request is held, then ask it to stop.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!held.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto asked = Clock::now();
  stop.store(true);
  run.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - asked).count();
  EXPECT_FALSE(report.ok());
  EXPECT_LT(seconds, 3.0) << report.status().ToString();
  EXPECT_GE(seconds, 0.9) << "the grace for the current step";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_FALSE(held.empty());
  held.clear();
}

}  // namespace
}  // namespace fleet::ps
