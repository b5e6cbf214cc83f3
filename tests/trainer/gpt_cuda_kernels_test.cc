// CudaGptKernels (the CUDA twin) against CpuGptKernels (the CPU twin, itself
// tested against the float64 oracle): every kernel, forward and backward, on
// random inputs over shapes that exercise the CUDA blocking (T = 1, T not a
// multiple of the 32-row attention tile, B = 1, NH = 1, head sizes 8 to 160
// with each register layout, shared memory above 48 KiB), the tensor-core
// attention of bf16 / fp16 (head sizes 16 to 128; the decode test's head
// size 16 takes it too), the KV-cache decode, determinism, and a whole GptModel step (loss, every
// gradient named by tensor, the loss after an AdamW step, recompute bit-identical) in fp32 and
// bf16. Skipped with a reason when no GPU is present (the CUDA code still has to compile and link
// for this test to exist); the factory's errors are tested everywhere.
//
// Tolerances, |got - want| <= abs + rel |want| per element:
//   * fp32, every kernel, and in every precision the kernels that compute in
//     float32 whatever the precision (embedding, LayerNorm, GELU, AdamW,
//     the decode cache copy): the interface's abs 1e-4, rel 1e-3;
//     cross-entropy's losses and logit gradients (values ~1/V): abs 1e-6,
//     rel 1e-3; SumOfSquares: rel 1e-6.
//   * matmuls and attention in bf16 (inputs rounded to 8 significant bits
//     inside cuBLAS and in the attention tiles): abs = rel = 5e-2 relative
//     to the tensor's largest |want| (normwise, since rounding errors scale
//     with the operands, not with each output); fp16 (11 bits): 1e-2.
//   * the whole model step: fp32 loss within 1e-4, gradients abs 2e-5 rel
//     2e-3; bf16 loss within 2e-2 relative, each gradient tensor 1e-1
//     normwise (errors of every layer compound through backward).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/trainer/test_util.h"
#include "trainer/models/adamw.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/gpt_cuda_kernels.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "collective/loss_scaler.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_plan.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/backend_factory.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

constexpr char kNoGpu[] =
    "no CUDA GPU present (cudaGetDeviceCount reports 0 or CUDA is not built); "
    "CudaGptKernels was compiled and linked but not run";

std::vector<int32_t> RandomIds(size_t n, int hi, uint32_t seed) {
  std::vector<int32_t> out;
  for (float f : RandomVector(n, seed, 0.0f, 1.0f)) {
    out.push_back(std::min(hi - 1, static_cast<int>(f * static_cast<float>(hi))));
  }
  return out;
}

// See the tolerances above. `rounded`: the kernel's inputs are rounded to the
// precision (matmuls, attention).
::testing::AssertionResult Close(const std::string& name, std::span<const float> got,
                                 std::span<const float> want, Precision precision, bool rounded) {
  if (precision == Precision::kFp32 || !rounded) return AllClose(name, got, want, 1e-4, 1e-3);
  const double f = precision == Precision::kBf16 ? 5e-2 : 1e-2;
  double peak = 0.0;
  for (float w : want) peak = std::max(peak, std::fabs(double{w}));
  return AllClose(name + " (" + std::string(PrecisionName(precision)) + ", normwise)", got, want,
                  f * peak, f);
}

// Device copies of host vectors on a backend, kept alive until destruction.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(Backend* backend) : backend_(backend) {}
  float* Put(const std::vector<float>& host) {
    float* p = Zeros(host.size());
    backend_->CopyFromHost(p, host.data(), host.size() * sizeof(float));
    return p;
  }
  int32_t* PutInts(const std::vector<int32_t>& host) {
    std::shared_ptr<void> p = backend_->AllocateBytes(host.size() * sizeof(int32_t));
    backend_->CopyFromHost(p.get(), host.data(), host.size() * sizeof(int32_t));
    keep_.push_back(p);
    return static_cast<int32_t*>(p.get());
  }
  float* Zeros(size_t n) {
    std::shared_ptr<float> p = backend_->AllocateFloats(n);
    keep_.push_back(p);
    return p.get();
  }
  // Waits for the kernels: the twin runs on the backend's stream.
  std::vector<float> Get(const float* p, size_t n) {
    std::vector<float> host(n);
    backend_->CopyToHost(host.data(), p, n * sizeof(float));
    return host;
  }

 private:
  Backend* const backend_;
  std::vector<std::shared_ptr<void>> keep_;
};

// ---- what runs without a GPU: the factory ------------------------------------------------

TEST(GptKernelsFactory, CpuGivesTheCpuTwinInAnyPrecision) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    auto compute = CreateGptCompute("cpu", p, 2);
    ASSERT_TRUE(compute.ok()) << compute.status().ToString();
    EXPECT_EQ(compute->kernels->name(), "cpu");
    EXPECT_TRUE(compute->kernels->device().is_cpu());
    EXPECT_TRUE(compute->backend->device().is_cpu());
    EXPECT_NE(compute->pool, nullptr);
  }
}

TEST(GptKernelsFactory, MissingGpuOrCudaIsUnavailableNamingTheDevice) {
  const std::string device = "cuda:" + std::to_string(CudaDeviceCount());
  auto compute = CreateGptCompute(device, Precision::kBf16, 1);
  ASSERT_FALSE(compute.ok());
  EXPECT_TRUE(compute.status().IsUnavailable()) << compute.status().ToString();
  EXPECT_NE(compute.status().message().find(device), std::string::npos)
      << compute.status().ToString();
}

TEST(GptKernelsFactory, RejectsBadArguments) {
  EXPECT_TRUE(testing::IsInvalidArgumentNaming(
      CreateGptCompute("gpu0", Precision::kFp32, 1).status(), "gpu0"));
  EXPECT_TRUE(CreateGptCompute("cpu", Precision::kFp32, 0).status().IsInvalidArgument());
  EXPECT_TRUE(CreateGptKernels(nullptr, Precision::kFp32, nullptr).status().IsInvalidArgument());
}

// ---- every kernel: CUDA twin vs CPU twin ----------------------------------------------------

