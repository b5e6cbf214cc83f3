// PsServer + PsClient over real sockets, servers and workers in one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>

#include "ps/ps.pb.h"
#include "ps/table/partition.h"
#include "tests/ps/ps_cluster.h"

namespace fleet::ps {
namespace {

using testing::MakeJob;
using testing::PsCluster;
using namespace std::chrono_literals;

// Table 0: sparse dim 4, sgd lr 1, zeros; table 1: dense dim 10, sgd lr 1.
std::string Tables(int shard_num = 16, const std::string& partition = "hash") {
  return "tables:\n"
         "  - {id: 0, kind: sparse, dim: 4, shard_num: " +
         std::to_string(shard_num) + ", partition: " + partition +
         ",\n"
         "     optimizer: {rule: sgd, learning_rate: 1.0}}\n"
         "  - {id: 1, kind: dense, dim: 10, optimizer: {rule: sgd, learning_rate: 1.0}}\n";
}

// Key i of n distinct keys spread over the whole uint64 range, increasing
// with i: what the range partition spreads over servers.
uint64_t SpreadKey(uint64_t i, uint64_t n) { return i * (UINT64_MAX / n) + 5; }

// max_request_bytes < 0: the default.
JobConfig Job(const std::string& mode, int shard_num = 16, int64_t max_request_bytes = -1) {
  const std::string limit =
      max_request_bytes < 0 ? "" : ", max_request_bytes: " + std::to_string(max_request_bytes);
  return MakeJob("Distributed: {mode: " + mode + ", timeout_ms: 10000" + limit + "}\n" +
                 Tables(shard_num));
}

std::vector<float> PullRows(PsClient& c, const std::vector<uint64_t>& keys) {
  std::vector<float> v(keys.size() * c.PullDim(0));
  Status s = c.PullSparse(0, keys, v);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return v;
}

TEST(PsServerTest, ConcurrentPushesFromManyWorkersLoseNoUpdate) {
  // 2 servers x 3 workers, async: every worker pushes +1 to every key many
  // times; with sgd lr 1 each value must end at exactly -(workers * rounds).
  // Also with busy polling, where servers and waiting workers spin.
  for (const auto busy_poll : {0us, 200us}) {
    SCOPED_TRACE("busy_poll_us " + std::to_string(busy_poll.count()));
    JobConfig job = Job("async");
    job.distributed.busy_poll = busy_poll;
    PsCluster cluster(job, 2, 3);
    std::vector<uint64_t> keys(500);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 + 3;
    constexpr int kRounds = 20;
    cluster.RunWorkers([&](int rank) {
      std::vector<float> ones(keys.size() * 4, 1.0f);
      for (int r = 0; r < kRounds; ++r) {
        Status s = cluster.client(rank).PushSparseGrad(0, keys, ones);
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
    });
    const auto v = PullRows(cluster.client(0), keys);
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], -3.0f * kRounds) << "element " << i;
    // Both servers got keys, and together they hold each key once.
    auto stats = cluster.client(0).Stats();
    ASSERT_TRUE(stats.ok());
    uint64_t rows = 0;
    for (const auto& s : stats.value()) {
      EXPECT_GT(s.tables(0).rows(), 0u);
      rows += s.tables(0).rows();
    }
    EXPECT_EQ(rows, keys.size());
  }
}

TEST(PsServerTest, DuplicateKeysAreMergedAndScatteredBack) {
  PsCluster cluster(Job("async"), 2, 1);
  PsClient& c = cluster.client(0);
  const std::vector<uint64_t> keys = {5, 9, 5, 5, 1000001};
  std::vector<float> grads(keys.size() * 4);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 4 + 1);
  ASSERT_TRUE(c.PushSparseGrad(0, keys, grads).ok());
  const auto v = PullRows(c, keys);
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(v[0 * 4 + d], -3.0f * (d + 1));  // key 5 pushed three times
    EXPECT_EQ(v[2 * 4 + d], v[0 * 4 + d]);     // duplicates get the same row
    EXPECT_EQ(v[1 * 4 + d], -1.0f * (d + 1));
  }
}

