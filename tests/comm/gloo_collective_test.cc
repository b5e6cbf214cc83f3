#include "comm/gloo_collective.h"

#include <chrono>
#include <future>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/comm/collective_test_util.h"

namespace fleet {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using fleet::testing::CheckEveryOp;
using fleet::testing::CheckOpTimesOutWhenAPeerNeverCallsIt;
using fleet::testing::CheckRendezvousTimesOut;
using fleet::testing::JoinGloo;
using fleet::testing::LocalKvServer;
using fleet::testing::RunRanks;
using fleet::testing::ThrowIfError;
using fleet::testing::UniqueJob;


class GlooCollectiveGridTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

// Every operation, on every rank, against an expectation computed locally
// from the seed data of all ranks.
TEST_P(GlooCollectiveGridTest, EveryOpMatchesLocalExpectation) {
  const auto [size, count] = GetParam();
  LocalKvServer kv;
  const std::string job = UniqueJob();
  RunRanks(size, [&, size = size, count = count](int rank) {
    CheckEveryOp(*JoinGloo(kv, job, rank, size, std::chrono::seconds(20)), rank, size, count);
  });
}

INSTANTIATE_TEST_SUITE_P(SizesAndCounts, GlooCollectiveGridTest, fleet::testing::RanksAndCounts(),
                         fleet::testing::RanksAndCountsName);

TEST(GlooCollectiveTest, RendezvousTimesOutNamingTheMissingRank) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  const milliseconds timeout(500);
  CheckRendezvousTimesOut(
      [&](int rank) {
        GlooCollectiveOptions options;
        options.group = "partial";
        options.rank = rank;
        options.size = 3;
        options.timeout = timeout;
        return GlooCollective::Create(*kv.Client(job), options).status();
      },
      timeout, {"ranks 2 never arrived", "gloo/partial/gen0", "rendezvous", "500 ms"});
}

// A restarted process must not read what its previous life (or its peers')
// left in the store: each restart generation rendezvouses under its own keys.
TEST(GlooCollectiveTest, RestartGenerationUsesFreshKeys) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  const milliseconds timeout(1000);
  auto join = [&](int rank, int generation) {
    auto client = kv.Client(job);
    GlooCollectiveOptions options;
    options.group = "restart";
    options.rank = rank;
    options.size = 2;
    options.timeout = timeout;
    options.generation = generation;
    return GlooCollective::Create(*client, options);
  };
  auto life = [&](int generation) {
    RunRanks(2, [&](int rank) {
      auto group = join(rank, generation);
      ThrowIfError(group.status(), "generation " + std::to_string(generation));
      std::vector<float> data = {static_cast<float>(rank + 1)};
      ThrowIfError((*group)->AllReduce(data.data(), 1, ReduceOp::kSum), "allreduce");
      if (data[0] != 3.0f) throw std::runtime_error("allreduce gave " + std::to_string(data[0]));
    });
  };
  life(0);
  // Rank 1 restarted alone: generation 0's keys of rank 0 (an address nobody
  // listens on any more) must not be used; rank 0 is missing at generation 1.
  const auto start = Clock::now();
  auto lone = join(1, 1);
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  ASSERT_TRUE(lone.status().IsTimeout()) << lone.status().ToString();
  EXPECT_NE(lone.status().message().find("ranks 0 never arrived"), std::string::npos)
      << lone.status().ToString();
  EXPECT_NE(lone.status().message().find("generation 1"), std::string::npos);
  EXPECT_LT(took, 3 * timeout);
  // Both restarted: generation 1 forms a working group.
  life(1);
  auto listed = kv.Client(job)->List("gloo/restart/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  int gen0 = 0, gen1 = 0;
  for (const std::string& key : *listed) {
    gen0 += key.starts_with("gloo/restart/gen0/");
    gen1 += key.starts_with("gloo/restart/gen1/");
  }
  EXPECT_GT(gen0, 0);
  EXPECT_GT(gen1, 0);
  EXPECT_EQ(gen0 + gen1, static_cast<int>(listed->size()));
}

TEST(GlooCollectiveTest, OpTimesOutWhenAPeerNeverCallsIt) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  const milliseconds timeout(500);
  CheckOpTimesOutWhenAPeerNeverCallsIt(
      [&](int rank) -> std::unique_ptr<Collective> { return JoinGloo(kv, job, rank, 2, timeout); },
      timeout, /*at_least=*/milliseconds(0), {"allreduce", "rank 0 of 2", "500 ms"});
}

TEST(GlooCollectiveTest, BadArgumentsAreInvalidArgument) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  GlooCollectiveOptions options;
  options.rank = 2;
  options.size = 2;
  EXPECT_TRUE(GlooCollective::Create(*client, options).status().IsInvalidArgument());
  options.rank = 0;
  options.size = 1;
  // Each of these reached libgloo before and crashed it (SIGSEGV in a Release
  // build): names are resolved and checked before Gloo sees them.
  struct Bad {
    std::string hostname, iface, want;
  };
  for (const Bad& bad : {Bad{"no_such host", "", "cannot resolve 'no_such host'"},
                         Bad{"no_such_host", "", "cannot resolve 'no_such_host'"},
                         Bad{"192.0.2.1", "", "'192.0.2.1' (192.0.2.1) is not an address of this machine"},
                         Bad{"127.0.0.1", "no_such_if0", "no network interface 'no_such_if0'"}}) {
    options.hostname = bad.hostname;
    options.iface = bad.iface;
    Status st = GlooCollective::Create(*client, options).status();
    EXPECT_TRUE(st.IsInvalidArgument()) << bad.hostname << bad.iface << ": " << st.ToString();
    EXPECT_NE(st.message().find(bad.want), std::string::npos) << st.ToString();
  }
  options.hostname = "127.0.0.1";
  options.iface = "";
  options.generation = -1;
  EXPECT_TRUE(GlooCollective::Create(*client, options).status().IsInvalidArgument());
  options.generation = 0;
  options.iface = "lo";
  EXPECT_TRUE(GlooCollective::Create(*client, options).ok());
  options.iface = "";
  auto group = GlooCollective::Create(*client, options);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  float x = 1;
  EXPECT_TRUE((*group)->Broadcast(&x, 1, 1).IsInvalidArgument());
  EXPECT_TRUE((*group)->Broadcast(&x, 1, 0).ok());
  EXPECT_EQ((*group)->name(), "gloo");
}

}  // namespace
}  // namespace fleet