struct KernelShape {
  int B, T, C, NH;
  std::string Name() const {
    return "B" + std::to_string(B) + "_T" + std::to_string(T) + "_C" + std::to_string(C) + "_NH" +
           std::to_string(NH);
  }
};

// Head sizes 8, 8, 64, 32, 128, 160 (lanes keep 1, 1, 2, 1, 4, 8 dims);
// T = 1, 37, 70, 96, 33, 40 (one partial tile, several, exact multiples);
// float32 attention backward on the last two needs 66 and 82 KiB of shared
// memory (the opt-in path).
const std::vector<KernelShape> kShapes = {{1, 1, 8, 1},   {2, 37, 32, 4},  {1, 70, 64, 1},
                                          {3, 96, 96, 3}, {2, 33, 256, 2}, {1, 40, 160, 1}};

constexpr const char* kNoTensorCores =
    "tensor-core attention unavailable here (a GPU before sm_80, or a build without sm_80+ "
    "code: configure with -DCMAKE_CUDA_ARCHITECTURES=\"80;90\")";

// The tensor-core attention kernels, with the names tests print.
const std::vector<std::pair<CudaGptKernels::AttentionKernel, std::string_view>> kTensorCoreKernels =
    {{CudaGptKernels::AttentionKernel::kWmma, "wmma"},
     {CudaGptKernels::AttentionKernel::kMma, "mma"},
     {CudaGptKernels::AttentionKernel::kMmaLdMatrix, "mma_ldmatrix"}};

class GptCudaKernels : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << kNoGpu;
    auto compute = CreateGptCompute("cuda:0", GetParam(), 1);
    ASSERT_TRUE(compute.ok()) << compute.status().ToString();
    compute_ = std::move(*compute);
    ASSERT_EQ(compute_.kernels->name(), "cuda");
    dev_ = std::make_unique<DeviceBuffers>(compute_.backend.get());
  }
  GptKernels& gpu() { return *compute_.kernels; }
  Precision precision() const { return GetParam(); }
  // The CUDA twin when it runs attention on tensor cores, else null.
  CudaGptKernels* TensorCoreKernelsOrNull() {
    auto* cuda = dynamic_cast<CudaGptKernels*>(&gpu());
    return cuda != nullptr && cuda->tensor_core_attention() ? cuda : nullptr;
  }
  // Forward (out, lse) and backward (dq, dk, dv, determinism) of the
  // tensor-core attention the twin is set to, against the CPU twin.
  void CheckTensorCoreAttention(const KernelShape& s, const std::string& at);
  // Decoding chunks of 37, 1, 33 and 2 tokens through caches of 80
  // positions against the CPU twin; caches untouched past the last position.
  void CheckDecode(int C, int NH, const std::string& name);

  CpuGptKernels cpu_{nullptr};
  GptCompute compute_;
  std::unique_ptr<DeviceBuffers> dev_;
};

TEST_P(GptCudaKernels, Encoder) {
  // The shared shapes plus 3,108 positions: the token-gradient kernel takes
  // the ids 256 at a time, so a row owned in several windows, a last partial
  // window and V above the 512 row owners are all covered.
  std::vector<KernelShape> shapes = kShapes;
  shapes.push_back({4, 777, 24, 1});
  for (const KernelShape& s : shapes) {
    const std::string at = s.Name() + " ";
    const int N = s.B * s.T, C = s.C, V = N > 1000 ? 700 : 50, P = s.T + 3;
    const auto tokens = RandomIds(N, V, 1);  // repeats: N > V for most shapes
    const auto wte = RandomVector(size_t(V) * C, 2), wpe = RandomVector(size_t(P) * C, 3);
    std::vector<float> out(size_t(N) * C);
    cpu_.EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, C);
    float* d_out = dev_->Zeros(out.size());
    const int32_t* d_tokens = dev_->PutInts(tokens);
    gpu().EncoderForward(d_out, d_tokens, dev_->Put(wte), dev_->Put(wpe), s.B, s.T, C);
    EXPECT_TRUE(Close(at + "out", dev_->Get(d_out, out.size()), out, precision(), false));

    const auto dout = RandomVector(out.size(), 4);
    auto dwte = RandomVector(wte.size(), 5), dwpe = RandomVector(wpe.size(), 6);  // added into
    float* d_dwte = dev_->Put(dwte);
    float* d_dwpe = dev_->Put(dwpe);
    const float* d_dout = dev_->Put(dout);
    cpu_.EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, C);
    gpu().EncoderBackward(d_dwte, d_dwpe, d_dout, d_tokens, s.B, s.T, C);
    const auto got_dwte = dev_->Get(d_dwte, dwte.size());
    EXPECT_TRUE(Close(at + "dwte", got_dwte, dwte, precision(), false));
    EXPECT_TRUE(Close(at + "dwpe", dev_->Get(d_dwpe, dwpe.size()), dwpe, precision(), false));

    // Deterministic: the same additions again give the same bits.
    gpu().EncoderBackward(d_dwte, d_dwpe, d_dout, d_tokens, s.B, s.T, C);
    float* d_again = dev_->Put(got_dwte);
    float* d_pos = dev_->Zeros(dwpe.size());
    gpu().EncoderBackward(d_again, d_pos, d_dout, d_tokens, s.B, s.T, C);
    EXPECT_EQ(dev_->Get(d_again, dwte.size()), dev_->Get(d_dwte, dwte.size())) << at;
  }
}

