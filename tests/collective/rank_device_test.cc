// ResolveRankDevice (collective/rank_setup.h): which device a
// training rank takes from its config, the launcher's assignment, the job's
// size and the GPUs it can see; and that a machine without a GPU gets an
// error saying so when the config asks for one.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "trainer/backend.h"
#include "collective/rank_setup.h"
#include "trainer/kernels/backend_factory.h"

namespace fleet::trainer::collective {
namespace {

bool Mentions(const Status& status, const std::string& text) {
  return status.ToString().find(text) != std::string::npos;
}

TEST(ResolveRankDevice, CpuConfigTrainsOnTheCpuWhateverTheRankWasGiven) {
  for (const std::optional<std::string>& assigned :
       {std::optional<std::string>(), std::optional<std::string>("cuda:1")}) {
    auto device = ResolveRankDevice(false, assigned, 4, 0);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    EXPECT_EQ(*device, "cpu");
  }
}

TEST(ResolveRankDevice, OneProcessWithoutLauncherTakesTheFirstGpu) {
  auto device = ResolveRankDevice(true, std::nullopt, 1, 2);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  EXPECT_EQ(*device, "cuda:0");
}

TEST(ResolveRankDevice, AssignedGpuWinsInEverySpelling) {
  const std::pair<std::string, std::string> cases[] = {
      {"cuda:1", "cuda:1"}, {"gpu:1", "cuda:1"}, {"cuda", "cuda:0"}, {"gpu", "cuda:0"}};
  for (const auto& [given, want] : cases) {
    auto device = ResolveRankDevice(true, given, 2, 2);
    ASSERT_TRUE(device.ok()) << given << ": " << device.status().ToString();
    EXPECT_EQ(*device, want) << given;
  }
}

TEST(ResolveRankDevice, GpuConfigOnACpuRankIsRefused) {
  auto device = ResolveRankDevice(true, std::string("cpu"), 1, 1);
  ASSERT_FALSE(device.ok());
  EXPECT_TRUE(device.status().IsInvalidArgument()) << device.status().ToString();
  EXPECT_TRUE(Mentions(device.status(), "Global.device=cpu")) << device.status().ToString();
}

TEST(ResolveRankDevice, SeveralRanksWithoutAssignedGpusAreRefused) {
  auto device = ResolveRankDevice(true, std::nullopt, 4, 8);
  ASSERT_FALSE(device.ok());
  EXPECT_TRUE(device.status().IsInvalidArgument()) << device.status().ToString();
  EXPECT_TRUE(Mentions(device.status(), "fleetrun --gpus")) << device.status().ToString();
}

TEST(ResolveRankDevice, MissingGpuIsUnavailableNamingIt) {
  auto none = ResolveRankDevice(true, std::nullopt, 1, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(none.status().IsUnavailable()) << none.status().ToString();
  EXPECT_TRUE(Mentions(none.status(), "cuda:0")) << none.status().ToString();
  EXPECT_TRUE(Mentions(none.status(), "Global.device=cpu")) << none.status().ToString();

  auto past_end = ResolveRankDevice(true, std::string("cuda:3"), 1, 2);
  ASSERT_FALSE(past_end.ok());
  EXPECT_TRUE(past_end.status().IsUnavailable()) << past_end.status().ToString();
  EXPECT_TRUE(Mentions(past_end.status(), "cuda:3")) << past_end.status().ToString();
  EXPECT_TRUE(Mentions(past_end.status(), "2 GPU")) << past_end.status().ToString();
}

// What gpt_pretrain decides here for `-c ..._single_card.yaml` started by hand:
// cuda:0 on a machine with a GPU, a clear error on one without.
TEST(ResolveRankDevice, ThisMachine) {
  const int gpus = CudaDeviceCount();
  auto device = ResolveRankDevice(true, std::nullopt, 1, gpus);
  if (gpus > 0) {
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    EXPECT_EQ(*device, "cuda:0");
  } else {
    ASSERT_FALSE(device.ok());
    EXPECT_TRUE(device.status().IsUnavailable()) << device.status().ToString();
    EXPECT_TRUE(Mentions(device.status(), "none that CUDA can use")) << device.status().ToString();
  }
}

}  // namespace
}  // namespace fleet::trainer::collective