// Keys in strictly increasing order skip the de-duplication table; a key
// repeated anywhere (within the client's blocks of eight comparisons or in
// its tail) must still be merged: with adagrad, one push of gradient 2 is
// not two pushes of 1.
TEST(PsServerTest, ARepeatedKeyAnywhereInIncreasingKeysIsMerged) {
  PsCluster cluster(MakeJob("Distributed: {mode: async, timeout_ms: 10000}\n"
                            "tables:\n"
                            "  - {id: 0, kind: sparse, dim: 1, shard_num: 16,\n"
                            "     optimizer: {rule: adagrad, learning_rate: 0.5}}\n"),
                    2, 1);
  PsClient& c = cluster.client(0);
  constexpr size_t kKeys = 19;
  for (size_t repeat : {1, 7, 8, 9, 15, 16, 17, 18}) {
    SCOPED_TRACE("repeated at " + std::to_string(repeat));
    const uint64_t base = 1000 * (repeat + 1);
    std::vector<uint64_t> keys(kKeys);
    for (size_t i = 0; i < kKeys; ++i) keys[i] = base + i;
    keys[repeat] = keys[repeat - 1];
    ASSERT_TRUE(c.PushSparseGrad(0, keys, std::vector<float>(kKeys, 1.0f)).ok());
    const uint64_t control = base + 500;  // one push of the merged gradient
    ASSERT_TRUE(c.PushSparseGrad(0, std::vector<uint64_t>{control}, std::vector<float>{2.0f}).ok());
    const auto v = PullRows(c, {keys[repeat], control, keys[0] == keys[repeat] ? keys[2] : keys[0]});
    EXPECT_EQ(v[0], v[1]);
    EXPECT_NE(v[0], v[2]);  // a key pushed once differs
  }
}

// Increasing keys are split over the servers in one pass into regions
// sized for an even share; keys that all belong to one server overflow its
// region and take the two-pass split instead. Either way each key's
// gradient reaches its row and each pulled row comes back to its key's
// place.
TEST(PsServerTest, IncreasingKeysSplitRightWhetherSpreadOrAllOnOneServer) {
  constexpr uint32_t kShards = 16;
  PsCluster cluster(Job("async", kShards), 2, 1);
  PsClient& c = cluster.client(0);
  const ShardRange first_server = AssignShards(kShards, 2, 0).value();
  std::vector<uint64_t> spread, one_server;
  for (uint64_t k = 1; one_server.size() < 400; ++k) {
    if (spread.size() < 400) spread.push_back(k);
    if (first_server.contains(ShardOfKey(k + 1000000, kShards))) one_server.push_back(k + 1000000);
  }
  for (const auto* keys : {&spread, &one_server}) {
    SCOPED_TRACE(keys == &spread ? "spread" : "all on server 0");
    std::vector<float> grads(keys->size() * 4);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i + 1);
    ASSERT_TRUE(c.PushSparseGrad(0, *keys, grads).ok());
    const auto v = PullRows(c, *keys);  // sgd, lr 1, from zeros
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], -grads[i]) << "element " << i;
  }
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats.value()[0].tables(0).rows() + stats.value()[1].tables(0).rows(), 800u);
}

// Under the range partition a worker splits increasing keys into one run
// per server by binary search for each server's smallest key: keys on
// both sides of every boundary, the ends of the key space, requests that
// leave some servers without keys and an empty request all reach the
// servers holding them (a server refuses a key it does not hold) and come
// back to their places.
TEST(PsServerTest, RangePartitionSplitsIncreasingKeysAtServerBoundaries) {
  constexpr uint32_t kShards = 16;
  PsCluster cluster(
      MakeJob("Distributed: {mode: async, timeout_ms: 10000}\n" + Tables(kShards, "range")), 3, 1);
  PsClient& c = cluster.client(0);
  std::vector<uint64_t> first_keys;  // of servers 1 and 2
  for (int r = 1; r < 3; ++r)
    first_keys.push_back(FirstKeyOfShard(AssignShards(kShards, 3, r).value().begin, kShards));
  const std::vector<uint64_t> all = {0,
                                     1,
                                     first_keys[0] - 1,
                                     first_keys[0],
                                     first_keys[0] + 1,
                                     first_keys[1] - 1,
                                     first_keys[1],
                                     first_keys[1] + 1,
                                     UINT64_MAX - 1,
                                     UINT64_MAX};
  const std::vector<uint64_t> last_server_only = {first_keys[1], UINT64_MAX};
  const std::vector<uint64_t> first_server_only = {0, first_keys[0] - 1};
  const std::vector<uint64_t> middle_only = {first_keys[0]};
  for (const auto* keys : {&all, &last_server_only, &first_server_only, &middle_only}) {
    std::vector<float> grads(keys->size() * 4);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i + 1);
    std::vector<float> before = PullRows(c, *keys);
    Status s = c.PushSparseGrad(0, *keys, grads);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const auto after = PullRows(c, *keys);  // sgd, lr 1
    for (size_t i = 0; i < after.size(); ++i)
      ASSERT_EQ(after[i], before[i] - grads[i])
          << "element " << i << " of " << keys->size() << " keys";
  }
  std::vector<float> none;
  ASSERT_TRUE(c.PullSparse(0, {}, none).ok());
  ASSERT_TRUE(c.PushSparseGrad(0, {}, none).ok());
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats.value()[0].tables(0).rows(), 3u);  // 0, 1, first_keys[0] - 1
  EXPECT_EQ(stats.value()[1].tables(0).rows(), 3u);
  EXPECT_EQ(stats.value()[2].tables(0).rows(), 4u);

  // Sync mode: a server without keys in a step still gets its (empty) push
  // (else that step never ends there), also when the pushes are runs of
  // the caller's arrays.
  PsCluster sync(
      MakeJob("Distributed: {mode: sync, timeout_ms: 10000}\n" + Tables(kShards, "range")), 3, 1);
  std::map<uint64_t, float> want;
  int64_t step = 0;
  for (const auto* keys : {&last_server_only, &first_server_only, &middle_only, &all}) {
    const SArray<uint64_t> k(keys->data(), keys->size());
    SArray<float> g(keys->size() * 4);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.5f;
    for (uint64_t key : *keys) want[key] -= 0.5f;
    PushOptions o;
    o.step = step++;
    Status s = sync.client(0).PushSparseGrad(0, k, g, o);
    ASSERT_TRUE(s.ok()) << "step " << o.step << ": " << s.ToString();
  }
  const auto got = PullRows(sync.client(0), all);
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t d = 0; d < 4; ++d) ASSERT_EQ(got[i * 4 + d], want[all[i]]) << "key " << all[i];
}