TEST_P(GptCudaKernels, LayerNorm) {
  for (const KernelShape& s : kShapes) {
    const std::string at = s.Name() + " ";
    const int N = s.B * s.T, C = s.C;
    auto inp = RandomVector(size_t(N) * C, 7, -2.0f, 3.0f);
    const auto w = RandomVector(C, 8), b = RandomVector(C, 9);
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    cpu_.LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                          C);
    float *d_out = dev_->Zeros(out.size()), *d_mean = dev_->Zeros(N), *d_rstd = dev_->Zeros(N);
    const float *d_inp = dev_->Put(inp), *d_w = dev_->Put(w);
    gpu().LayerNormForward(d_out, d_mean, d_rstd, d_inp, d_w, dev_->Put(b), N, C);
    EXPECT_TRUE(Close(at + "out", dev_->Get(d_out, out.size()), out, precision(), false));
    EXPECT_TRUE(Close(at + "mean", dev_->Get(d_mean, N), mean, precision(), false));
    EXPECT_TRUE(Close(at + "rstd", dev_->Get(d_rstd, N), rstd, precision(), false));

    const auto dout = RandomVector(out.size(), 10);
    auto dinp = RandomVector(inp.size(), 11), dw = RandomVector(C, 12), db = RandomVector(C, 13);
    float *d_dinp = dev_->Put(dinp), *d_dw = dev_->Put(dw), *d_db = dev_->Put(db);
    cpu_.LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
    gpu().LayerNormBackward(d_dinp, d_dw, d_db, dev_->Put(dout), d_inp, d_w, d_mean, d_rstd, N, C);
    EXPECT_TRUE(Close(at + "dinp", dev_->Get(d_dinp, dinp.size()), dinp, precision(), false));
    EXPECT_TRUE(Close(at + "dweight", dev_->Get(d_dw, C), dw, precision(), false));
    EXPECT_TRUE(Close(at + "dbias", dev_->Get(d_db, C), db, precision(), false));
  }
}

// Both ways of feeding 16-bit GEMMs (CudaGptKernels::GemmOperands) compute
// the same thing: operands rounded to the precision, float32 accumulation.
TEST_P(GptCudaKernels, Matmul) {
  auto* cuda = dynamic_cast<CudaGptKernels*>(&gpu());
  ASSERT_NE(cuda, nullptr);
  using Operands = CudaGptKernels::GemmOperands;
  for (const Operands operands : {Operands::kRounded, Operands::kInKernel}) {
    cuda->set_gemm_operands(operands);
    const std::string mode = operands == Operands::kRounded ? "rounded " : "in-kernel ";
    for (const KernelShape& s : kShapes) {
      const int N = s.B * s.T, IC = s.C;
      for (const int OC : {3 * s.C, 67}) {  // a projection, and a head over an odd vocabulary
        for (const bool with_bias : {true, false}) {
          for (const bool accumulate : {false, true}) {
            const std::string at = mode + s.Name() + " OC" + std::to_string(OC) +
                                   (with_bias ? " bias" : " nobias") +
                                   (accumulate ? " accumulate " : " ");
            const auto inp = RandomVector(size_t(N) * IC, 14),
                       w = RandomVector(size_t(OC) * IC, 15);
            const auto bias = RandomVector(OC, 16);
            auto out = RandomVector(size_t(N) * OC, 17);  // kept only when accumulating
            float* d_out = dev_->Put(out);
            const float *d_inp = dev_->Put(inp), *d_w = dev_->Put(w);
            cpu_.MatmulForward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr,
                               N, IC, OC, accumulate);
            gpu().MatmulForward(d_out, d_inp, d_w, with_bias ? dev_->Put(bias) : nullptr, N, IC, OC,
                                accumulate);
            EXPECT_TRUE(Close(at + "out", dev_->Get(d_out, out.size()), out, precision(), true));

            // Backward with and without the input and bias gradients.
            const auto dout = RandomVector(out.size(), 18);
            auto dinp = RandomVector(inp.size(), 19), dw = RandomVector(w.size(), 20),
                 db = RandomVector(OC, 21);
            float *d_dinp = dev_->Put(dinp), *d_dw = dev_->Put(dw), *d_db = dev_->Put(db);
            const bool want_dinp = accumulate;  // both variants over the loop
            cpu_.MatmulBackward(want_dinp ? dinp.data() : nullptr, dw.data(),
                                with_bias ? db.data() : nullptr, dout.data(), inp.data(), w.data(),
                                N, IC, OC);
            gpu().MatmulBackward(want_dinp ? d_dinp : nullptr, d_dw, with_bias ? d_db : nullptr,
                                 dev_->Put(dout), d_inp, d_w, N, IC, OC);
            EXPECT_TRUE(
                Close(at + "dinp", dev_->Get(d_dinp, dinp.size()), dinp, precision(), true));
            EXPECT_TRUE(Close(at + "dweight", dev_->Get(d_dw, dw.size()), dw, precision(), true));
            // The bias gradient is a float32 column sum in every precision.
            EXPECT_TRUE(Close(at + "dbias", dev_->Get(d_db, OC), db, precision(), false));
          }
        }
      }
    }
  }
}

