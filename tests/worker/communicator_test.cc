// Communicator policies against an in-process PS cluster (tests/ps/ps_cluster.h).
// Tables use plain SGD so the expected server values are exact sums.
#include "worker/communicator.h"

#include <gtest/gtest.h>

#include "ps/table/accessor.h"
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
  // A push of a key not pulled since the last exchange (a pipeline pulls
  // ahead) reads it first and applies the gradient to the fresh value.
  const std::vector<uint64_t> other = {99};
  const float fresh99 = PullRows(c, other)[0];
  ASSERT_TRUE(w1->Push({.sparse_keys = other, .sparse_grads = sg}).ok());
  // That was worker 1's second push: an exchange, the servers moved by half.
  ASSERT_TRUE(w1->Pull({other, row, dense}).ok());
  EXPECT_NEAR(row[0], fresh99 - kLr * 2 / 2, 1e-6);
}

// How a heter worker pushes: a dense-only sync communicator pushes each
// micro-batch's gradient into a slot of another worker's step, without
// waiting (StartPush) and idempotently, and empty gradients as zeros; its
// own step count is not touched.
TEST(CommunicatorTest, SyncSlotsStartWithoutWaitingAndResendsApplyOnce) {
  PsCluster c(Job("sync"), 2, 2);
  std::vector<float> init(kDense, 0.0f);
  ASSERT_TRUE(c.client(0).InitDense(1, init).ok());
  CommunicatorOptions o = Options(2);
  o.sparse_table.reset();
  auto h0 = Make(c, 0, o);
  auto h1 = Make(c, 1, o);
  const std::vector<float> g0 = DenseGrad(0, 0), g2 = DenseGrad(2, 0);
  // Step 0 has three slots: 0 and 2 computed by h0, slot 1 empty (h1).
  PendingPush p0 = h0->StartPush({.dense_grads = g0, .sync_slot = SyncSlot{0, 0, 3}});
  PendingPush p2 = h0->StartPush({.dense_grads = g2, .sync_slot = SyncSlot{0, 2, 3}});
  // Slot 2 resent elsewhere (the first heter worker was thought dead).
  PendingPush again = h1->StartPush({.dense_grads = g2, .sync_slot = SyncSlot{0, 2, 3}});
  EXPECT_NEAR(PullDense(c)[0], 0.0f, 1e-7) << "the step waits for slot 1";
  ASSERT_TRUE(h1->StartPush({.sync_slot = SyncSlot{0, 1, 3}}).Wait().ok());
  ASSERT_TRUE(p0.Wait().ok());
  ASSERT_TRUE(p2.Wait().ok());
  ASSERT_TRUE(again.Wait().ok());
  const std::vector<float> v = PullDense(c);
  for (size_t j = 0; j < kDense; ++j) EXPECT_NEAR(v[j], -kLr * (g0[j] + g2[j]), 1e-6) << j;
  // The communicators' own steps still start at 0: two plain pushes, one
  // per worker, make step 0 of a 2-worker step... which was applied above as
  // a 3-slot step, so the servers refuse it.
  Status s = h0->Push({.dense_grads = g0});
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("sync push step 0"), std::string::npos) << s.ToString();
}

// CTR accessor: every mode delivers the shows and clicks of its pushes,
// summed per key (async merges, geo sums until the exchange).
class CommunicatorCountsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CommunicatorCountsTest, ShowsAndClicksReachTheServers) {
  PsCluster c(MakeJob("Distributed: {mode: " + GetParam() +
                      ", k_steps: 100, max_merge: 4, timeout_ms: 5000}\n"
                      "tables:\n"
                      "  - {id: 0, kind: sparse, dim: 2, accessor: ctr, shard_num: 8,\n"
                      "     ctr: {embed_dim: 1, embedx_threshold: 100}}\n"),
              1, 1);
  CommunicatorOptions o = Options(1);
  o.dense_table.reset();
  auto comm = Make(c, 0, o);
  const std::vector<uint64_t> keys = {3, 3, 7};
  std::vector<float> rows(keys.size() * 3), grads(keys.size() * 3, 0.1f);
  const std::vector<float> shows = {1, 1, 1}, clicks = {1, 0, 1};
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(comm->Pull({.sparse_keys = keys, .sparse_values = rows}).ok());
    Status s = comm->Push({.sparse_keys = keys,
                           .sparse_grads = grads,
                           .sparse_shows = shows,
                           .sparse_clicks = clicks});
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_TRUE(comm->Flush().ok());
  auto counts = [&](uint64_t key) {
    std::vector<float> row, ext;
    EXPECT_TRUE(c.server(0).sparse_table(0)->DebugRow(key, &row, &ext)) << key;
    return std::make_pair(row[ps::CtrAccessor::kShow], row[ps::CtrAccessor::kClick]);
  };
  EXPECT_EQ(counts(3), std::make_pair(4.0f, 2.0f));
  EXPECT_EQ(counts(7), std::make_pair(2.0f, 2.0f));
  // Counts that do not match the keys are refused.
  const std::vector<float> one = {1};
  Status s = comm->Push(
      {.sparse_keys = keys, .sparse_grads = grads, .sparse_shows = one, .sparse_clicks = one});
  EXPECT_FALSE(s.ok());
}

INSTANTIATE_TEST_SUITE_P(Modes, CommunicatorCountsTest, ::testing::Values("sync", "async", "geo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fleet::worker
