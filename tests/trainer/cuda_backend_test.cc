// The CUDA backend against the CPU kernels: the MLP's forward, every
// gradient and three Adam steps must agree. Skipped with a reason when the
// build has no CUDA or the machine has no GPU; the CUDA code still has to
// compile and link for this test to exist.
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "trainer/backend.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"
#include "tests/trainer/test_util.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

TEST(CudaBackendTest, MissingDeviceIsUnavailable) {
  const int count = CudaDeviceCount();
  auto backend = CreateBackend(Device{Device::Kind::kCuda, count}, nullptr);
  EXPECT_TRUE(backend.status().IsUnavailable()) << backend.status().ToString();
}

TEST(CudaBackendTest, MlpMatchesCpu) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount reports 0 or CUDA is not built); "
                    "the CUDA kernels were compiled and linked but not run";
  }
  auto cuda = CreateBackend(Device{Device::Kind::kCuda, 0}, nullptr);
  ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
  CpuBackend cpu;
  MlpConfig config;
  config.sizes = {784, 128, 128, 10};
  auto a = Mlp::Create(config, &cpu);
  auto b = Mlp::Create(config, cuda->get());
  ASSERT_TRUE(a.ok() && b.ok());
  Adam adam_a(&(*a)->arena(), {0.01f});
  Adam adam_b(&(*b)->arena(), {0.01f});
  const int B = 64;
  const auto x = RandomVector(size_t(B) * 784, 3, 0, 1);
  std::vector<int32_t> labels(B);
  for (int i = 0; i < B; ++i) labels[i] = i % 10;
  for (int step = 0; step < 3; ++step) {
    const std::string s = "step" + std::to_string(step) + " ";
    (*a)->arena().ZeroGrad();
    (*b)->arena().ZeroGrad();
    auto la = (*a)->Forward(x, labels);
    auto lb = (*b)->Forward(x, labels);
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_NEAR(*la, *lb, 1e-4 + 1e-4 * std::fabs(*la)) << s;
    EXPECT_TRUE(AllClose(s + "probs", (*b)->Probabilities(), (*a)->Probabilities(), 1e-5, 1e-3));
    (*a)->Backward();
    (*b)->Backward();
    EXPECT_TRUE(AllClose(s + "grads", (*b)->arena().GradsToHost(), (*a)->arena().GradsToHost(),
                         1e-5, 1e-3));
    adam_a.Step();
    adam_b.Step();
    EXPECT_TRUE(AllClose(s + "params", (*b)->arena().ParamsToHost(),
                         (*a)->arena().ParamsToHost(), 1e-5, 1e-3));
  }
}

}  // namespace
}  // namespace fleet::trainer
