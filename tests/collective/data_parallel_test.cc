#include "collective/data_parallel.h"

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/comm/collective_test_util.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"

namespace fleet::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using fleet::testing::RunGlooRanks;
using fleet::testing::RunRanksOver;
using fleet::testing::SeedVector;
using fleet::testing::ThrowIfError;

// A small MLP table: tensors of 30, 5, 20, 4, 12, 3 floats.
ParamTable SmallTable() { return MlpParamTable(MlpConfig{{6, 5, 4, 3}, 1}); }

ParamArena MakeArena(Backend* backend) {
  auto arena = ParamArena::Create(SmallTable(), backend);
  ThrowIfError(arena.status(), "arena");
  return std::move(arena).value();
}

std::unique_ptr<DataParallel> MakeDp(Collective* group, ParamArena* arena,
                                     size_t bucket_bytes = 64) {
  DataParallelOptions options;
  options.bucket_bytes = bucket_bytes;
  options.timeout = milliseconds(10000);
  auto dp = DataParallel::Create(group, arena, options);
  ThrowIfError(dp.status(), "DataParallel::Create");
  return std::move(dp).value();
}

// What the small MLP's Backward reports: layers last to first.
void ReportLikeMlpBackward(DataParallel& dp) {
  GradReadyFn ready = dp.grad_ready();
  ready(4, 6);
  ready(2, 4);
  ready(0, 2);
}

// Sets this rank's grads to its seed values; returns the mean over ranks
// the way the helper computes it (exact sum of small integers, then one
// scale by 1/size).
std::vector<float> LoadSeedGrads(ParamArena& arena, int rank, int size) {
  const std::vector<float> mine = SeedVector(rank, arena.size(), size);
  std::copy(mine.begin(), mine.end(), arena.grads().data());
  std::vector<float> mean(arena.size(), 0.0f);
  for (int r = 0; r < size; ++r) {
    const std::vector<float> v = SeedVector(r, arena.size(), size);
    for (size_t i = 0; i < v.size(); ++i) mean[i] += v[i];
  }
  const float scale = 1.0f / static_cast<float>(size);
  for (float& m : mean) m *= scale;
  return mean;
}

TEST(DataParallelTest, BucketsCoverTheTableFromTheLastTensorBackwards) {
  CpuBackend backend;
  ParamArena arena = MakeArena(&backend);
  struct Case {
    size_t bucket_bytes;
    std::vector<std::pair<size_t, size_t>> want;  // tensor ranges, in order
  };
  const Case cases[] = {
      {1, {{5, 6}, {4, 5}, {3, 4}, {2, 3}, {1, 2}, {0, 1}}},
      {15 * sizeof(float), {{4, 6}, {2, 4}, {0, 2}}},  // 12+3, 4+20, 5+30
      {30 * sizeof(float), {{2, 6}, {0, 2}}},          // 3+12+4+20 >= 30
      {std::numeric_limits<size_t>::max(), {{0, 6}}},
  };
  for (const Case& c : cases) {
    auto dp = MakeDp(nullptr, &arena, c.bucket_bytes);
    ASSERT_EQ(dp->buckets().size(), c.want.size()) << "bucket_bytes " << c.bucket_bytes;
    for (size_t b = 0; b < c.want.size(); ++b) {
      const GradBucket& got = dp->buckets()[b];
      EXPECT_EQ(got.first_tensor, c.want[b].first) << "bucket " << b << ", bytes " << c.bucket_bytes;
      EXPECT_EQ(got.end_tensor, c.want[b].second) << "bucket " << b << ", bytes " << c.bucket_bytes;
      EXPECT_EQ(got.begin, arena.offset(got.first_tensor));
      EXPECT_EQ(got.end, arena.offset(got.end_tensor));
    }
  }
}

TEST(DataParallelTest, CreateRejectsBadOptions) {
  CpuBackend backend;
  ParamArena arena = MakeArena(&backend);
  DataParallelOptions zero_bucket;
  zero_bucket.bucket_bytes = 0;
  EXPECT_TRUE(DataParallel::Create(nullptr, &arena, zero_bucket).status().IsInvalidArgument());
  DataParallelOptions zero_timeout;
  zero_timeout.timeout = milliseconds(0);
  EXPECT_TRUE(DataParallel::Create(nullptr, &arena, zero_timeout).status().IsInvalidArgument());
  EXPECT_TRUE(DataParallel::Create(nullptr, nullptr, {}).status().IsInvalidArgument());
}

