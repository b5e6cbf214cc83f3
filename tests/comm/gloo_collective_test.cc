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
using fleet::testing::ExpectedAllGather;
using fleet::testing::ExpectedAllReduce;
using fleet::testing::ExpectedReduceScatter;
using fleet::testing::ExpectExactly;
using fleet::testing::JoinGloo;
using fleet::testing::LocalKvServer;
using fleet::testing::RunRanks;
using fleet::testing::SeedVector;
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
    auto group = JoinGloo(kv, job, rank, size, std::chrono::seconds(20));
    const std::string where = " (rank " + std::to_string(rank) + ")";

    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      std::vector<float> data = SeedVector(rank, count, size);
      ThrowIfError(group->AllReduce(data.data(), count, op), "allreduce" + where);
      ExpectExactly(data, ExpectedAllReduce(op, count, size),
                    "allreduce op " + std::to_string(static_cast<int>(op)) + where);
    }

    for (int root : {0, size - 1}) {
      std::vector<float> data = SeedVector(rank, count, size);
      ThrowIfError(group->Broadcast(data.data(), count, root), "broadcast" + where);
      ExpectExactly(data, SeedVector(root, count, size), "broadcast root " + std::to_string(root) + where);
    }

    {
      std::vector<float> in = SeedVector(rank, count, size);
      std::vector<float> out(count * size, -1.0f);
      ThrowIfError(group->AllGather(in.data(), out.data(), count), "allgather" + where);
      ExpectExactly(out, ExpectedAllGather(count, size), "allgather" + where);
    }

    {
      std::vector<float> in = SeedVector(rank, count * size, size);
      std::vector<float> out(count, -1.0f);
      ThrowIfError(group->ReduceScatter(in.data(), out.data(), count), "reducescatter" + where);
      ExpectExactly(out, ExpectedReduceScatter(rank, count, size), "reducescatter" + where);
    }

    ThrowIfError(group->Barrier(), "barrier" + where);
  });
}

INSTANTIATE_TEST_SUITE_P(SizesAndCounts, GlooCollectiveGridTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(size_t{0}, size_t{1}, size_t{1000},
                                                              size_t{100003})),
                         [](const auto& info) {
                           return "ranks" + std::to_string(std::get<0>(info.param)) + "_count" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(GlooCollectiveTest, RendezvousTimesOutNamingTheMissingRank) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  const milliseconds timeout(500);
  // Ranks 0 and 1 of 3 join; rank 2 never does.
  RunRanks(2, [&](int rank) {
    auto client = kv.Client(job);
    GlooCollectiveOptions options;
    options.group = "partial";
    options.rank = rank;
    options.size = 3;
    options.timeout = timeout;
    auto start = Clock::now();
    auto group = GlooCollective::Create(*client, options);
    auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    if (!group.status().IsTimeout()) {
      throw std::runtime_error("rank " + std::to_string(rank) + " got " + group.status().ToString());
    }
    const std::string& msg = group.status().message();
    for (std::string part : {std::string("gloo/partial/2"), std::string("rendezvous"),
                             "rank " + std::to_string(rank) + " of 3"}) {
      if (msg.find(part) == std::string::npos) throw std::runtime_error("'" + part + "' not in: " + msg);
    }
    if (took > 4 * timeout) throw std::runtime_error("took " + std::to_string(took.count()) + " ms");
  });
}

TEST(GlooCollectiveTest, OpTimesOutWhenAPeerNeverCallsIt) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  const milliseconds timeout(500);
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  RunRanks(2, [&](int rank) {
    auto group = JoinGloo(kv, job, rank, 2, timeout);
    if (rank == 1) {
      // Stays connected but never joins the allreduce.
      if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
        throw std::runtime_error("rank 0 never finished");
      }
      return;
    }
    std::vector<float> data(10, 1.0f);
    auto start = Clock::now();
    Status st = group->AllReduce(data.data(), data.size(), ReduceOp::kSum);
    auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    Status again = group->Barrier();
    rank0_done.set_value();
    if (!st.IsTimeout()) throw std::runtime_error("allreduce gave " + st.ToString());
    for (std::string part : {"allreduce", "rank 0 of 2", "500 ms"}) {
      if (st.message().find(part) == std::string::npos) {
        throw std::runtime_error("'" + part + "' not in: " + st.message());
      }
    }
    if (took > 4 * timeout) throw std::runtime_error("took " + std::to_string(took.count()) + " ms");
    if (again.code() != StatusCode::kFailedPrecondition) {
      throw std::runtime_error("call after failure gave " + again.ToString());
    }
  });
}

TEST(GlooCollectiveTest, BadArgumentsAreInvalidArgument) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  GlooCollectiveOptions options;
  options.rank = 2;
  options.size = 2;
  EXPECT_TRUE(GlooCollective::Create(*client, options).status().IsInvalidArgument());
  options.rank = 0;
  options.hostname = "no_such host";
  EXPECT_TRUE(GlooCollective::Create(*client, options).status().IsInvalidArgument());
  options.hostname = "127.0.0.1";
  options.size = 1;
  auto group = GlooCollective::Create(*client, options);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  float x = 1;
  EXPECT_TRUE((*group)->Broadcast(&x, 1, 1).IsInvalidArgument());
  EXPECT_TRUE((*group)->Broadcast(&x, 1, 0).ok());
  EXPECT_EQ((*group)->name(), "gloo");
}

}  // namespace
}  // namespace fleet
