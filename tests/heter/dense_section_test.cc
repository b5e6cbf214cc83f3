// The heter worker's dense section on CUDA against its CPU result: the same
// parameters and micro-batch give the same loss, predictions and gradients
// (within float tolerance: cuBLAS sums in another order). Skips with a
// message where there is no GPU; the CUDA kernels are compiled regardless.
#include "heter/dense_section.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/ps/ps_cluster.h"
#include "trainer/kernels/backend_factory.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::heter {
namespace {

// ctr_dnn with 26 slots x 4, 13 dense features, hidden [32, 16]: 4321 parameters.
ps::JobConfig Job() {
  return ps::testing::MakeJob(
      "tables:\n"
      "  - {id: 0, kind: sparse, dim: 4, shard_num: 8}\n"
      "  - {id: 1, kind: dense, dim: 4321}\n"
      "model: {kind: ctr_dnn, sparse_table: 0, dense_table: 1, hidden: [32, 16], seed: 1}\n"
      "data: {train: unused}\n");
}

TrainRequest Request(const DenseShape& shape, int batch, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  TrainRequest r;
  r.id = {0, 0, 0, 1};
  r.dense_grad_scale = 0.25f;
  r.pooled = SArray<float>(shape.pooled_floats(batch));
  r.dense = SArray<float>(shape.dense_floats(batch));
  r.labels = SArray<float>(static_cast<size_t>(batch));
  for (float& x : r.pooled) x = u(rng);
  for (float& x : r.dense) x = u(rng) + 0.5f;
  for (int b = 0; b < batch; ++b) r.labels[b] = static_cast<float>(b % 3 == 0);
  return r;
}

// Worst |got - want| / (atol + rtol |want|) over the elements, with its index.
void ExpectClose(const std::string& what, std::span<const float> got, std::span<const float> want,
                 double atol, double rtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::abs(double{got[i]} - want[i]) / (atol + rtol * std::abs(want[i]));
    if (e > worst) worst = e, at = i;
  }
  EXPECT_LE(worst, 1.0) << what << "[" << at << "]: " << got[at] << " vs " << want[at];
}

TEST(DenseSectionTest, CudaMatchesCpu) {
  if (trainer::CudaDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount reports 0 or CUDA is not built); "
                    "the dense section's CUDA kernels were compiled and linked but not run";
  }
  auto cpu = DenseSection::Create(Job(), trainer::Device{}, nullptr);
  auto gpu = DenseSection::Create(Job(), trainer::Device{trainer::Device::Kind::kCuda, 0}, nullptr);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  // The same parameters on both (as pulled from the dense table).
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (size_t i = 0; i < (*cpu)->param_count(); ++i) {
    (*cpu)->host_params()[i] = (*gpu)->host_params()[i] = u(rng);
  }
  ASSERT_TRUE((*cpu)->LoadParams().ok());
  ASSERT_TRUE((*gpu)->LoadParams().ok());
  for (int batch : {1, 7, 64}) {
    const std::string b = "batch " + std::to_string(batch) + " ";
    const TrainRequest r = Request((*cpu)->shape(), batch, batch);
    TrainReply want, got;
    std::vector<float> want_grad((*cpu)->param_count()), got_grad((*gpu)->param_count());
    ASSERT_TRUE((*cpu)->Run(r, &want, want_grad).ok());
    ASSERT_TRUE((*gpu)->Run(r, &got, got_grad).ok());
    EXPECT_NEAR(got.loss, want.loss, 1e-5 + 1e-4 * std::abs(want.loss)) << b;
    ExpectClose(b + "probs", got.probs.span(), want.probs.span(), 1e-6, 1e-4);
    ExpectClose(b + "pooled_grad", got.pooled_grad.span(), want.pooled_grad.span(), 1e-7, 1e-3);
    ExpectClose(b + "dense_grad", got_grad, want_grad, 1e-7, 1e-3);
  }
}

// Without the device: a clear Unavailable naming it, never a crash.
TEST(DenseSectionTest, AMissingDeviceIsUnavailable) {
  const int count = trainer::CudaDeviceCount();
  auto s =
      DenseSection::Create(Job(), trainer::Device{trainer::Device::Kind::kCuda, count}, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.status().IsUnavailable()) << s.status().ToString();
  EXPECT_NE(s.status().message().find("cuda:" + std::to_string(count)), std::string::npos)
      << s.status().ToString();
}

// On the CPU the section is the CPU worker's own tower: a micro-batch's
// results are those of CtrModel itself, the dense gradient scaled.
TEST(DenseSectionTest, CpuRunIsTheTowerItself) {
  auto section = DenseSection::Create(Job(), trainer::Device{}, nullptr);
  ASSERT_TRUE(section.ok()) << section.status().ToString();
  trainer::CpuBackend backend;
  trainer::CtrModelConfig c;
  c.embedding_dim = 4;
  c.hidden = {32, 16};
  auto tower = trainer::CtrModel::Create(c, &backend);
  ASSERT_TRUE(tower.ok());
  std::vector<float> params = (*tower)->arena().ParamsToHost();
  std::copy(params.begin(), params.end(), (*section)->host_params().begin());
  ASSERT_TRUE((*section)->LoadParams().ok());
  const TrainRequest r = Request((*section)->shape(), 9, 1);
  TrainReply reply;
  std::vector<float> grad((*section)->param_count());
  ASSERT_TRUE((*section)->Run(r, &reply, grad).ok());
  (*tower)->arena().ZeroGrad();
  auto loss = (*tower)->Forward(r.pooled.span(), r.dense.span(), r.labels.span());
  ASSERT_TRUE(loss.ok());
  (*tower)->Backward();
  EXPECT_EQ(reply.loss, *loss);
  const std::vector<float> want = (*tower)->arena().GradsToHost();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(grad[i], want[i] * 0.25f) << i;
  // A label outside [0, 1] is the model's InvalidArgument.
  TrainRequest bad = Request((*section)->shape(), 2, 2);
  bad.labels[1] = 3;
  Status s = (*section)->Run(bad, &reply, grad);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
}

}  // namespace
}  // namespace fleet::heter