// Without and with attention dropout (the tile kernels, whatever the
// precision: the tensor-core kernels have none); the masks are the CPU
// twin's exactly (one generator), so the outputs compare as without.
TEST_P(GptCudaKernels, AttentionIsFlashAndMatchesCpu) {
  const std::vector<int32_t> stream_ids = {31, 32, 33, 34};
  const auto* host_streams = reinterpret_cast<const uint32_t*>(stream_ids.data());
  const auto* device_streams = reinterpret_cast<const uint32_t*>(dev_->PutInts(stream_ids));
  for (const KernelShape& s : kShapes) {
    for (float p : {0.0f, 0.1f}) {
      const std::string at = s.Name() + (p > 0 ? " dropout " : " ");
      const int B = s.B, T = s.T, C = s.C, NH = s.NH;
      ASSERT_LE(B, static_cast<int>(stream_ids.size()));
      DropoutSpec cpu_dropout{
          .p = p, .seed = 5, .site = 1, .streams = host_streams, .head_offset = 1};
      DropoutSpec gpu_dropout = cpu_dropout;
      gpu_dropout.streams = device_streams;
      // Only row statistics between forward and backward, never T x T.
      ASSERT_EQ(gpu().AttentionSavedFloats(B, T, NH), size_t(B) * NH * T) << at;
      ASSERT_EQ(gpu().AttentionScratchFloats(B, T, NH), size_t(B) * NH * T) << at;

      const auto qkv = RandomVector(size_t(B) * T * 3 * C, 22, -1.5f, 1.5f);
      std::vector<float> out(size_t(B) * T * C), saved(cpu_.AttentionSavedFloats(B, T, NH));
      std::vector<float> scratch(cpu_.AttentionScratchFloats(B, T, NH));
      cpu_.AttentionForward(out.data(), saved.data(), scratch.data(), qkv.data(), B, T, C, NH,
                            cpu_dropout);
      const float* d_qkv = dev_->Put(qkv);
      float* d_out = dev_->Zeros(out.size());
      float* d_saved = dev_->Zeros(gpu().AttentionSavedFloats(B, T, NH));
      float* d_scratch = dev_->Zeros(gpu().AttentionScratchFloats(B, T, NH));
      gpu().AttentionForward(d_out, d_saved, d_scratch, d_qkv, B, T, C, NH, gpu_dropout);
      EXPECT_TRUE(Close(at + "out", dev_->Get(d_out, out.size()), out, precision(), true));

      const auto dout = RandomVector(out.size(), 23);
      auto dqkv = RandomVector(qkv.size(), 24);  // added into
      const auto dqkv0 = dqkv;
      cpu_.AttentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                             saved.data(), B, T, C, NH, cpu_dropout);
      const float* d_dout = dev_->Put(dout);
      float* d_dqkv = dev_->Put(dqkv0);
      gpu().AttentionBackward(d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_saved, B, T, C, NH,
                              gpu_dropout);
      const auto got = dev_->Get(d_dqkv, dqkv.size());
      // Compare the gradient alone (the added-into base would hide errors).
      std::vector<float> got_grad(got.size()), want_grad(got.size());
      for (size_t i = 0; i < got.size(); ++i) {
        got_grad[i] = got[i] - dqkv0[i];
        want_grad[i] = dqkv[i] - dqkv0[i];
      }
      // (An overwriting backward would fail here: the start is subtracted.)
      EXPECT_TRUE(Close(at + "dqkv", got_grad, want_grad, precision(), true));

      // Deterministic: again from the same start, the same bits.
      float* d_again = dev_->Put(dqkv0);
      gpu().AttentionBackward(d_again, d_scratch, d_dout, d_qkv, d_out, d_saved, B, T, C, NH,
                              gpu_dropout);
      EXPECT_EQ(dev_->Get(d_again, got.size()), got)
          << at << "attention backward not deterministic";
    }
  }
}

// The element-wise dropout: the CPU twin's mask and values.
TEST_P(GptCudaKernels, DropoutMatchesCpu) {
  const std::vector<int32_t> stream_ids = {3, 1 << 30, 12};
  const int B = 3;
  for (size_t n : {size_t{1}, size_t{4099}}) {
    DropoutSpec d{.p = 0.1f,
                  .seed = 77,
                  .site = 3,
                  .streams = reinterpret_cast<const uint32_t*>(stream_ids.data())};
    DropoutSpec gd = d;
    gd.streams = reinterpret_cast<const uint32_t*>(dev_->PutInts(stream_ids));
    const auto inp = RandomVector(B * n, 30), residual = RandomVector(B * n, 31);
    std::vector<float> want(B * n);
    cpu_.DropoutForward(want.data(), inp.data(), residual.data(), B, n, d);
    float* d_out = dev_->Zeros(want.size());
    gpu().DropoutForward(d_out, dev_->Put(inp), dev_->Put(residual), B, n, gd);
    const std::string at = "n" + std::to_string(n) + " ";
    EXPECT_TRUE(Close(at + "forward", dev_->Get(d_out, want.size()), want, precision(), false));
    cpu_.DropoutBackward(want.data(), inp.data(), B, n, d);
    float* d_grad = dev_->Put(inp);
    gpu().DropoutBackward(d_grad, d_grad, B, n, gd);
    const auto got = dev_->Get(d_grad, want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i] == 0.0f, want[i] == 0.0f) << at << "mask differs at " << i;
    }
  }
}

// The tensor-core path (bf16 / fp16, head sizes multiples of 16 up to 128;
// gpt_cuda_flash_tc.h) against the CPU twin: forward output and
// log-sum-exps through the backward gradient, several heads, T not a
// multiple of the 64-row block nor of the 32- or 64-row streamed tile, and
// head sizes 64 (GPT-2), 128 and 32 (64-key streamed tiles) and 96
// (32-key tiles). Tolerance: Close()'s normwise bf16 5e-2 / fp16 1e-2 of the
// tensor's largest value, as for the float-arithmetic tiles: the products
// take bf16 / fp16 operands (q, k, v, dout, and here also the
// probabilities and dS, each rounded once to 8 or 11 significant bits)
// with float32 accumulation, so each output carries a few units of the
// operands' rounding relative to the largest term; the softmax statistics
// stay float32. Run for both tensor-core implementations (wmma, and mma.sync
// with the probabilities in registers, gpt_cuda_flash_mma.h): same contract,
// same tolerances.
TEST_P(GptCudaKernels, AttentionOnTensorCoresMatchesCpu) {
  if (precision() == Precision::kFp32) GTEST_SKIP() << "float32 attention has no tensor-core path";
  CudaGptKernels* cuda = TensorCoreKernelsOrNull();
  if (cuda == nullptr) GTEST_SKIP() << kNoTensorCores;
  const std::vector<KernelShape> shapes = {
      {2, 100, 256, 4}, {1, 77, 256, 2}, {2, 45, 96, 3}, {1, 130, 192, 2}, {3, 64, 128, 2}};
  for (const auto& [kernel, kernel_name] : kTensorCoreKernels) {
    cuda->set_attention_kernel(kernel);
    for (const KernelShape& s : shapes) {
      CheckTensorCoreAttention(s, std::string(kernel_name) + " " + s.Name() + " ");
    }
  }
}

