// The CUDA backend against the CPU kernels: the MLP's forward, every
// gradient and three Adam steps must agree. Skipped with a reason when the
// build has no CUDA or the machine has no GPU; the CUDA code still has to
// compile and link for this test to exist.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "trainer/backend.h"
#include "trainer/models/mlp.h"
#include "trainer/optimizer.h"
#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/backend_factory.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

TEST(CudaBackendTest, MissingDeviceIsUnavailable) {
  const int count = CudaDeviceCount();
  auto backend = CreateBackend(Device{Device::Kind::kCuda, count}, nullptr);
  EXPECT_TRUE(backend.status().IsUnavailable()) << backend.status().ToString();
}

// Adam divides each gradient by its own running RMS, so what reaches a
// parameter is the RELATIVE difference of the twins' gradients, not the
// absolute one the gradient check bounds. Gradients near zero from
// cancellation (sums of terms of both signs, added in another order by
// cuBLAS and by the CPU GEMMs) pass that check (abs 1e-5) with relative
// differences of 1e-2 or more, and Adam turns those into lr * 1e-2 = 1e-4 on
// the parameter: on an H100, 3-4 of 118282 parameters per step, worst
// 0.030601 vs 0.030761. The parameters' tolerance therefore adds, to the
// float32 one, the first-order propagation of the MEASURED gradient
// differences through Adam. The normalised update u = m^ / (sqrt(v^) + eps)
// has |u| <= c = 1.004 for t <= 3 steps with PyTorch's betas
// (Cauchy-Schwarz over the bias-corrected weights: c^2 = sum a_s^2 / b_s).
// If every gradient of the element so far differs by at most rho of itself,
// m^ moves by at most rho c sqrt(v^) and sqrt(v^) by at most rho of itself,
// so u moves by at most 2 c rho / (1 - rho), and never by more than 2 c (a
// sign flip); each step adds lr * 2.02 min(1, rho / (1 - rho)). A parameter
// whose gradients agree to float32 rounding (rho ~ 1e-6) gets ~1e-8 extra,
// so a wrong Adam kernel (errors of order lr) still fails.
class AdamAllowance {
 public:
  AdamAllowance(size_t n, double lr) : lr_(lr), rho_(n, 0.0), extra_(n, 0.0) {}
  // After a backward: want = the CPU's gradients, got = the GPU's.
  void AddStep(const std::vector<float>& got, const std::vector<float>& want) {
    for (size_t i = 0; i < rho_.size(); ++i) {
      const double diff = std::fabs(double{got[i]} - double{want[i]});
      const double scale = std::fabs(double{want[i]});
      const double rho = diff == 0.0 ? 0.0 : scale > 0.0 ? diff / scale : INFINITY;
      rho_[i] = std::max(rho_[i], rho);
      const double move = rho_[i] < 1.0 ? std::min(1.0, rho_[i] / (1.0 - rho_[i])) : 1.0;
      extra_[i] += lr_ * kTwiceMaxUpdate * move;
    }
  }
  // |got - want| <= 1e-5 + 1e-3 |want| + the allowance, per element.
  ::testing::AssertionResult Check(const std::string& name, const std::vector<float>& got,
                                   const std::vector<float>& want) const {
    size_t bad = 0, worst_i = 0;
    double worst = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double excess = std::fabs(double{got[i]} - double{want[i]}) -
                            (1e-5 + 1e-3 * std::fabs(double{want[i]}) + extra_[i]);
      if (!(excess <= 0.0)) {
        ++bad;
        if (!(excess <= worst)) {
          worst = std::isnan(excess) ? INFINITY : excess;
          worst_i = i;
        }
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << name << ": " << bad << " of " << want.size()
           << " parameters beyond abs 1e-5 + rel 1e-3 + Adam's allowance; worst at " << worst_i
           << ": got " << got[worst_i] << ", want " << want[worst_i] << ", allowance "
           << extra_[worst_i] << " (largest relative gradient difference " << rho_[worst_i]
           << ")";
  }

 private:
  static constexpr double kTwiceMaxUpdate = 2.02;  // 2 c
  const double lr_;
  std::vector<double> rho_, extra_;
};

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
  const float lr = 0.01f;
  Adam adam_a(&(*a)->arena(), {lr});
  Adam adam_b(&(*b)->arena(), {lr});
  AdamAllowance allowance((*a)->arena().size(), lr);
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
    const std::vector<float> grads_a = (*a)->arena().GradsToHost();
    const std::vector<float> grads_b = (*b)->arena().GradsToHost();
    EXPECT_TRUE(AllClose(s + "grads", grads_b, grads_a, 1e-5, 1e-3));
    allowance.AddStep(grads_b, grads_a);
    adam_a.Step();
    adam_b.Step();
    EXPECT_TRUE(allowance.Check(s + "params", (*b)->arena().ParamsToHost(),
                                (*a)->arena().ParamsToHost()));
  }
}

}  // namespace
}  // namespace fleet::trainer
