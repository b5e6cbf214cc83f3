// Dropout's CUDA kernels on the CPU emulation of CUDA (cuda_emulation.h):
// the element-wise kernel (gpt_cuda_dropout.cu) and the tile attention
// kernels with attention dropout (gpt_cuda_attention_tiles.cu), against the
// oracle (gpt_ref_kernels.h) with the same DropoutSpec. The masks come from
// one generator (philox.h), so the dropped elements must be the oracle's
// exactly; the values agree within float rounding (float tiles) or the
// 16-bit tiles' rounding. Their warp shuffles, shared memory and barriers
// run as fibers here on every build; on a GPU trainer_gpt_cuda_kernels_test
// compares the same kernels with the CPU twin.
//
// The kernel sources are compiled here by the host compiler
// (FLEET_CUDA_EMULATION, from the fleet_cuda_emulation target).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/gpt_cuda_attention_tiles.cu"
#include "trainer/kernels/gpt_cuda_dropout.cu"
#include "trainer/kernels/gpt_cuda_dropout_args.h"
#include "trainer/kernels/gpt_ref_kernels.h"

namespace fleet::trainer::cuda::gpt {
namespace {

using trainer::testing::AllClose;
using trainer::testing::RandomVector;
namespace ref = trainer::kernels::gpt_ref;

TEST(GptCudaDropoutEmulated, ElementWiseMatchesTheOracle) {
  const std::vector<uint32_t> streams = {8, 1u << 31, 77};
  for (auto [B, n] : {std::pair{1, size_t{1}}, {3, size_t{6}}, {2, size_t{1027}}}) {
    DropoutSpec d;
    d.p = 0.25f;
    d.seed = 0xabcdef;
    d.site = 9;
    d.streams = streams.data();
    const auto inp = RandomVector(B * n, 1), residual = RandomVector(B * n, 2);
    std::vector<float> got(B * n, NAN), want(B * n);
    ASSERT_EQ(
        DropoutForward(got.data(), inp.data(), residual.data(), B, n, DropoutArgsOf(d), nullptr),
        cudaSuccess);
    ref::DropoutForward(want.data(), inp.data(), residual.data(), B, n, d);
    const std::string at = " B" + std::to_string(B) + " n" + std::to_string(n);
    EXPECT_TRUE(AllClose("forward" + at, got, want, 1e-7, 1e-6));
    std::vector<float> grad = inp;
    ASSERT_EQ(DropoutBackward(grad.data(), grad.data(), B, n, DropoutArgsOf(d), nullptr),
              cudaSuccess);
    ref::DropoutBackward(want.data(), inp.data(), B, n, d);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(grad[i] == 0.0f, want[i] == 0.0f) << "mask differs at " << i << at;
    }
    EXPECT_TRUE(AllClose("backward" + at, grad, want, 1e-7, 1e-6));
  }
}

struct Shape {
  int B, T, C, NH;
};

// Forward (out, and lse through the backward) and backward of the tile
// kernels with dropout against the oracle's; head sizes 16 and 40 (one and
// two output dimensions per lane), T across a tile boundary, heads offset
// as a tensor-parallel rank's.
TEST(GptCudaDropoutEmulated, TileAttentionMatchesTheOracle) {
  const std::vector<uint32_t> streams = {21, 22};
  for (const Shape& s : {Shape{2, 35, 32, 2}, Shape{1, 20, 80, 2}}) {
    for (TileType tile : {TileType::kFloat, TileType::kBf16}) {
      DropoutSpec d;
      d.p = 0.2f;
      d.seed = 1234;
      d.site = 1;
      d.streams = streams.data();
      d.head_offset = 4;
      const int B = s.B, T = s.T, C = s.C, NH = s.NH;
      const auto qkv = RandomVector(size_t(B) * T * 3 * C, 3, -2.0f, 2.0f);
      const auto dout = RandomVector(size_t(B) * T * C, 4);
      std::vector<float> want(size_t(B) * T * C), saved(size_t(B) * NH * T * T),
          scratch(saved.size()), dwant(size_t(B) * T * 3 * C, 0.0f);
      ref::AttentionForward(want.data(), saved.data(), qkv.data(), B, T, C, NH, d);
      ref::AttentionBackward(dwant.data(), scratch.data(), dout.data(), qkv.data(), saved.data(), B,
                             T, C, NH, d);

      std::vector<float> out(want.size(), NAN), lse(size_t(B) * NH * T, NAN);
      AttentionArgs a{out.data(), lse.data(), nullptr, qkv.data(), nullptr,
                      nullptr,    nullptr,    nullptr, B,          T,
                      C,          NH,         0,       T,          DropoutArgsOf(d)};
      ASSERT_EQ(TileAttention(false, a, tile, nullptr), cudaSuccess);
      const double tol = tile == TileType::kFloat ? 1e-5 : 3e-2;
      const std::string at = std::string(tile == TileType::kFloat ? "float" : "bf16") + " T" +
                             std::to_string(T) + " C" + std::to_string(C);
      EXPECT_TRUE(AllClose("out " + at, out, want, tol, tol));

      std::vector<float> dqkv(dwant.size(), 0.0f), dots(lse.size(), NAN);
      AttentionArgs back{dqkv.data(), dots.data(), dout.data(), qkv.data(), out.data(),
                         lse.data(),  nullptr,     nullptr,     B,          T,
                         C,           NH,          0,           T,          DropoutArgsOf(d)};
      ASSERT_EQ(TileAttention(true, back, tile, nullptr), cudaSuccess);
      EXPECT_TRUE(AllClose("dqkv " + at, dqkv, dwant, 10 * tol, 10 * tol));
    }
  }
}

}  // namespace
}  // namespace fleet::trainer::cuda::gpt