TEST(DataParallelTest, SingleProcessLeavesGradientsAlone) {
  CpuBackend backend;
  ParamArena arena = MakeArena(&backend);
  auto dp = MakeDp(nullptr, &arena);
  const std::vector<float> mine = LoadSeedGrads(arena, 0, 1);
  ReportLikeMlpBackward(*dp);
  ASSERT_TRUE(dp->FinishGradients().ok());
  EXPECT_EQ(arena.GradsToHost(), mine);
  float values[2] = {3.0f, 4.0f};
  ASSERT_TRUE(dp->SumOverRanks(values).ok());
  EXPECT_EQ(values[0], 3.0f);
  EXPECT_EQ(values[1], 4.0f);
  EXPECT_TRUE(dp->SyncFromRoot(nullptr).ok());
}

// Mean all-reduce over ranks for several world sizes and bucket sizes, with
// and without the grad-ready callback, over several steps; over Gloo (a
// communication thread) and shared memory (the caller's calls).
class DataParallelGridTest
    : public ::testing::TestWithParam<std::tuple<std::string, int, size_t, bool>> {};

TEST_P(DataParallelGridTest, GradientsBecomeTheMeanOverRanks) {
  const auto [kind, size, bucket_bytes, use_callback] = GetParam();
  RunRanksOver(kind, size, milliseconds(10000), [&](int rank, Collective& group) {
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    auto dp = MakeDp(&group, &arena, bucket_bytes);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> want = LoadSeedGrads(arena, rank, size);
      if (use_callback) ReportLikeMlpBackward(*dp);
      ThrowIfError(dp->FinishGradients(), "FinishGradients");
      fleet::testing::ExpectExactly(arena.GradsToHost(), want,
                                    "grads of rank " + std::to_string(rank));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, DataParallelGridTest,
                         ::testing::Combine(::testing::Values("gloo", "shm"),
                                            ::testing::Values(2, 3),
                                            ::testing::Values(size_t{1}, size_t{64},
                                                              std::numeric_limits<size_t>::max()),
                                            ::testing::Bool()));

// Sharded mode (ZeRO): every rank ends up with the exact sum over ranks of
// its piece of every bucket (pieces of lengths W does not divide go through
// the padded staging buffer), stage 2 discards the reduced buckets, and
// GatherParams puts every rank's pieces of the parameters together.
class DataParallelShardedTest
    : public ::testing::TestWithParam<std::tuple<std::string, int, size_t, bool>> {};

TEST_P(DataParallelShardedTest, PiecesHoldTheSumAndGatherJoinsThem) {
  const auto [kind, size, bucket_bytes, release] = GetParam();
  RunRanksOver(kind, size, milliseconds(10000), [&](int rank, Collective& group) {
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    DataParallelOptions options;
    options.bucket_bytes = bucket_bytes;
    options.timeout = milliseconds(10000);
    options.shard_gradients = true;
    options.release_reduced_gradients = release;
    auto created = DataParallel::Create(&group, &arena, options);
    ThrowIfError(created.status(), "DataParallel::Create");
    DataParallel& dp = **created;
    ASSERT_TRUE(dp.sharded());
    for (int step = 0; step < 2; ++step) {
      dp.ZeroGrad();
      std::vector<float> sum(arena.size(), 0.0f);
      for (int r = 0; r < size; ++r) {
        const std::vector<float> v = SeedVector(r + step, arena.size(), size + 1);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
        if (r == rank) std::copy(v.begin(), v.end(), arena.grads().data());
      }
      ReportLikeMlpBackward(dp);
      ThrowIfError(dp.FinishGradients(), "FinishGradients");
      size_t covered = 0;
      for (const GradPiece& piece : dp.pieces()) {
        for (size_t i = piece.begin; i < piece.end; ++i) {
          ASSERT_EQ(dp.reduced_grads()[piece.offset + i - piece.begin], sum[i])
              << "rank " << rank << " element " << i;
        }
        covered += piece.size();
      }
      // The ranks' pieces split the arena: about 1/W each.
      EXPECT_LE(covered, arena.size() / size + dp.pieces().size()) << "rank " << rank;
      if (release) {
        const std::vector<float> grads = arena.GradsToHost();
        EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.0f; }))
            << "stage 2 left full gradients on rank " << rank;
      }
    }
    // Each rank writes its rank number into its pieces' parameters.
    std::vector<float> params(arena.size(), -1.0f);
    for (const GradPiece& piece : dp.pieces()) {
      std::fill(params.begin() + piece.begin, params.begin() + piece.end, float(rank));
    }
    ThrowIfError(arena.ParamsFromHost(params), "params");
    ThrowIfError(dp.GatherParams(), "GatherParams");
    const std::vector<float> gathered = arena.ParamsToHost();
    EXPECT_TRUE(std::none_of(gathered.begin(), gathered.end(), [](float p) { return p < 0; }))
        << "a parameter no rank owns, on rank " << rank;
    float sum_all = 0.0f;
    for (float p : gathered) sum_all += p;
    // Every rank sees the same gathered parameters: their sum agrees.
    std::vector<float> sums(size, 0.0f);
    sums[rank] = sum_all;
    ThrowIfError(dp.SumOverRanks(sums), "SumOverRanks");
    for (int r = 0; r < size; ++r) EXPECT_EQ(sums[r], sum_all) << "rank " << r;
  });
}

