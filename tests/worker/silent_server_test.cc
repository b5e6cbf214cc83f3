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

#include "ps/ps.pb.h"
#include "comm/rpc.h"
#include "tests/ps/ps_cluster.h"

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

}  // namespace
}  // namespace fleet::ps
