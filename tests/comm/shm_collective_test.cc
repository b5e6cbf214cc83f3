#include "comm/shm_collective.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/child_process.h"
#include "tests/comm/collective_test_util.h"

namespace fleet {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using fleet::testing::CheckEveryOp;
using fleet::testing::CheckOpTimesOutWhenAPeerNeverCallsIt;
using fleet::testing::CheckRendezvousTimesOut;
using fleet::testing::JoinShm;
using fleet::testing::LocalKvServer;
using fleet::testing::RunRanks;
using fleet::testing::ThrowIfError;
using fleet::testing::UniqueJob;

// Small slots, so that most operations take several chunks.
ShmCollectiveOptions Options(int rank, int size, milliseconds timeout, size_t slot_bytes = 4096) {
  ShmCollectiveOptions o = fleet::testing::ShmOptions(rank, size, timeout);
  o.slot_bytes = slot_bytes;
  return o;
}

// Segments in /dev/shm this process created (other tests running at the
// same time make their own): none may outlive start-up.
int FleetSegments() {
  const std::string mine = "fleet-" + std::to_string(getpid()) + "-";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    n += e.path().filename().string().starts_with(mine);
  }
  return n;
}

class ShmCollectiveGridTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

// The shared contract (tests/comm/collective_test_util.h). Slots of 4 KiB
// (1024 floats), so 1000 floats are one chunk and 100003 are 98, the last
// one partial, and reduce-scatter's per-rank pieces are split too.
TEST_P(ShmCollectiveGridTest, EveryOpMatchesLocalExpectation) {
  const auto [size, count] = GetParam();
  LocalKvServer kv;
  const std::string job = UniqueJob();
  RunRanks(size, [&, size = size, count = count](int rank) {
    CheckEveryOp(*JoinShm(kv, job, Options(rank, size, std::chrono::seconds(20))), rank, size,
                 count);
  });
}

INSTANTIATE_TEST_SUITE_P(SizesAndCounts, ShmCollectiveGridTest, fleet::testing::RanksAndCounts(),
                         fleet::testing::RanksAndCountsName);

// Many back-to-back operations with no barrier between them: a rank that
// runs ahead must never overwrite a slot a slower rank still reads.
TEST(ShmCollectiveTest, BackToBackOperationsNeverRace) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  RunRanks(3, [&](int rank) {
    auto group = JoinShm(kv, job, Options(rank, 3, std::chrono::seconds(20)));
    for (int i = 0; i < 2000; ++i) {
      std::vector<float> data(1500 + i % 7, static_cast<float>(rank + i));
      ThrowIfError(group->AllReduce(data.data(), data.size(), ReduceOp::kSum), "allreduce");
      const float want = static_cast<float>(3 * i + 3);
      for (float v : data) {
        if (v != want) throw std::runtime_error("iteration " + std::to_string(i) + ": " + std::to_string(v));
      }
    }
  });
  EXPECT_EQ(FleetSegments(), 0) << "a segment was left in /dev/shm";
}

TEST(ShmCollectiveTest, RendezvousTimesOutNamingTheMissingRank) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  const milliseconds timeout(500);
  CheckRendezvousTimesOut(
      [&](int rank) { return ShmCollective::Create(*kv.Client(job), Options(rank, 3, timeout)).status(); },
      timeout, {"rendezvous", "ranks 2 did not arrive", "500 ms"});
  EXPECT_EQ(FleetSegments(), 0) << "a failed rendezvous left its segment in /dev/shm";
}

// The wait is the full timeout: rank 1 is alive, only absent.
TEST(ShmCollectiveTest, OpTimesOutWhenAPeerNeverCallsIt) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  const milliseconds timeout(300);
  CheckOpTimesOutWhenAPeerNeverCallsIt(
      [&](int rank) -> std::unique_ptr<Collective> { return JoinShm(kv, job, Options(rank, 2, timeout)); },
      timeout, /*at_least=*/timeout, {"all-reduce", "rank 0 of 2", "ranks 1 (pid", "300 ms"});
}

