// The ctr_dnn worker step of configs/ctr_dnn.yaml allocates nothing once
// warm (issue 14: "no per-step allocation"): pull, embedding pooling,
// forward, backward, unpooling and push, against parameters in local memory
// (worker/local_communicator.h), counted on the step's thread.
#include <gtest/gtest.h>

#include <string>

#include "ps/job_config.h"
#include "tests/alloc_counter.h"
#include "tests/test_paths.h"
#include "worker/local_communicator.h"
#include "tests/worker/worker_test_util.h"
#include "trainer/kernels/cpu_kernels.h"
#include "worker/config.h"
#include "worker/task.h"

namespace fleet::worker {
namespace {

TEST(WorkerSteadyStateAllocationTest, CtrDnnTrainStep) {
  trainer::kernels::SetBlasThreads(1);
  const std::string dir = testing::FreshDir("steady_state_alloc");
  // 2 x 2048 training lines: 16 full batches of 256. (A short last batch
  // would reallocate the model's activations for its size, and again for
  // the next full one: twice an epoch, by design, not per step.)
  testing::MakeCtrData(dir, 2048);
  auto ctr = testing::LoadCtrJob(dir);
  ASSERT_TRUE(ctr.ok()) << ctr.status().ToString();
  const ps::JobConfig& job = ctr->job;
  const WorkerConfig& config = ctr->config;
  auto task = CreateWorkerTask(config, job, {});
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  const int64_t batches = (*task)->num_train_batches();
  ASSERT_EQ(batches, 16);
  ASSERT_EQ((*task)->batch_samples(batches - 1), 256u);

  LocalCommunicator comm(9, (*task)->dense_param_count());
  // One pass over the batches creates every row the data has and sizes
  // every buffer; the second pass is the steady state.
  for (int64_t b = 0; b < batches; ++b) ASSERT_TRUE((*task)->TrainStep(b, comm).ok());
  fleet::testing::AllocationCounter counter;
  for (int64_t b = 0; b < batches; ++b) {
    const Status st = (*task)->TrainStep(b, comm);
    if (!st.ok()) {
      counter.Stop();
      FAIL() << st.ToString();
    }
  }
  EXPECT_EQ(counter.Stop(), 0) << "allocations in " << batches << " steps";
}

}  // namespace
}  // namespace fleet::worker