// A server's part of a pull or async/geo push larger than
// max_request_bytes goes out in pieces. Whatever the cut, the number of
// servers and the partition, the results are those of one whole request to
// one server (with and without repeated keys, in increasing order or not,
// which take different split and gather paths: under the range partition
// increasing keys go out as runs of the request; with shows and clicks),
// and for the plain table they are before - sum(grad) (async) or before +
// sum(delta) (geo), key by key.
TEST(PsServerTest, LargeRequestsCutIntoPiecesGiveTheSameResults) {
  // Table 0: plain sgd lr 1, dim 4. Table 2: CTR (pull/push dim 1 + 2)
  // whose embedx (random, so visible in pulls) appears once shows and
  // clicks score 1 (0.5 per show without a click, 1 per click).
  auto tables = [](const std::string& partition) {
    return Tables(16, partition) +
           "  - {id: 2, kind: sparse, dim: 2, accessor: ctr, shard_num: 8, partition: " +
           partition +
           ",\n"
           "     optimizer: {rule: adagrad, learning_rate: 0.1},\n"
           "     initializer: {kind: uniform, range: 0.1},\n"
           "     ctr: {embed_dim: 1, embedx_threshold: 1, nonclk_coeff: 0.5}}\n";
  };
  struct Layout {
    int servers;
    size_t max_bytes;  // 48: 3 or 4 keys a piece
    std::string partition;
  };
  const std::vector<Layout> layouts = {
      {1, 0, "hash"}, {2, 0, "hash"}, {2, 48, "hash"}, {3, 0, "range"}, {3, 48, "range"}};
  enum class Keys { kIncreasing, kRepeats, kDistinctUnordered };
  for (Keys kind : {Keys::kIncreasing, Keys::kRepeats, Keys::kDistinctUnordered}) {
    const bool repeats = kind == Keys::kRepeats;
    std::vector<uint64_t> keys;
    for (uint64_t i = 0; i < 300; ++i)
      keys.push_back(repeats && i % 7 == 0 ? 11 : SpreadKey(i, 300));
    if (kind == Keys::kDistinctUnordered) std::reverse(keys.begin(), keys.end());
    std::vector<float> shows(keys.size()), clicks(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      shows[i] = 1.0f + static_cast<float>(i % 3);
      clicks[i] = static_cast<float>(i % 2);
    }
    for (const std::string mode : {"async", "geo"}) {
      std::vector<std::vector<float>> pulled;
      std::vector<uint64_t> served;
      for (const Layout& layout : layouts) {
        PsCluster cluster(
            MakeJob("Distributed: {mode: " + mode + ", timeout_ms: 10000, max_request_bytes: " +
                    std::to_string(layout.max_bytes) + "}\n" + tables(layout.partition)),
            layout.servers, 1);
        PsClient& c = cluster.client(0);
        std::vector<float> result;
        for (uint32_t table : {0u, 2u}) {
          const size_t dim = c.PullDim(table);
          std::vector<float> grads(keys.size() * dim), before(keys.size() * dim),
              after(keys.size() * dim);
          for (size_t i = 0; i < grads.size(); ++i)
            grads[i] = 0.25f * static_cast<float>(i % 13) - 1.0f;
          ASSERT_TRUE(c.PullSparse(table, keys, before).ok());
          PushOptions counts;
          counts.shows = shows;
          counts.clicks = clicks;
          Status s = mode == "geo" ? c.PushSparseDelta(table, keys, grads)
                     : table == 2  ? c.PushSparseGrad(table, keys, grads, counts)
                                   : c.PushSparseGrad(table, keys, grads);
          ASSERT_TRUE(s.ok()) << s.ToString();
          ASSERT_TRUE(c.PullSparse(table, keys, after).ok());
          if (table == 0) {
            // The client sums a key's rows in request order, the server applies the sum once.
            std::map<uint64_t, std::vector<float>> sum;
            for (size_t i = 0; i < keys.size(); ++i) {
              auto [it, fresh] =
                  sum.try_emplace(keys[i], grads.begin() + i * dim, grads.begin() + (i + 1) * dim);
              if (!fresh)
                for (size_t d = 0; d < dim; ++d) it->second[d] += grads[i * dim + d];
            }
            for (size_t i = 0; i < keys.size(); ++i)
              for (size_t d = 0; d < dim; ++d)
                ASSERT_EQ(after[i * dim + d], mode == "geo" ? before[i * dim + d] + sum[keys[i]][d]
                                                            : before[i * dim + d] - sum[keys[i]][d])
                    << "key " << keys[i] << " element " << d << ", " << layout.servers
                    << " servers, max " << layout.max_bytes << " bytes, " << layout.partition;
          }
          result.insert(result.end(), before.begin(), before.end());
          result.insert(result.end(), after.begin(), after.end());
        }
        pulled.push_back(std::move(result));
        auto stats = c.Stats();
        ASSERT_TRUE(stats.ok());
        uint64_t n = 0;
        for (const auto& st : stats.value()) n += st.requests_served();
        served.push_back(n);
      }
      for (size_t l = 1; l < layouts.size(); ++l)
        EXPECT_TRUE(pulled[l] == pulled[0])
            << mode << ": layout " << l << " differs; keys kind " << static_cast<int>(kind);
      // Whole: (pull, push, pull) x 2 tables per server, plus stats; cut: many more.
      EXPECT_GT(served[2], 10 * served[1]) << mode;
      EXPECT_GT(served[4], 10 * served[3]) << mode;
    }
  }
}