// Decoding through the caches with past > 0 (the forward's key offset) on
// both tensor-core implementations, against the CPU twin.
TEST_P(GptCudaKernels, AttentionDecodeOnTensorCoresMatchesCpu) {
  if (precision() == Precision::kFp32) GTEST_SKIP() << "float32 attention has no tensor-core path";
  CudaGptKernels* cuda = TensorCoreKernelsOrNull();
  if (cuda == nullptr) GTEST_SKIP() << kNoTensorCores;
  for (const auto& [kernel, kernel_name] : kTensorCoreKernels) {
    cuda->set_attention_kernel(kernel);
    // Head sizes 16 (64-key tiles) and 96 (32-key tiles); chunks that end
    // inside, on and past tile boundaries.
    CheckDecode(/*C=*/64, /*NH=*/4, std::string(kernel_name) + " ");
    CheckDecode(/*C=*/192, /*NH=*/2, std::string(kernel_name) + " ");
  }
}

void GptCudaKernels::CheckTensorCoreAttention(const KernelShape& s, const std::string& at) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH;
  const auto qkv = RandomVector(size_t(B) * T * 3 * C, 50, -1.5f, 1.5f);
  std::vector<float> out(size_t(B) * T * C), saved(cpu_.AttentionSavedFloats(B, T, NH));
  std::vector<float> scratch(cpu_.AttentionScratchFloats(B, T, NH));
  cpu_.AttentionForward(out.data(), saved.data(), scratch.data(), qkv.data(), B, T, C, NH, {});
  const float* d_qkv = dev_->Put(qkv);
  float* d_out = dev_->Zeros(out.size());
  float* d_lse = dev_->Zeros(gpu().AttentionSavedFloats(B, T, NH));
  float* d_scratch = dev_->Zeros(gpu().AttentionScratchFloats(B, T, NH));
  gpu().AttentionForward(d_out, d_lse, d_scratch, d_qkv, B, T, C, NH, {});
  EXPECT_TRUE(Close(at + "out", dev_->Get(d_out, out.size()), out, precision(), true));
  // The log-sum-exps from the CPU twin's probabilities: lse = s_tt - log p_tt
  // on the diagonal (score of a query with itself).
  const int hs = C / NH;
  std::vector<float> want_lse(size_t(B) * NH * T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = qkv.data() + (size_t(b) * T + t) * 3 * C + size_t(h) * hs;
        double dot = 0.0;
        for (int d = 0; d < hs; ++d) dot += double{q[d]} * q[C + d];
        const double p = saved[((size_t(b) * NH + h) * T + t) * T + t];
        want_lse[(size_t(b) * NH + h) * T + t] =
            static_cast<float>(dot / std::sqrt(double(hs)) - std::log(p));
      }
    }
  }
  EXPECT_TRUE(Close(at + "lse", dev_->Get(d_lse, want_lse.size()), want_lse, precision(), true));

  const auto dout = RandomVector(out.size(), 51);
  auto dqkv = RandomVector(qkv.size(), 52);
  const auto dqkv0 = dqkv;
  cpu_.AttentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                         saved.data(), B, T, C, NH, {});
  float* d_dqkv = dev_->Put(dqkv0);
  gpu().AttentionBackward(d_dqkv, d_scratch, dev_->Put(dout), d_qkv, d_out, d_lse, B, T, C, NH, {});
  const auto got = dev_->Get(d_dqkv, dqkv.size());
  // q, k and v gradients separately (their scales differ), the added-into
  // start subtracted.
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got_grad, want_grad;
    for (size_t row = 0; row < size_t(B) * T; ++row) {
      for (int c = 0; c < C; ++c) {
        const size_t i = row * 3 * C + size_t(part) * C + c;
        got_grad.push_back(got[i] - dqkv0[i]);
        want_grad.push_back(dqkv[i] - dqkv0[i]);
      }
    }
    EXPECT_TRUE(Close(at + "d" + "qkv"[part], got_grad, want_grad, precision(), true));
  }
  float* d_again = dev_->Put(dqkv0);
  gpu().AttentionBackward(d_again, d_scratch, dev_->Put(dout), d_qkv, d_out, d_lse, B, T, C, NH,
                          {});
  EXPECT_EQ(dev_->Get(d_again, got.size()), got) << at << "attention backward not deterministic";
}

// Decoding chunk by chunk through the caches equals the CPU twin's, and
// cache rows past the last position stay as they were.
TEST_P(GptCudaKernels, AttentionDecodeMatchesCpu) { CheckDecode(/*C=*/64, /*NH=*/4, ""); }

void GptCudaKernels::CheckDecode(int C, int NH, const std::string& name) {
  const int B = 2, maxT = 80;
  const auto k0 = RandomVector(size_t(B) * maxT * C, 25), v0 = RandomVector(k0.size(), 26);
  std::vector<float> kc = k0, vc = v0;
  float *d_kc = dev_->Put(k0), *d_vc = dev_->Put(v0);
  int past = 0;
  for (const int T : {37, 1, 33, 2}) {
    const std::string at = name + "C " + std::to_string(C) + " NH " + std::to_string(NH) +
                           " past " + std::to_string(past) + " T " + std::to_string(T) + " ";
    const auto qkv = RandomVector(size_t(B) * T * 3 * C, 27 + past);
    std::vector<float> out(size_t(B) * T * C), scratch(size_t(B) * NH * T * (past + T));
    cpu_.AttentionDecodeForward(out.data(), kc.data(), vc.data(), scratch.data(), qkv.data(), B, T,
                                past, maxT, C, NH);
    float* d_out = dev_->Zeros(out.size());
    float* d_scratch = dev_->Zeros(scratch.size());
    gpu().AttentionDecodeForward(d_out, d_kc, d_vc, d_scratch, dev_->Put(qkv), B, T, past, maxT, C,
                                 NH);
    EXPECT_TRUE(Close(at + "out", dev_->Get(d_out, out.size()), out, precision(), true));
    EXPECT_EQ(dev_->Get(d_kc, kc.size()), kc) << at << "k_cache";  // a copy: exact
    EXPECT_EQ(dev_->Get(d_vc, vc.size()), vc) << at << "v_cache";
    past += T;
  }
}