// A peer process that dies is reported at once (its pid is gone), not
// after the group's timeout.
TEST(ShmCollectiveTest, APeerThatExitedIsUnavailableNamingItsPid) {
  // Forked before any thread exists (the KV server's), so the child may use
  // anything; it learns the KV endpoint through a pipe.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const std::string job = "shm-dead-peer-" + std::to_string(getpid());
  testing::Child child_process = testing::Child::Fork([&] {
    close(pipe_fds[1]);
    char endpoint[256] = {};
    const ssize_t n = read(pipe_fds[0], endpoint, sizeof(endpoint) - 1);
    if (n <= 0) _exit(3);
    KvStoreClient client(std::string(endpoint, n), job);
    auto group = ShmCollective::Create(client, Options(1, 2, std::chrono::seconds(20)));
    if (!group.ok()) std::fprintf(stderr, "child: %s\n", group.status().ToString().c_str());
    _exit(group.ok() ? 0 : 4);  // joins, then dies without another call
    return 0;
  });
  ASSERT_TRUE(child_process.started());
  const pid_t child = child_process.pid();
  close(pipe_fds[0]);
  LocalKvServer kv;
  const std::string endpoint = kv.endpoint();
  ASSERT_EQ(write(pipe_fds[1], endpoint.data(), endpoint.size()), static_cast<ssize_t>(endpoint.size()));
  close(pipe_fds[1]);
  auto group = JoinShm(kv, job, Options(0, 2, std::chrono::seconds(20)));
  const testing::Exit joined = child_process.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(joined.exited && joined.code == 0) << "child status " << joined.ShellCode();
  std::vector<float> data(10, 1.0f);
  const auto start = Clock::now();
  Status st = group->AllReduce(data.data(), data.size(), ReduceOp::kSum);
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("rank 1 (pid " + std::to_string(child) + ") exited"), std::string::npos)
      << st.ToString();
  EXPECT_LT(took, milliseconds(2000));
}

// A segment whose creator is dead (a rank killed in the rendezvous with its
// launcher) is removed by the next launcher's sweep; a live creator's is
// left alone.
TEST(ShmCollectiveTest, OrphanedSegmentsOfDeadCreatorsAreRemoved) {
  fleet::testing::Child dead = fleet::testing::Child::Fork([] { return 0; });
  const int dead_pid = dead.pid();
  ASSERT_FALSE(dead.Wait(std::chrono::seconds(10)).timed_out);
  const std::string orphan = "/fleet-" + std::to_string(dead_pid) + "-orphantest";
  const std::string live = "/fleet-" + std::to_string(::getpid()) + "-livetest";
  for (const std::string& name : {orphan, live}) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << name;
    ::close(fd);
  }
  EXPECT_GE(RemoveOrphanedShmSegments(), 1);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + orphan));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + live));
  shm_unlink(live.c_str());
}

TEST(ShmCollectiveTest, BadArgumentsAreInvalidArgument) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  auto bad = [&](ShmCollectiveOptions o) { return ShmCollective::Create(*client, o).status(); };
  EXPECT_TRUE(bad(Options(2, 2, milliseconds(100))).IsInvalidArgument());
  EXPECT_TRUE(bad(Options(0, 300, milliseconds(100))).IsInvalidArgument());
  EXPECT_TRUE(bad(Options(0, 1, milliseconds(0))).IsInvalidArgument());
  EXPECT_TRUE(bad(Options(0, 1, milliseconds(100), 1000)).IsInvalidArgument());
  EXPECT_TRUE(bad(Options(0, 1, milliseconds(100), 4096 + 32)).IsInvalidArgument());
  ShmCollectiveOptions o = Options(0, 1, milliseconds(100));
  o.generation = -1;
  EXPECT_TRUE(bad(o).IsInvalidArgument());
  auto group = ShmCollective::Create(*client, Options(0, 1, milliseconds(100)));
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  float x = 1;
  EXPECT_TRUE((*group)->Broadcast(&x, 1, 1).IsInvalidArgument());
  EXPECT_TRUE((*group)->Broadcast(&x, 1, 0).ok());
  EXPECT_EQ((*group)->name(), "shm");
}

}  // namespace
}  // namespace fleet