TEST(PsServerTest, ZeroCopyPushesLeaveTheSameTablesAsCopiedOnes) {
  // The zero-copy pushes send segments of the caller's SArrays when each
  // server's keys are a run of the request (one server, or the range
  // partition, with increasing keys), cut into pieces or not, and gather
  // otherwise; each must leave what the copying push leaves, with and
  // without CTR counts.
  struct Layout {
    int servers;
    size_t max_bytes;
    std::string partition;
  };
  for (const Layout& layout : {Layout{1, 0, "hash"}, Layout{1, 48, "hash"}, Layout{2, 48, "hash"},
                               Layout{3, 0, "range"}, Layout{3, 48, "range"}}) {
    const auto& [servers, max_bytes, partition] = layout;
    const std::string tables =
        Tables(16, partition) +
        "  - {id: 2, kind: sparse, dim: 2, accessor: ctr, shard_num: 8, partition: " + partition +
        ",\n"
        "     optimizer: {rule: adagrad, learning_rate: 0.1},\n"
        "     ctr: {embed_dim: 1, embedx_threshold: 1, nonclk_coeff: 0.5}}\n";
    for (bool sorted : {true, false}) {
      std::vector<uint64_t> key_list;
      for (uint64_t i = 0; i < 200; ++i) key_list.push_back(SpreadKey(sorted ? i : 199 - i, 200));
      const SArray<uint64_t> keys(key_list.data(), key_list.size());
      const std::string job = "Distributed: {mode: async, timeout_ms: 10000, max_request_bytes: " +
                              std::to_string(max_bytes) + "}\n" + tables;
      PsCluster copied(MakeJob(job), servers, 1), shared(MakeJob(job), servers, 1);
      for (uint32_t table : {0u, 2u}) {
        const size_t dim = copied.client(0).PushDim(table);
        SArray<float> grads(keys.size() * dim);
        for (size_t i = 0; i < grads.size(); ++i)
          grads[i] = 0.125f * static_cast<float>(i % 11) - 0.5f;
        std::vector<float> shows(keys.size(), 2.0f), clicks(keys.size(), 1.0f);
        PushOptions counts;
        if (table == 2) {
          counts.shows = shows;
          counts.clicks = clicks;
        }
        ASSERT_TRUE(copied.client(0).PushSparseGrad(table, keys.span(), grads.span(), counts).ok());
        ASSERT_TRUE(copied.client(0).PushSparseGrad(table, keys.span(), grads.span(), counts).ok());
        // The blocking and the asynchronous zero-copy push, one each.
        ASSERT_TRUE(shared.client(0).PushSparseGrad(table, keys, grads, counts).ok());
        Status s = shared.client(0).ZPushSparseGrad(table, keys, grads, counts).get();
        ASSERT_TRUE(s.ok()) << s.ToString();
        const size_t pull_dim = copied.client(0).PullDim(table);
        std::vector<float> want(keys.size() * pull_dim), got(keys.size() * pull_dim);
        ASSERT_TRUE(copied.client(0).PullSparse(table, keys.span(), want).ok());
        ASSERT_TRUE(shared.client(0).PullSparse(table, keys.span(), got).ok());
        EXPECT_EQ(got, want) << "table " << table << ", " << servers
                             << " servers, max_request_bytes " << max_bytes << ", " << partition
                             << (sorted ? ", sorted keys" : ", unsorted keys");
      }
    }
  }
}

