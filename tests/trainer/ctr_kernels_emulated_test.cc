// The CUDA twins of the CTR interaction kernels (ctr_cuda_kernels.cu),
// compiled by the host compiler and run on the CPU emulation
// (trainer/kernels/cuda_emulation.h), against the CPU kernels: same field
// layout, same results (FM's sums in double on both sides), forward beta 0
// and 1, backward adding. No GPU needed; what only a GPU shows (speed) is
// not tested here.
#include <gtest/gtest.h>

#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/kernels/ctr_cuda_kernels.cu"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

// 5 samples of 6 fields of 4 floats plus 3 other features: more threads
// than one block of the element-wise kernels, fewer than two.
constexpr int B = 5, F = 6, P = 4, kRow = F * P + 3;

TEST(CtrKernelsEmulated, FieldSumMatchesCpu) {
  const std::vector<float> x = RandomVector(B * kRow, 1);
  for (const auto& [offset, width] : {std::pair{0, 1}, std::pair{1, 3}}) {
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> cpu = RandomVector(B * width, 2), gpu = cpu;
      kernels::FieldSumForward(cpu.data(), x.data(), B, F, width, kRow, P, offset, beta);
      ASSERT_EQ(
          cuda::FieldSumForward(gpu.data(), x.data(), B, F, width, kRow, P, offset, beta, nullptr),
          cudaSuccess);
      EXPECT_TRUE(AllClose("field sum", gpu, cpu, 1e-6, 1e-6));
    }
    const std::vector<float> dout = RandomVector(B * width, 3);
    std::vector<float> cpu = RandomVector(B * kRow, 4), gpu = cpu;
    kernels::FieldSumBackward(cpu.data(), dout.data(), B, F, width, kRow, P, offset);
    ASSERT_EQ(
        cuda::FieldSumBackward(gpu.data(), dout.data(), B, F, width, kRow, P, offset, nullptr),
        cudaSuccess);
    EXPECT_TRUE(AllClose("field sum backward", gpu, cpu, 1e-6, 1e-6));
  }
}

TEST(CtrKernelsEmulated, FmMatchesCpu) {
  const std::vector<float> x = RandomVector(B * kRow, 5);
  for (float beta : {0.0f, 1.0f}) {
    std::vector<float> cpu = RandomVector(B, 6), gpu = cpu;
    kernels::FmForward(cpu.data(), x.data(), B, F, P - 1, kRow, P, 1, beta);
    ASSERT_EQ(cuda::FmForward(gpu.data(), x.data(), B, F, P - 1, kRow, P, 1, beta, nullptr),
              cudaSuccess);
    EXPECT_TRUE(AllClose("fm", gpu, cpu, 0, 0));
  }
  const std::vector<float> dout = RandomVector(B, 7);
  std::vector<float> cpu = RandomVector(B * kRow, 8), gpu = cpu;
  kernels::FmBackward(cpu.data(), x.data(), dout.data(), B, F, P - 1, kRow, P, 1);
  ASSERT_EQ(cuda::FmBackward(gpu.data(), x.data(), dout.data(), B, F, P - 1, kRow, P, 1, nullptr),
            cudaSuccess);
  EXPECT_TRUE(AllClose("fm backward", gpu, cpu, 0, 0));
}

TEST(CtrKernelsEmulated, CrossMatchesCpu) {
  const size_t n = 300;  // two blocks of 256
  const std::vector<float> x0 = RandomVector(n, 9), u = RandomVector(n, 10),
                           xl = RandomVector(n, 11), dy = RandomVector(n, 12);
  std::vector<float> cpu(n), gpu(n);
  kernels::CrossForward(cpu.data(), x0.data(), u.data(), xl.data(), n);
  ASSERT_EQ(cuda::CrossForward(gpu.data(), x0.data(), u.data(), xl.data(), n, nullptr),
            cudaSuccess);
  EXPECT_TRUE(AllClose("cross", gpu, cpu, 0, 0));
  std::vector<float> dx0 = RandomVector(n, 13), dxl = RandomVector(n, 14), du(n, 7.0f);
  std::vector<float> gdx0 = dx0, gdxl = dxl, gdu(n, -7.0f);
  kernels::CrossBackward(dx0.data(), du.data(), dxl.data(), x0.data(), u.data(), dy.data(), n);
  ASSERT_EQ(cuda::CrossBackward(gdx0.data(), gdu.data(), gdxl.data(), x0.data(), u.data(),
                                dy.data(), n, nullptr),
            cudaSuccess);
  EXPECT_TRUE(AllClose("cross dx0", gdx0, dx0, 0, 0));
  EXPECT_TRUE(AllClose("cross du", gdu, du, 0, 0));
  EXPECT_TRUE(AllClose("cross dxl", gdxl, dxl, 0, 0));
}

}  // namespace
}  // namespace fleet::trainer