TEST_P(GptCudaKernels, Gelu) {
  const size_t n = 100003;
  const auto inp = RandomVector(n, 30, -6.0f, 6.0f), dout = RandomVector(n, 31);
  std::vector<float> out(n), dinp(n);
  cpu_.GeluForward(out.data(), inp.data(), n);
  cpu_.GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  const float* d_inp = dev_->Put(inp);
  float* d_out = dev_->Put(RandomVector(n, 32));  // overwritten
  gpu().GeluForward(d_out, d_inp, n);
  EXPECT_TRUE(Close("gelu out", dev_->Get(d_out, n), out, precision(), false));
  float* d_dinp = dev_->Put(RandomVector(n, 33));  // overwritten, not added into
  gpu().GeluBackward(d_dinp, d_inp, dev_->Put(dout), n);
  EXPECT_TRUE(Close("gelu dinp", dev_->Get(d_dinp, n), dinp, precision(), false));
  float* d_inplace = dev_->Put(dout);
  gpu().GeluBackward(d_inplace, d_inp, d_inplace, n);
  EXPECT_TRUE(Close("gelu dinp in place", dev_->Get(d_inplace, n), dinp, precision(), false));
}

TEST_P(GptCudaKernels, CrossEntropy) {
  for (const int V : {50, 1000, 5003}) {
    const int N = 37;
    const std::string at = "V" + std::to_string(V) + " ";
    const auto logits = RandomVector(size_t(N) * V, 34, -5.0f, 5.0f);
    auto targets = RandomIds(N, V, 35);
    targets[3] = targets[20] = -1;  // ignored positions
    const int32_t* d_targets = dev_->PutInts(targets);
    for (const bool write : {false, true}) {
      std::vector<float> z = logits, losses(N);
      cpu_.CrossEntropyForward(losses.data(), z.data(), targets.data(), N, V, 0.5f, write);
      float* d_z = dev_->Put(logits);
      float* d_losses = dev_->Put(RandomVector(N, 36));
      gpu().CrossEntropyForward(d_losses, d_z, d_targets, N, V, 0.5f, write);
      EXPECT_TRUE(AllClose(at + "losses", dev_->Get(d_losses, N), losses, 1e-6, 1e-3));
      const auto got = dev_->Get(d_z, z.size());
      if (write) {
        EXPECT_TRUE(AllClose(at + "dlogits", got, z, 1e-6, 1e-3));
      } else {
        EXPECT_EQ(got, logits) << at << "logits changed without write_dlogits";
      }
    }
  }
}

// The vocabulary-parallel pieces on a shard of rows / columns in the middle
// of the vocabulary, against the CPU twin.
TEST_P(GptCudaKernels, VocabularyShards) {
  const int B = 2, T = 37, C = 96, V = 50, N = B * T, begin = 13, rows = 20;
  const auto tokens = RandomIds(N, V, 40);
  const auto wte = RandomVector(size_t(rows) * C, 41), wpe = RandomVector(size_t(T) * C, 42);
  const int32_t* d_tokens = dev_->PutInts(tokens);
  for (bool with_wpe : {false, true}) {
    const std::string at = with_wpe ? "with wpe " : "";
    std::vector<float> out(size_t(N) * C);
    cpu_.EncoderShardForward(out.data(), tokens.data(), wte.data(), with_wpe ? wpe.data() : nullptr,
                             B, T, C, begin, rows);
    float* d_out = dev_->Zeros(out.size());
    gpu().EncoderShardForward(d_out, d_tokens, dev_->Put(wte), with_wpe ? dev_->Put(wpe) : nullptr,
                              B, T, C, begin, rows);
    EXPECT_TRUE(Close(at + "shard out", dev_->Get(d_out, out.size()), out, precision(), false));
  }
  const auto dout = RandomVector(size_t(N) * C, 43);
  auto dwte = RandomVector(wte.size(), 44), dwpe = RandomVector(wpe.size(), 45);
  float* d_dwte = dev_->Put(dwte);
  float* d_dwpe = dev_->Put(dwpe);
  cpu_.EncoderShardBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, begin,
                            rows);
  gpu().EncoderShardBackward(d_dwte, d_dwpe, dev_->Put(dout), d_tokens, B, T, C, begin, rows);
  EXPECT_TRUE(Close("shard dwte", dev_->Get(d_dwte, dwte.size()), dwte, precision(), false));
  EXPECT_TRUE(Close("shard dwpe", dev_->Get(d_dwpe, dwpe.size()), dwpe, precision(), false));

  const auto logits = RandomVector(size_t(N) * rows, 46, -5.0f, 5.0f);
  auto targets = RandomIds(N, V, 47);  // about 40% inside the shard
  targets[3] = -1;
  const int32_t* d_targets = dev_->PutInts(targets);
  std::vector<float> row_max(N), sums(2 * N);
  cpu_.CrossEntropyShardMax(row_max.data(), logits.data(), N, rows);
  float* d_logits = dev_->Put(logits);
  float* d_max = dev_->Zeros(N);
  gpu().CrossEntropyShardMax(d_max, d_logits, N, rows);
  EXPECT_EQ(dev_->Get(d_max, N), row_max) << "row max";
  for (float& m : row_max) m += 0.5f;  // as if another shard held a larger logit
  d_max = dev_->Put(row_max);
  cpu_.CrossEntropyShardSums(sums.data(), logits.data(), row_max.data(), targets.data(), N, rows,
                             begin);
  float* d_sums = dev_->Zeros(2 * N);
  gpu().CrossEntropyShardSums(d_sums, d_logits, d_max, d_targets, N, rows, begin);
  EXPECT_TRUE(AllClose("sums", dev_->Get(d_sums, 2 * N), sums, 1e-6, 1e-5));
  for (float& x : sums) x += 1.0f;  // the other shard's part
  d_sums = dev_->Put(sums);
  for (const bool write : {false, true}) {
    std::vector<float> z = logits, losses(N);
    cpu_.CrossEntropyShardFinish(losses.data(), z.data(), row_max.data(), sums.data(),
                                 targets.data(), N, rows, begin, 0.5f, write);
    float* d_z = dev_->Put(logits);
    float* d_losses = dev_->Zeros(N);
    gpu().CrossEntropyShardFinish(d_losses, d_z, d_max, d_sums, d_targets, N, rows, begin, 0.5f,
                                  write);
    EXPECT_TRUE(AllClose("shard losses", dev_->Get(d_losses, N), losses, 1e-6, 1e-5));
    EXPECT_TRUE(AllClose("shard dlogits", dev_->Get(d_z, z.size()), z, 1e-6, 1e-4));
  }
}