TEST(PsServerTest, PullOfUnseenKeysGivesInitialValues) {
  PsCluster cluster(Job("async"), 3, 1);
  for (size_t n : {0u, 1u, 1000u}) {
    std::vector<uint64_t> keys(n);
    std::iota(keys.begin(), keys.end(), 42);
    const auto v = PullRows(cluster.client(0), keys);
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  }
}

TEST(PsServerTest, DenseTableSplitsOverServersWithUnevenRanges) {
  // dim 10 over 3 servers: ranges 3, 3, 4.
  PsCluster cluster(Job("async"), 3, 1);
  PsClient& c = cluster.client(0);
  std::vector<float> init(10);
  std::iota(init.begin(), init.end(), 1.0f);
  ASSERT_TRUE(c.InitDense(1, init).ok());
  std::vector<float> grad(10, 0.5f);
  ASSERT_TRUE(c.PushDenseGrad(1, grad).ok());
  std::vector<float> got(10);
  ASSERT_TRUE(c.PullDense(1, got).ok());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(got[i], i + 1.0f - 0.5f);
  // Zero-copy push of a view.
  SArray<float> z(10);
  for (auto& x : z) x = 1.0f;
  ASSERT_TRUE(c.ZPushDenseGrad(1, z).get().ok());
  ASSERT_TRUE(c.PullDense(1, got).ok());
  EXPECT_EQ(got[9], 10.0f - 1.5f);
}

TEST(PsServerTest, SyncModeWaitsForAllWorkersAndIsOrderIndependent) {
  // Run the same 2-worker step twice with opposite arrival orders: the
  // results must be bit-identical and each push must wait for the other.
  // Also with a request limit of one key: sync pushes are never cut (the
  // server counts one push per worker and step).
  std::vector<std::vector<float>> results;
  for (int64_t max_bytes : {int64_t{-1}, int64_t{16}})
    for (int first : {0, 1}) {
      PsCluster cluster(Job("sync", 16, max_bytes), 2, 2);
      const std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6, 7, 8};
      std::vector<std::vector<float>> grads(2, std::vector<float>(keys.size() * 4));
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> u(-1, 1);
      for (auto& g : grads)
        for (auto& x : g) x = u(rng) * 1e-3f + 1.0f;
      PushOptions step0;
      step0.step = 0;
      auto f_first = cluster.client(first).PushSparseGradAsync(0, keys, grads[first], step0);
      EXPECT_EQ(f_first.wait_for(300ms), std::future_status::timeout)
          << "a sync push must wait for the other worker";
      ASSERT_TRUE(cluster.client(1 - first).PushSparseGrad(0, keys, grads[1 - first], step0).ok());
      ASSERT_TRUE(f_first.get().ok());
      results.push_back(PullRows(cluster.client(0), keys));
    }
  for (size_t i = 1; i < results.size(); ++i) ASSERT_EQ(results[i], results[0]) << "run " << i;
}