INSTANTIATE_TEST_SUITE_P(Grid, DataParallelShardedTest,
                         ::testing::Combine(::testing::Values("gloo", "shm"),
                                            ::testing::Values(2, 3),
                                            ::testing::Values(size_t{1}, size_t{64},
                                                              std::numeric_limits<size_t>::max()),
                                            ::testing::Bool()));

int ThreadsOfThisProcess() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A communication thread for Gloo; none for shared memory, whose buckets
// are reduced by the caller inside grad_ready: the bucket's gradients are
// final when the callback returns.
TEST(DataParallelTest, CommunicationThreadOnlyForACollectiveOffTheCallersCpu) {
  for (const std::string kind : {"gloo", "shm"}) {
    RunRanksOver(kind, 1, milliseconds(10000), [&](int, Collective& group) {
      CpuBackend backend;
      ParamArena arena = MakeArena(&backend);
      const int before = ThreadsOfThisProcess();
      auto dp = MakeDp(&group, &arena);
      EXPECT_EQ(ThreadsOfThisProcess() - before, kind == "gloo" ? 1 : 0) << kind;
    });
  }
  RunRanksOver("shm", 2, milliseconds(10000), [&](int rank, Collective& group) {
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    auto dp = MakeDp(&group, &arena, 15 * sizeof(float));  // buckets: tensors 4-5, 2-3, 0-1
    const std::vector<float> want = LoadSeedGrads(arena, rank, 2);
    dp->grad_ready()(4, 6);
    const std::vector<float> grads = arena.GradsToHost();
    for (size_t i = arena.offset(4); i < arena.size(); ++i) {
      ASSERT_EQ(grads[i], want[i]) << "rank " << rank << " element " << i;
    }
    dp->grad_ready()(0, 4);
    ThrowIfError(dp->FinishGradients(), "FinishGradients");
    fleet::testing::ExpectExactly(arena.GradsToHost(), want, "grads of rank " + std::to_string(rank));
  });
}

TEST(DataParallelTest, SyncFromRootCopiesParamsOptimizerStateAndStep) {
  RunGlooRanks(2, milliseconds(10000), [&](int rank, Collective& group) {
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    Adam adam(&arena, kernels::AdamHyper{});
    const std::vector<float> root_params = SeedVector(0, arena.size(), 2);
    const std::vector<float> mine = SeedVector(rank, arena.size(), 2);
    ThrowIfError(arena.ParamsFromHost(mine), "params");
    for (const Tensor& state : adam.state()) {
      std::copy(mine.begin(), mine.end(), state.data());
    }
    // A step beyond 2^24 checks the two-float encoding.
    const int64_t root_step = (int64_t{1} << 30) + 12345;
    adam.RestoreStep(rank == 0 ? root_step : 7);
    auto dp = MakeDp(&group, &arena);
    ThrowIfError(dp->SyncFromRoot(&adam), "SyncFromRoot");
    fleet::testing::ExpectExactly(arena.ParamsToHost(), root_params, "params");
    for (const Tensor& state : adam.state()) {
      fleet::testing::ExpectExactly(std::vector<float>(state.data(), state.data() + arena.size()),
                                    root_params, "optimizer state");
    }
    if (adam.step() != root_step) throw std::runtime_error("step " + std::to_string(adam.step()));
  });
}

TEST(DataParallelTest, SumOverRanksAddsEveryRanksValues) {
  RunGlooRanks(3, milliseconds(10000), [&](int rank, Collective& group) {
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    auto dp = MakeDp(&group, &arena);
    float values[3] = {1.0f, static_cast<float>(rank), 1000.0f * rank};
    ThrowIfError(dp->SumOverRanks(values), "SumOverRanks");
    fleet::testing::ExpectExactly({values[0], values[1], values[2]}, {3.0f, 3.0f, 3000.0f},
                                  "sums");
  });
}

