// Communicator policies against an in-process PS cluster (tests/ps/ps_cluster.h).
// Tables use plain SGD so the expected server values are exact sums.
#include "worker/communicator.h"

#include <gtest/gtest.h>

#include "tests/ps/ps_cluster.h"

namespace fleet::worker {
namespace {

using ps::testing::MakeJob;
using ps::testing::PsCluster;

constexpr float kLr = 0.5f;
constexpr size_t kDense = 5;
constexpr size_t kDim = 2;

ps::JobConfig Job(const std::string& mode, int k_steps = 2, int max_merge = 3) {
  return MakeJob("Distributed: {mode: " + mode + ", k_steps: " + std::to_string(k_steps) +
                 ", max_merge: " + std::to_string(max_merge) +
                 ", timeout_ms: 5000}\n"
                 "tables:\n"
                 "  - {id: 0, kind: sparse, dim: 2, shard_num: 8, optimizer: {rule: sgd, learning_rate: 0.5}}\n"
                 "  - {id: 1, kind: dense, dim: 5, optimizer: {rule: sgd, learning_rate: 0.5}}\n");
}

CommunicatorOptions Options(int workers) {
  CommunicatorOptions o;
  o.sparse_table = 0;
  o.dense_table = 1;
  o.num_workers = workers;
  o.batch_size = 4;
  o.max_merge = 3;
  o.k_steps = 2;
  return o;
}

std::unique_ptr<Communicator> Make(PsCluster& c, int rank, const CommunicatorOptions& o) {
  auto comm = CreateCommunicator(&c.client(rank), o);
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  return std::move(comm).value();
}

std::vector<float> PullDense(PsCluster& c) {
  std::vector<float> v(kDense);
  EXPECT_TRUE(c.client(0).PullDense(1, v).ok());
  return v;
}

std::vector<float> PullRows(PsCluster& c, const std::vector<uint64_t>& keys) {
  std::vector<float> v(keys.size() * kDim);
  EXPECT_TRUE(c.client(0).PullSparse(0, keys, v).ok());
  return v;
}

// Worker w's gradient: distinct per worker, step and element.
std::vector<float> DenseGrad(int w, int step) {
  std::vector<float> g(kDense);
  for (size_t j = 0; j < kDense; ++j) g[j] = 0.01f * (w + 1) + 0.001f * step + 0.1f * j;
  return g;
}

TEST(CommunicatorTest, FactoryPicksTheModeAndValidates) {
  for (const char* mode : {"sync", "async", "geo"}) {
    PsCluster c(Job(mode), 1, 1);
    auto comm = Make(c, 0, Options(1));
    EXPECT_STREQ(comm->name(), mode);
  }
  PsCluster c(Job("sync"), 1, 1);
  CommunicatorOptions bad = Options(1);
  bad.sparse_table = 1;  // a dense table
  auto r = CreateCommunicator(&c.client(0), bad);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("not sparse"), std::string::npos) << r.status().ToString();
  bad = Options(1);
  bad.dense_table = 9;
  r = CreateCommunicator(&c.client(0), bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no dense table"), std::string::npos);
  bad = Options(0);
  EXPECT_TRUE(CreateCommunicator(&c.client(0), bad).status().IsInvalidArgument());
}

TEST(CommunicatorTest, SyncAppliesTheRankOrderedSumOncePerStep) {
  PsCluster c(Job("sync"), 2, 2);
  std::vector<float> init(kDense, 1.0f);
  ASSERT_TRUE(c.client(0).InitDense(1, init).ok());
  const std::vector<uint64_t> keys = {3, 7, 3};
  const std::vector<float> rows0 = PullRows(c, {3, 7});
  c.RunWorkers([&](int w) {
    auto comm = Make(c, w, Options(2));
    EXPECT_DOUBLE_EQ(comm->GradientScale(4), 0.5);
    EXPECT_DOUBLE_EQ(comm->GradientScale(2), 0.25);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> dense = DenseGrad(w, step);
      std::vector<float> sparse(keys.size() * kDim, 0.1f * (w + 1));
      // Worker 1 has no batch at step 2: it still pushes (empty).
      PushRequest req;
      if (!(w == 1 && step == 2)) req = {keys, sparse, dense};
      Status s = comm->Push(req);
      ASSERT_TRUE(s.ok()) << s.ToString();
      // Push returned: every worker's push of this step is applied.
      std::vector<float> pulled(kDense);
      ASSERT_TRUE(comm->Pull({.dense_values = pulled}).ok());
      std::vector<float> expect = init;
      for (int t = 0; t <= step; ++t) {
        for (int r = 0; r < 2; ++r) {
          if (r == 1 && t == 2) continue;
          std::vector<float> g = DenseGrad(r, t);
          for (size_t j = 0; j < kDense; ++j) expect[j] -= kLr * g[j];
        }
      }
      for (size_t j = 0; j < kDense; ++j) EXPECT_NEAR(pulled[j], expect[j], 1e-6) << j;
    }
  });
  // Key 3 appears twice per push: rows move by lr * 2 * g for key 3 and lr * g for key 7.
  const std::vector<float> rows = PullRows(c, {3, 7});
  const float g_sum = 0.1f * 2 + 0.2f * 2 + 0.1f;  // worker 0 three steps, worker 1 two
  for (size_t j = 0; j < kDim; ++j) {
    EXPECT_NEAR(rows[j], rows0[j] - kLr * 2 * g_sum, 1e-5);
    EXPECT_NEAR(rows[kDim + j], rows0[kDim + j] - kLr * g_sum, 1e-5);
  }
}

TEST(CommunicatorTest, AsyncMergesInTheBackgroundAndFlushDrains) {
  PsCluster c(Job("async"), 2, 1);
  std::vector<float> init(kDense, 0.0f);
  ASSERT_TRUE(c.client(0).InitDense(1, init).ok());
  const std::vector<float> rows0 = PullRows(c, {11});
  auto comm = Make(c, 0, Options(1));
  auto* async = dynamic_cast<AsyncCommunicator*>(comm.get());
  ASSERT_NE(async, nullptr);
  EXPECT_DOUBLE_EQ(comm->GradientScale(3), 1.0);
  const int pushes = 20;
  std::vector<float> expect(kDense, 0.0f);
  const std::vector<uint64_t> keys = {11};
  for (int step = 0; step < pushes; ++step) {
    std::vector<float> dense = DenseGrad(0, step);
    std::vector<float> sparse = {1.0f, -1.0f};
    ASSERT_TRUE(comm->Push({keys, sparse, dense}).ok());
    for (size_t j = 0; j < kDense; ++j) expect[j] -= kLr * dense[j];
  }
  ASSERT_TRUE(comm->Flush().ok());
  EXPECT_GE(async->sends(), (pushes + 2) / 3);  // at most max_merge per send
  EXPECT_LE(async->sends(), pushes);
  // SGD: merging batches changes nothing but the number of sends.
  const std::vector<float> pulled = PullDense(c);
  for (size_t j = 0; j < kDense; ++j) EXPECT_NEAR(pulled[j], expect[j], 1e-4) << j;
  const std::vector<float> rows = PullRows(c, {11});
  EXPECT_NEAR(rows[0], rows0[0] - kLr * pushes, 1e-4);
  EXPECT_NEAR(rows[1], rows0[1] + kLr * pushes, 1e-4);
}

TEST(CommunicatorTest, AsyncSurfacesSendErrorsToTheTrainer) {
  ps::JobConfig job = Job("async");
  job.distributed.timeout = std::chrono::milliseconds(300);
  std::vector<std::string> dead;
  {
    PsCluster c(job, 1, 1);
    dead = c.endpoints();
  }  // servers gone: every send fails
  ps::PsClientOptions co;
  co.servers = dead;
  auto client = ps::PsClient::Create(co, job);
  ASSERT_TRUE(client.ok());
  auto comm = CreateCommunicator(client.value().get(), Options(1));
  ASSERT_TRUE(comm.ok());
  std::vector<float> dense(kDense, 1.0f);
  Status s = comm.value()->Push({.dense_grads = dense});
  ASSERT_TRUE(s.ok()) << "the first push only queues";
  s = comm.value()->Flush();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.IsTimeout() || s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.message().find("async communicator send"), std::string::npos) << s.ToString();
  // Later calls keep reporting it instead of queueing more.
  EXPECT_FALSE(comm.value()->Push({.dense_grads = dense}).ok());
  std::vector<float> out(kDense);
  EXPECT_FALSE(comm.value()->Pull({.dense_values = out}).ok());
}