TEST(PsServerTest, SyncModeDensePushes) {
  PsCluster cluster(Job("sync"), 2, 2);
  cluster.RunWorkers([&](int rank) {
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g(10, static_cast<float>(rank + 1));
      PushOptions o;
      o.step = step;
      Status s = cluster.client(rank).PushDenseGrad(1, g, o);
      ASSERT_TRUE(s.ok()) << s.ToString();
      // After the step applied, every worker sees it.
      std::vector<float> v(10);
      ASSERT_TRUE(cluster.client(rank).PullDense(1, v).ok());
      ASSERT_EQ(v[0], -3.0f * (step + 1));
    }
  });
}

// A restarted worker resumes at the lowest step the servers have not
// applied (worker/app.cc): every server reports each sync table's.
TEST(PsServerTest, StatsReportEachSyncTablesNextStep) {
  auto next_steps = [](PsClient& c) {
    std::vector<int64_t> out;
    auto stats = c.Stats();
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    if (stats.ok()) {
      for (const auto& s : stats.value()) {
        for (const auto& t : s.tables()) out.push_back(t.next_sync_step());
      }
    }
    return out;
  };
  PsCluster cluster(Job("sync"), 2, 2);
  EXPECT_EQ(next_steps(cluster.client(0)), std::vector<int64_t>(4, 0));
  cluster.RunWorkers([&](int rank) {
    for (int step = 0; step < 2; ++step) {
      PushOptions o;
      o.step = step;
      ASSERT_TRUE(cluster.client(rank).PushDenseGrad(1, std::vector<float>(10, 1.0f), o).ok());
    }
  });
  // Server by server: sparse table 0 (no push yet), dense table 1.
  EXPECT_EQ(next_steps(cluster.client(1)), (std::vector<int64_t>{0, 2, 0, 2}));
  PsCluster async(Job("async"), 1, 1);
  EXPECT_EQ(next_steps(async.client(0)), (std::vector<int64_t>{-1, -1}));
}

// The pushes of heter workers: a 2-worker job's step waits for the three
// slots the pushes name, whichever client sends them, and a resent slot is
// answered without being applied twice.
TEST(PsServerTest, SyncModeDenseContributorsAndIdempotentResends) {
  PsCluster cluster(Job("sync"), 2, 2);
  auto push = [&](int client, int slot, float value) {
    PushOptions o;
    o.step = 0;
    o.contributor = slot;
    o.contributors = 3;
    o.idempotent = true;
    return cluster.client(client).ZPushDenseGrad(1, SArray<float>(std::vector<float>(10, value)),
                                                 o);
  };
  auto a = push(0, 0, 1.0f);
  auto b = push(0, 2, 2.0f);
  // Slot 2 again, from elsewhere (whichever arrives first is kept: the same
  // value, so only applying both would show).
  auto resend = push(1, 2, 2.0f);
  EXPECT_EQ(a.wait_for(200ms), std::future_status::timeout) << "the step waits for slot 1";
  ASSERT_TRUE(push(1, 1, 4.0f).get().ok());
  ASSERT_TRUE(a.get().ok());
  ASSERT_TRUE(b.get().ok());
  ASSERT_TRUE(resend.get().ok());
  std::vector<float> v(10);
  ASSERT_TRUE(cluster.client(0).PullDense(1, v).ok());
  EXPECT_EQ(v[0], -7.0f);  // sgd lr 1 on 1 + 4 + 2, not + 2 again
  EXPECT_EQ(v[9], -7.0f);
  // A resend after the step was applied: answered at once, not applied.
  ASSERT_TRUE(push(1, 0, 50.0f).get().ok());
  ASSERT_TRUE(cluster.client(0).PullDense(1, v).ok());
  EXPECT_EQ(v[9], -7.0f);
}

TEST(PsServerTest, SyncPushWithoutStepIsRefused) {
  PsCluster cluster(Job("sync"), 1, 1);
  std::vector<uint64_t> keys = {1};
  std::vector<float> g(4, 1);
  Status s = cluster.client(0).PushSparseGrad(0, keys, g);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("step"), std::string::npos);
}

TEST(PsServerTest, GeoDeltasAreAdded) {
  PsCluster cluster(Job("geo"), 2, 2);
  const std::vector<uint64_t> keys = {11, 12, 13};
  cluster.RunWorkers([&](int rank) {
    std::vector<float> d(keys.size() * 4, 0.25f);
    ASSERT_TRUE(cluster.client(rank).PushSparseDelta(0, keys, d).ok());
  });
  const auto v = PullRows(cluster.client(0), keys);
  for (float x : v) EXPECT_EQ(x, 0.5f);
}