// Wraps a Collective and records when each all-reduce started and on which
// thread, to show buckets go out while the caller is still busy.
class RecordingCollective final : public Collective {
 public:
  explicit RecordingCollective(Collective& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  Status AllReduce(float* data, size_t count, ReduceOp op) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      starts_.push_back({Clock::now(), std::this_thread::get_id()});
    }
    return inner_.AllReduce(data, count, op);
  }
  Status Broadcast(float* data, size_t count, int root) override {
    return inner_.Broadcast(data, count, root);
  }
  Status AllGather(const float* in, float* out, size_t count) override {
    return inner_.AllGather(in, out, count);
  }
  Status ReduceScatter(const float* in, float* out, size_t count) override {
    return inner_.ReduceScatter(in, out, count);
  }
  Status Barrier() override { return inner_.Barrier(); }

  std::vector<std::pair<Clock::time_point, std::thread::id>> starts() {
    std::lock_guard<std::mutex> lock(mu_);
    return starts_;
  }

 private:
  Collective& inner_;
  std::mutex mu_;
  std::vector<std::pair<Clock::time_point, std::thread::id>> starts_;
};

TEST(DataParallelTest, ReadyBucketsAreReducedWhileBackwardContinues) {
  RunGlooRanks(2, milliseconds(10000), [&](int rank, Collective& group) {
    RecordingCollective recording(group);
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    auto dp = MakeDp(&recording, &arena, 15 * sizeof(float));  // 3 buckets
    const std::vector<float> want = LoadSeedGrads(arena, rank, 2);
    GradReadyFn ready = dp->grad_ready();
    ready(4, 6);
    ready(2, 4);
    // "Backward of the first layer" takes a while; the two finished buckets
    // must be all-reduced meanwhile, on the helper's thread.
    std::this_thread::sleep_for(milliseconds(300));
    const Clock::time_point before_last = Clock::now();
    ready(0, 2);
    ThrowIfError(dp->FinishGradients(), "FinishGradients");
    fleet::testing::ExpectExactly(arena.GradsToHost(), want, "grads");
    const auto starts = recording.starts();
    if (starts.size() != 3) throw std::runtime_error("want 3 all-reduce calls");
    for (int b = 0; b < 2; ++b) {
      if (starts[b].first >= before_last) {
        throw std::runtime_error("bucket " + std::to_string(b) +
                                 " was not reduced before backward finished");
      }
    }
    for (const auto& s : starts) {
      if (s.second == std::this_thread::get_id()) {
        throw std::runtime_error("an all-reduce ran on the caller's thread");
      }
    }
  });
}

// A peer that leaves (its sockets close, as when its process dies) makes
// the survivor's step fail at once with an error naming the survivor's
// rank and the bucket; later calls report the group as unusable.
TEST(DataParallelTest, PeerThatLeavesFailsTheStepWithAnErrorNamingTheRank) {
  std::string error;
  double seconds = 0;
  RunGlooRanks(2, milliseconds(5000), [&](int rank, Collective& group) {
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    auto dp = MakeDp(&group, &arena);
    LoadSeedGrads(arena, rank, 2);
    ThrowIfError(dp->FinishGradients(), "first step");
    if (rank == 1) return;  // leaves: the group is destroyed with the thread's scope
    const auto t0 = Clock::now();
    ReportLikeMlpBackward(*dp);
    Status st = dp->FinishGradients();
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    error = st.ToString();
    if (st.ok()) throw std::runtime_error("step with a departed peer succeeded");
    Status again = dp->FinishGradients();
    if (again.ok()) throw std::runtime_error("broken helper accepted another step");
  });
  EXPECT_NE(error.find("data parallel rank 0 of 2 (peer: rank 1)"), std::string::npos) << error;
  EXPECT_NE(error.find("gradient bucket"), std::string::npos) << error;
  EXPECT_LT(seconds, 5.5) << error;
}

// A peer that stays connected but stops calling makes the survivor fail
// with Timeout after the collective's timeout, not hang.
TEST(DataParallelTest, StalledPeerTimesOutWithinTheCollectiveTimeout) {
  std::string error;
  double seconds = 0;
  const milliseconds timeout(1500);
  RunGlooRanks(2, timeout, [&](int rank, Collective& group) {
    CpuBackend backend;
    ParamArena arena = MakeArena(&backend);
    auto dp = MakeDp(&group, &arena);
    if (rank == 1) {
      std::this_thread::sleep_for(timeout + milliseconds(1000));
      return;
    }
    LoadSeedGrads(arena, rank, 2);
    const auto t0 = Clock::now();
    Status st = dp->FinishGradients();
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    error = st.ToString();
    if (st.ok()) throw std::runtime_error("step with a stalled peer succeeded");
  });
  EXPECT_NE(error.find("Timeout"), std::string::npos) << error;
  EXPECT_NE(error.find("data parallel rank 0 of 2"), std::string::npos) << error;
  EXPECT_LT(seconds, 1.5 * 1.5 + 0.5) << error;
}

}  // namespace
}  // namespace fleet::trainer