TEST_P(GptCudaKernels, SumOfSquaresAndAdamW) {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{1000}, (size_t{1} << 20) + 3}) {
    const auto x = RandomVector(n, 40);
    const double want = cpu_.SumOfSquares(x.data(), n);
    const float* d_x = dev_->Put(x);
    const double got = gpu().SumOfSquares(d_x, n);
    EXPECT_NEAR(got, want, 1e-6 * want) << "n " << n;
    EXPECT_EQ(gpu().SumOfSquares(d_x, n), got) << "n " << n << " not deterministic";
  }

  const size_t n = 10007;
  auto p = RandomVector(n, 41), m = RandomVector(n, 42, -0.1f, 0.1f),
       v = RandomVector(n, 43, 0.0f, 0.01f);
  const auto g = RandomVector(n, 44);
  const AdamWStep step{.lr = 1e-2f,
                       .beta1 = 0.9f,
                       .beta2 = 0.95f,
                       .eps = 1e-8f,
                       .weight_decay = 0.1f,
                       .bias_correction1 = 1.0f - 0.9f * 0.9f * 0.9f,
                       .bias_correction2 = 1.0f - 0.95f * 0.95f * 0.95f,
                       .grad_scale = 0.5f};
  float *d_p = dev_->Put(p), *d_m = dev_->Put(m), *d_v = dev_->Put(v);
  const float* d_g = dev_->Put(g);
  // The GPU update in two sub-ranges (a sharded update); the CPU in one.
  float *d_p2 = dev_->Put(p), *d_m2 = dev_->Put(m), *d_v2 = dev_->Put(v);
  cpu_.AdamWUpdate(p.data(), g.data(), m.data(), v.data(), n, step);
  gpu().AdamWUpdate(d_p, d_g, d_m, d_v, n, step);
  const size_t cut = 4099;
  gpu().AdamWUpdate(d_p2, d_g, d_m2, d_v2, cut, step);
  gpu().AdamWUpdate(d_p2 + cut, d_g + cut, d_m2 + cut, d_v2 + cut, n - cut, step);
  EXPECT_TRUE(Close("adamw p", dev_->Get(d_p, n), p, precision(), false));
  EXPECT_TRUE(Close("adamw m", dev_->Get(d_m, n), m, precision(), false));
  EXPECT_TRUE(Close("adamw v", dev_->Get(d_v, n), v, precision(), false));
  EXPECT_EQ(dev_->Get(d_p2, n), dev_->Get(d_p, n)) << "a sub-range update differs";

  // The loss scaler's overflow check through the CUDA twin's SumOfSquares.
  auto scaler = DynamicLossScaler::Create(LossScalerConfig{});
  ASSERT_TRUE(scaler.ok());
  std::vector<float> grads = RandomVector(5000, 45);
  EXPECT_TRUE(scaler->Check(&gpu(), dev_->Put(grads), grads.size()).apply);
  grads[4321] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(scaler->Check(&gpu(), dev_->Put(grads), grads.size()).apply);
  EXPECT_EQ(scaler->scale(), 16384.0f);
}

std::string PrecisionParamName(const ::testing::TestParamInfo<Precision>& info) {
  return std::string(PrecisionName(info.param));
}

INSTANTIATE_TEST_SUITE_P(Precisions, GptCudaKernels,
                         ::testing::Values(Precision::kFp32, Precision::kBf16, Precision::kFp16),
                         PrecisionParamName);

// ---- a whole GptModel step: CUDA vs CPU ------------------------------------------------------

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch MakeBatch(int B, int T, int V, uint32_t seed) {
  Batch b;
  b.tokens = RandomIds(size_t(B) * T + 1, V, seed);
  b.targets.assign(b.tokens.begin() + 1, b.tokens.end());  // next-token prediction
  b.tokens.pop_back();
  b.targets[5] = -1;  // a position without a target
  return b;
}

GptConfig ModelConfig(bool recompute, float dropout = 0.0f) {
  GptConfig c;
  c.hidden_dropout_prob = dropout;
  c.attention_probs_dropout_prob = dropout;
  c.vocab_size = 67;
  c.max_position_embeddings = 80;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_layers = 2;
  c.use_recompute = recompute;
  c.seed = 11;
  return c;
}

class GptCudaModel : public ::testing::TestWithParam<Precision> {
 protected:
  // One step of ModelConfig(false, dropout) on CUDA against the CPU twin.
  void CheckStep(float dropout);
};

// Without and with dropout (FleetX's 0.1 everywhere: the same masks on both
// twins, so the comparison is as tight).
TEST_P(GptCudaModel, StepMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << kNoGpu;
  for (float dropout : {0.0f, 0.1f}) {
    SCOPED_TRACE(dropout > 0 ? "with dropout" : "without dropout");
    CheckStep(dropout);
  }
}