TEST(PsServerTest, BarrierReleasesAllAtOnce) {
  PsCluster cluster(Job("async"), 2, 3);
  std::atomic<int> arrived{0};
  cluster.RunWorkers([&](int rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * rank));
    arrived.fetch_add(1);
    ASSERT_TRUE(cluster.client(rank).Barrier("epoch-1").ok());
    EXPECT_EQ(arrived.load(), 3);
  });
  // The same name can be used again once released.
  cluster.RunWorkers([&](int rank) { ASSERT_TRUE(cluster.client(rank).Barrier("epoch-1").ok()); });
}

TEST(PsServerTest, BarrierTimesOutNamingTheBarrier) {
  PsCluster cluster(Job("async"), 1, 2);
  BarrierOptions o;
  o.timeout = 300ms;
  Status s = cluster.client(0).Barrier("lonely", o);
  ASSERT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_NE(s.message().find("barrier 'lonely' of 2"), std::string::npos) << s.ToString();
}

// A worker that timed out of a barrier and retries counts once, and a
// caller whose call already gave up does not count towards a later release.
TEST(PsServerTest, BarrierCountsEachWorkerOnceAndForgetsCallersThatGaveUp) {
  PsCluster cluster(Job("async"), 1, 2);
  BarrierOptions short_wait;
  short_wait.timeout = 200ms;
  // Worker 0 gives up twice; the barrier of 2 must not release on its own.
  ASSERT_TRUE(cluster.client(0).Barrier("b", short_wait).IsTimeout());
  ASSERT_TRUE(cluster.client(0).Barrier("b", short_wait).IsTimeout());
  // The server counts a deadline from when the request reached it, after
  // the caller started its clock: on a loaded machine (ctest -j2) well
  // after. Each given-up arrival is left this long to expire at the server
  // too.
  constexpr auto kServerLag = 300ms;
  std::this_thread::sleep_for(kServerLag);
  // Worker 1 alone: worker 0's stale arrivals have expired.
  EXPECT_TRUE(cluster.client(1).Barrier("b", short_wait).IsTimeout());
  // Otherwise worker 0's next arrival could meet worker 1's stale one and be
  // released without worker 1's new call.
  std::this_thread::sleep_for(kServerLag);
  // Both present: released.
  cluster.RunWorkers([&](int rank) { ASSERT_TRUE(cluster.client(rank).Barrier("b").ok()); });
}

TEST(PsServerTest, BadRequestsGetErrorsAndLeaveTablesUnchanged) {
  PsCluster cluster(Job("async"), 1, 1);
  PsClient& c = cluster.client(0);
  const std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> g(12, 1.0f);
  ASSERT_TRUE(c.PushSparseGrad(0, keys, g).ok());
  const auto before = PullRows(c, keys);

  // Client-side checks.
  EXPECT_TRUE(c.PushSparseGrad(0, keys, std::vector<float>(11)).IsInvalidArgument());
  EXPECT_TRUE(c.PushSparseGrad(7, keys, g).IsNotFound());
  EXPECT_TRUE(c.PushSparseGrad(1, keys, g).IsInvalidArgument());  // dense table

  // Server-side checks, with a raw node that skips the client's validation.
  auto raw = RpcNode::Create({}).value();
  const int peer = raw->Connect(cluster.endpoints()[0]).value();
  auto send = [&](pb::PsCommand cmd, int table, std::vector<uint64_t> k, std::vector<float> v) {
    Message m;
    m.header.set_command(cmd);
    m.header.set_table_id(table);
    m.AddFrame(SArray<uint64_t>(std::move(k)));
    m.AddFrame(SArray<float>(std::move(v)));
    return raw->Call(peer, std::move(m)).get().status();
  };
  Status s = send(pb::PS_PUSH_SPARSE_GRAD, 0, {1, 2, 3}, std::vector<float>(11, 5.0f));
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  s = send(pb::PS_PUSH_SPARSE_GRAD, 9, {1}, std::vector<float>(4));
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_NE(s.message().find("table 9"), std::string::npos);
  s = send(pb::PS_PUSH_DENSE_GRAD, 0, {1}, std::vector<float>(4));
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("sparse"), std::string::npos);
  s = send(pb::PS_PUSH_DENSE_GRAD, 1, {}, std::vector<float>(10));  // two frames, wants one
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  Message keys_only;
  keys_only.header.set_command(pb::PS_PUSH_SPARSE_GRAD);
  keys_only.header.set_table_id(0);
  keys_only.AddFrame(SArray<uint64_t>(std::vector<uint64_t>{1, 2}));
  s = raw->Call(peer, std::move(keys_only)).get().status();
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  Message wrong_type;
  wrong_type.header.set_command(pb::PS_PULL_SPARSE);
  wrong_type.header.set_table_id(0);
  wrong_type.AddFrame(SArray<float>(std::vector<float>{1, 2}));
  s = raw->Call(peer, std::move(wrong_type)).get().status();
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();

  EXPECT_EQ(PullRows(c, keys), before);
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats.value()[0].requests_rejected(), 6u);
}

