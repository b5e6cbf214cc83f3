// Training steps allocate nothing once warm (issue 14: "no per-step
// allocation"): a heap allocation on the hot path costs a malloc at best and
// a page fault at worst, on every step. Counted per thread with
// tests/alloc_counter.h, so each test counts exactly the steps it brackets.
#include <gtest/gtest.h>

#include <vector>

#include "tests/alloc_counter.h"
#include "tests/collective/mnist_test_data.h"
#include "tests/comm/collective_test_util.h"
#include "collective/mlp_classifier.h"
#include "collective/train_loop.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::trainer::collective {
namespace {

using fleet::testing::AllocationCounter;
using fleet::testing::SyntheticMnist;

TEST(SteadyStateAllocationTest, CounterSeesAnAllocation) {
  AllocationCounter counter;
  std::vector<float> v(100);
  EXPECT_EQ(counter.Stop(), 1);
}

// The bare MLP step (zero gradients, forward, backward, Adam).
TEST(SteadyStateAllocationTest, MlpStep) {
  kernels::SetBlasThreads(1);
  CpuBackend backend;
  auto model = Mlp::Create({}, &backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Adam adam(&(*model)->arena(), kernels::AdamHyper{});
  std::vector<float> x(64 * 784, 0.5f);
  std::vector<int32_t> labels(64, 3);
  auto step = [&] {
    (*model)->arena().ZeroGrad();
    ASSERT_TRUE((*model)->Forward(x, labels).ok());
    (*model)->Backward();
    adam.Step();
  };
  for (int i = 0; i < 3; ++i) step();
  AllocationCounter counter;
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(counter.Stop(), 0);
}

// The collective loop around the MLP task, 1 rank and 2 ranks over shared
// memory (ranks as threads): from the end of step 5 to the end of step 40,
// every allocation of a rank's thread is counted (the loop, the batch
// gather, DataParallel and the all-reduce all run on it). With 2 ranks an
// epoch is 31 steps, so the count spans a new epoch's shuffle too.
TrainLoopOptions CountingOptions(int64_t steps, std::vector<long>* per_rank, int rank) {
  TrainLoopOptions o;
  o.batch_size = 32;
  o.epochs = 100;
  o.max_steps = steps;
  o.log_every_steps = 0;
  o.evaluate = false;
  o.after_step = [steps, per_rank, rank](int64_t done) {
    if (done == 5) fleet::testing::StartCountingAllocations();
    if (done == steps) (*per_rank)[rank] = fleet::testing::StopCountingAllocations();
    return Status::OK();
  };
  return o;
}

TEST(SteadyStateAllocationTest, TrainLoopOneRank) {
  kernels::SetBlasThreads(1);
  const data::MnistData data = SyntheticMnist(2000, 100);
  std::vector<long> per_rank(1, -1);
  CpuBackend backend;
  auto task = MlpClassifierTask::Create({}, data.train, data.test, &backend);
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  auto report = RunTrainLoop(CountingOptions(40, &per_rank, 0), **task, nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(per_rank[0], 0) << "allocations in 35 steps of the loop";
}

TEST(SteadyStateAllocationTest, TrainLoopTwoRanksOverSharedMemory) {
  kernels::SetBlasThreads(1);
  const data::MnistData data = SyntheticMnist(2000, 100);
  std::vector<long> per_rank(2, -1);
  fleet::testing::RunRanksOver("shm", 2, std::chrono::milliseconds(20000),
                              [&](int rank, Collective& group) {
                                CpuBackend backend;
                                auto task = MlpClassifierTask::Create({}, data.train, data.test,
                                                                      &backend);
                                fleet::testing::ThrowIfError(task.status(), "task");
                                auto report = RunTrainLoop(CountingOptions(40, &per_rank, rank),
                                                           **task, &group, nullptr);
                                fleet::testing::ThrowIfError(report.status(), "RunTrainLoop");
                              });
  EXPECT_EQ(per_rank[0], 0) << "rank 0's allocations in 35 steps";
  EXPECT_EQ(per_rank[1], 0) << "rank 1's allocations in 35 steps";
}

}  // namespace
}  // namespace fleet::trainer::collective
