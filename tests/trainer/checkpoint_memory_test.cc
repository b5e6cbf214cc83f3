// Saving a checkpoint streams the parameters and optimizer state to the file:
// the process's peak memory grows by a bounded buffer, not by another copy
// of the model (a 10B model's would be 40 GB). Its own binary, because the
// peak resident size it reads (getrusage's ru_maxrss) is the process's.
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/optimizer.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {
namespace {

int64_t PeakResidentBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t{usage.ru_maxrss} * 1024;
}

TEST(CheckpointMemoryTest, SavingAddsNoCopyOfTheModel) {
  constexpr int64_t kFloats = int64_t{32} << 20;  // 128 MiB of parameters
  CpuBackend backend;
  auto arena = ParamArena::Create({{"w", Shape({kFloats})}}, &backend);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  // Touch every page, so the parameters are resident before the baseline.
  backend.Fill(arena->params().data(), arena->size(), 0.5f);
  auto sgd = CreateOptimizer({.type = "sgd", .lr = 0.1f}, &*arena);
  ASSERT_TRUE(sgd.ok()) << sgd.status().ToString();

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fleet_ckpt_mem_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "ckpt.bin").string();
  const int64_t before = PeakResidentBytes();
  const Status saved = SaveCheckpoint(path, *arena, **sgd);
  const int64_t growth = PeakResidentBytes() - before;
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  EXPECT_EQ(std::filesystem::file_size(path), kFloats * sizeof(float) + 64)
      << "header + parameters + CRC";

  // The round trip still holds.
  backend.Fill(arena->params().data(), arena->size(), 0.0f);
  ASSERT_TRUE(LoadCheckpoint(path, &*arena, sgd->get()).ok());
  EXPECT_EQ(arena->params().data()[kFloats - 1], 0.5f);
  std::filesystem::remove_all(dir);

  // A copy of the parameters would add 128 MiB; the writer's buffer is 1 MiB.
  EXPECT_LT(growth, int64_t{16} << 20) << "peak grew by " << growth << " bytes while saving";
}

}  // namespace
}  // namespace fleet::trainer