TEST(PsServerTest, AbsentServerTimesOutNamingIt) {
  JobConfig job = Job("async");
  job.distributed.timeout = 300ms;
  PsClientOptions o;
  o.servers = {"127.0.0.1:1"};
  auto c = PsClient::Create(o, job).value();
  std::vector<float> v(4);
  const std::vector<uint64_t> keys = {1};
  Status s = c->PullSparse(0, keys, v);
  ASSERT_TRUE(s.IsTimeout()) << s.ToString();
  EXPECT_NE(s.message().find("127.0.0.1:1"), std::string::npos);
  EXPECT_NE(s.message().find("pull_sparse table 0 on server 0"), std::string::npos);
}

TEST(PsServerTest, SaveAndLoadThroughClientsIncludingResharding) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fleet_ps_server_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::vector<uint64_t> keys(300);
  std::iota(keys.begin(), keys.end(), 1);
  std::vector<float> saved_rows, saved_dense(10);
  // The job's checkpoint root: PS_SAVE and PS_LOAD go nowhere else.
  const auto root = [&](PsServerOptions& o) { o.job.server.save_dir = dir.string(); };
  {
    PsCluster cluster(Job("async", 12), 2, 1, root);
    PsClient& c = cluster.client(0);
    std::vector<float> g(keys.size() * 4);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 13) * 0.25f;
    ASSERT_TRUE(c.PushSparseGrad(0, keys, g).ok());
    std::vector<float> init(10, 2.0f);
    ASSERT_TRUE(c.InitDense(1, init).ok());
    ASSERT_TRUE(c.Save(dir.string(), /*delta=*/false).ok());
    saved_rows = PullRows(c, keys);
    ASSERT_TRUE(c.PullDense(1, saved_dense).ok());
    // Change things after the save, then load: the save wins.
    ASSERT_TRUE(c.PushSparseGrad(0, keys, g).ok());
    ASSERT_TRUE(c.Load(dir.string()).ok());
    EXPECT_EQ(PullRows(c, keys), saved_rows);
  }
  {
    // The same checkpoint into 3 servers.
    PsCluster cluster(Job("async", 12), 3, 1, root);
    PsClient& c = cluster.client(0);
    ASSERT_TRUE(c.Load(dir.string()).ok());
    EXPECT_EQ(PullRows(c, keys), saved_rows);
    std::vector<float> dense(10);
    ASSERT_TRUE(c.PullDense(1, dense).ok());
    EXPECT_EQ(dense, saved_dense);
    auto stats = c.Stats();
    uint64_t rows = 0;
    for (const auto& s : stats.value()) rows += s.tables(0).rows();
    EXPECT_EQ(rows, keys.size());
  }
  std::filesystem::remove_all(dir);
}

TEST(PsServerTest, StopRequestWakesTheServer) {
  PsCluster cluster(Job("async"), 2, 1);
  EXPECT_FALSE(cluster.server(0).WaitForStopRequest(10ms));
  ASSERT_TRUE(cluster.client(0).StopServers().ok());
  EXPECT_TRUE(cluster.server(0).WaitForStopRequest(1s));
  EXPECT_TRUE(cluster.server(1).WaitForStopRequest(1s));
  EXPECT_TRUE(cluster.server(0).Shutdown(false).ok());
}

TEST(PsServerTest, ShrinkAndEndPassReachEveryServer) {
  auto job = MakeJob(
      "Distributed: {mode: async}\n"
      "tables:\n"
      "  - {id: 0, kind: sparse, dim: 2, accessor: ctr, shard_num: 8,\n"
      "     ctr: {embed_dim: 1, delete_after_unseen_passes: 1, embedx_threshold: 0}}\n");
  PsCluster cluster(job, 2, 1);
  PsClient& c = cluster.client(0);
  std::vector<uint64_t> keys(50);
  std::iota(keys.begin(), keys.end(), 100);
  std::vector<float> g(keys.size() * c.PushDim(0), 0.1f);
  ASSERT_TRUE(c.PushSparseGrad(0, keys, g).ok());
  ASSERT_TRUE(c.EndPass().ok());
  ASSERT_TRUE(c.EndPass().ok());
  auto deleted = c.Shrink(-1);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(deleted.value(), keys.size());
}

}  // namespace
}  // namespace fleet::ps