void GptCudaModel::CheckStep(float dropout) {
  const Precision precision = GetParam();
  const bool fp32 = precision == Precision::kFp32;
  const int B = 2, T = 70;  // three attention tiles, the last partial
  const GptConfig config = ModelConfig(false, dropout);
  const Batch batch = MakeBatch(B, T, config.vocab_size, 3);
  const std::vector<uint32_t> streams = {100, 101};
  const GptForwardOptions train{.dropout_seed = 42, .dropout_streams = streams};

  CpuBackend cpu_backend;
  CpuGptKernels cpu_kernels(nullptr);
  auto cpu = GptModel::Create(config, &cpu_backend, &cpu_kernels);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto compute = CreateGptCompute("cuda:0", precision, 1);
  ASSERT_TRUE(compute.ok()) << compute.status().ToString();
  auto gpu = GptModel::Create(config, compute->backend.get(), compute->kernels.get());
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  GptModel* models[2] = {cpu->get(), gpu->get()};

  float loss[2];
  std::vector<float> grads[2];
  for (int i = 0; i < 2; ++i) {
    models[i]->arena().ZeroGrad();
    auto l = models[i]->Forward(batch.tokens, batch.targets, B, T, train);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    loss[i] = *l;
    models[i]->Backward();
    grads[i] = models[i]->arena().GradsToHost();
  }
  if (fp32) {
    EXPECT_NEAR(loss[1], loss[0], 1e-4);
  } else {
    EXPECT_NEAR(loss[1], loss[0], 2e-2 * loss[0]);
  }
  const ParamArena& arena = models[0]->arena();
  for (size_t t = 0; t < arena.num_tensors(); ++t) {
    const std::string name = "grad " + arena.table()[t].name;
    const size_t off = arena.offset(t), len = arena.table()[t].shape.numel();
    std::span<const float> got(grads[1].data() + off, len), want(grads[0].data() + off, len);
    if (fp32) {
      EXPECT_TRUE(AllClose(name, got, want, 2e-5, 2e-3));
    } else {
      double peak = 0.0;
      for (float w : want) peak = std::max(peak, std::fabs(double{w}));
      EXPECT_TRUE(AllClose(name + " (normwise)", got, want, 1e-1 * peak, 1e-1));
    }
  }

  // Recompute on CUDA: bit-identical gradients (the twin is deterministic).
  auto recompute =
      GptModel::Create(ModelConfig(true, dropout), compute->backend.get(), compute->kernels.get());
  ASSERT_TRUE(recompute.ok());
  (*recompute)->arena().ZeroGrad();
  auto lr = (*recompute)->Forward(batch.tokens, batch.targets, B, T, train);
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ(*lr, loss[1]);
  (*recompute)->Backward();
  const auto grads_r = (*recompute)->arena().GradsToHost();
  ASSERT_EQ(grads_r.size(), grads[1].size());
  EXPECT_EQ(std::memcmp(grads_r.data(), grads[1].data(), grads_r.size() * sizeof(float)), 0)
      << "CUDA gradients with recompute differ from those without";

  // One AdamW step on each, then the loss of the updated models.
  AdamWConfig ac;
  ASSERT_TRUE(ac.Validate().ok());
  float after[2];
  for (int i = 0; i < 2; ++i) {
    AdamW adamw(&models[i]->arena(), models[i]->kernels(), ac, 1e-3f);
    adamw.Step();
    auto l = models[i]->Forward(batch.tokens, batch.targets, B, T, {.for_backward = false});
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    after[i] = *l;
  }
  EXPECT_NE(after[0], loss[0]);  // the step changed the model
  if (fp32) {
    EXPECT_NEAR(after[1], after[0], 1e-4);
  } else {
    EXPECT_NEAR(after[1], after[0], 2e-2 * after[0]);
  }
}

// LoRA on CUDA (frozen weights: null parameter gradients in the CUDA
// twin's matmul and LayerNorm backward; the adapters through the CUDA
// backend's GEMMs): loss and adapter gradients against the CPU's.
TEST_P(GptCudaModel, LoraStepMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << kNoGpu;
  const Precision precision = GetParam();
  const bool fp32 = precision == Precision::kFp32;
  const int B = 2, T = 70;
  GptConfig config = ModelConfig(false);
  config.lora = {.rank = 4, .alpha = 8, .targets = {true, true, true, true}};
  const Batch batch = MakeBatch(B, T, config.vocab_size, 4);
  CpuBackend cpu_backend;
  CpuGptKernels cpu_kernels(nullptr);
  auto cpu = GptModel::Create(config, &cpu_backend, &cpu_kernels);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto compute = CreateGptCompute("cuda:0", precision, 1);
  ASSERT_TRUE(compute.ok()) << compute.status().ToString();
  auto gpu = GptModel::Create(config, compute->backend.get(), compute->kernels.get());
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  GptModel* models[2] = {cpu->get(), gpu->get()};
  // B away from its zero start, so that every adapter has a gradient.
  std::vector<float> adapters = models[0]->trainable_arena().ParamsToHost();
  for (size_t i = 0; i < adapters.size(); ++i) adapters[i] = 0.05f * std::sin(0.37f * float(i));
  float loss[2];
  std::vector<float> grads[2];
  for (int i = 0; i < 2; ++i) {
    ASSERT_FALSE(models[i]->arena().has_grads());
    ASSERT_TRUE(models[i]->trainable_arena().ParamsFromHost(adapters).ok());
    models[i]->trainable_arena().ZeroGrad();
    auto l = models[i]->Forward(batch.tokens, batch.targets, B, T);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    loss[i] = *l;
    models[i]->Backward();
    grads[i] = models[i]->trainable_arena().GradsToHost();
  }
  EXPECT_NEAR(loss[1], loss[0], fp32 ? 1e-4 : 2e-2 * loss[0]);
  const ParamArena& arena = models[0]->trainable_arena();
  for (size_t t = 0; t < arena.num_tensors(); ++t) {
    const std::string name = "grad " + arena.table()[t].name;
    const size_t off = arena.offset(t), len = arena.table()[t].shape.numel();
    std::span<const float> got(grads[1].data() + off, len), want(grads[0].data() + off, len);
    double peak = 0.0;
    for (float w : want) peak = std::max(peak, std::fabs(double{w}));
    EXPECT_GT(peak, 0.0) << name;
    if (fp32) {
      EXPECT_TRUE(AllClose(name, got, want, 2e-5, 2e-3));
    } else {
      EXPECT_TRUE(AllClose(name + " (normwise)", got, want, 1e-1 * peak, 1e-1));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GptCudaModel,
                         ::testing::Values(Precision::kFp32, Precision::kBf16), PrecisionParamName);

}  // namespace
}  // namespace fleet::trainer