TEST(CommunicatorTest, GeoTrainsLocallyAndExchangesAveragedDeltasEveryKSteps) {
  PsCluster c(Job("geo", /*k_steps=*/2), 1, 2);
  std::vector<float> init(kDense, 1.0f);
  ASSERT_TRUE(c.client(0).InitDense(1, init).ok());
  auto w0 = Make(c, 0, Options(2));
  auto w1 = Make(c, 1, Options(2));
  auto* geo = dynamic_cast<GeoCommunicator*>(w0.get());
  ASSERT_NE(geo, nullptr);
  const std::vector<uint64_t> keys = {5};
  const std::vector<float> row0 = PullRows(c, keys);
  std::vector<float> dense(kDense), row(kDim);

  // Step 1 on worker 0: local copy moves, the servers do not.
  ASSERT_TRUE(w0->Pull({keys, row, dense}).ok());
  std::vector<float> g(kDense, 1.0f), sg = {2.0f, 0.0f};
  ASSERT_TRUE(w0->Push({keys, sg, g}).ok());
  ASSERT_TRUE(w0->Pull({keys, row, dense}).ok());
  EXPECT_NEAR(dense[0], 1.0f - kLr, 1e-6);
  EXPECT_NEAR(row[0], row0[0] - kLr * 2, 1e-6);
  EXPECT_NEAR(PullDense(c)[0], 1.0f, 1e-6);
  EXPECT_EQ(geo->exchanges(), 0);

  // Step 2 (k_steps): exchange; the servers move by delta / num_workers.
  ASSERT_TRUE(w0->Push({keys, sg, g}).ok());
  EXPECT_EQ(geo->exchanges(), 1);
  EXPECT_NEAR(PullDense(c)[0], 1.0f - 2 * kLr / 2, 1e-6);
  EXPECT_NEAR(PullRows(c, keys)[0], row0[0] - 2 * kLr * 2 / 2, 1e-6);

  // Worker 1's Flush sends its own delta on top; its next Pull sees both.
  ASSERT_TRUE(w1->Pull({keys, row, dense}).ok());
  ASSERT_TRUE(w1->Push({.sparse_keys = keys, .sparse_grads = sg, .dense_grads = g}).ok());
  ASSERT_TRUE(w1->Flush().ok());
  ASSERT_TRUE(w1->Pull({keys, row, dense}).ok());
  EXPECT_NEAR(dense[0], 1.0f - kLr - kLr / 2, 1e-6);
  // A push of a key never pulled since the last exchange is refused.
  const std::vector<uint64_t> other = {99};
  Status s = w1->Push({.sparse_keys = other, .sparse_grads = sg});
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
}

}  // namespace
}  // namespace fleet::worker
