// Trainer checkpoints under a failing disk (comm/file_system.h's
// FaultInjectionFileSystem): a save that fails at any write, sync, close or
// rename, or runs out of space midway, leaves the previous checkpoint
// loadable and byte-for-byte intact with no temporary file behind; a torn
// checkpoint file is refused with Corruption naming it, never loaded.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/file_system.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/optimizer.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {
namespace {

using ::testing::HasSubstr;
using Op = FaultInjectionFileSystem::Op;

// Parameters and Adam state that change with every step.
struct Model {
  Model() {
    arena = std::make_unique<ParamArena>(
        ParamArena::Create({{"w", Shape{{16, 8}}}, {"b", Shape{{8}}}}, &backend).value());
    optimizer = CreateOptimizer({.type = "adam", .lr = 0.01f}, arena.get()).value();
  }
  void Step(int i) {
    std::vector<float> g(arena->size());
    for (size_t k = 0; k < g.size(); ++k) g[k] = 0.1f * static_cast<float>((k * 7 + i) % 13) - 0.6f;
    std::copy(g.begin(), g.end(), arena->grads().data());
    optimizer->Step();
  }
  CpuBackend backend;
  std::unique_ptr<ParamArena> arena;
  std::unique_ptr<Optimizer> optimizer;
};

class CheckpointFaultTest : public ::testing::Test {
 protected:
  CheckpointFaultTest()
      : dir_(std::filesystem::temp_directory_path() /
             ("fleet_ckpt_fault_" + std::to_string(::getpid()))),
        path_((dir_ / "ckpt.bin").string()) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~CheckpointFaultTest() override { std::filesystem::remove_all(dir_); }

  std::string Bytes() { return posix_.ReadFile(path_).value(); }
  std::vector<std::string> Listing() {
    std::vector<std::string> names = posix_.ListDir(dir_.string()).value();
    std::sort(names.begin(), names.end());
    return names;
  }
  // Loads path_ into a fresh model and returns its parameters and step.
  std::pair<std::vector<float>, int64_t> Loaded() {
    Model fresh;
    const Status st = LoadCheckpoint(path_, fresh.arena.get(), fresh.optimizer.get());
    EXPECT_TRUE(st.ok()) << st.ToString();
    return {fresh.arena->ParamsToHost(), fresh.optimizer->step()};
  }

  PosixFileSystem posix_;
  const std::filesystem::path dir_;
  const std::string path_;
};

// How many calls of `op` one save makes.
int CallsPerSave(Op op, const std::string& path) {
  Model m;
  FaultInjectionFileSystem counting(DefaultFileSystem());
  CHECK(SaveCheckpoint(path, *m.arena, *m.optimizer, &counting).ok());
  return counting.calls(op);
}

TEST_F(CheckpointFaultTest, FailedSaveLeavesThePreviousCheckpointIntact) {
  Model model;
  model.Step(0);
  ASSERT_TRUE(SaveCheckpoint(path_, *model.arena, *model.optimizer).ok());
  const std::string saved = Bytes();
  const std::vector<float> saved_params = model.arena->ParamsToHost();

  int injected = 0;
  for (Op op : {Op::kCreate, Op::kAppend, Op::kSync, Op::kClose, Op::kRename}) {
    const int calls = CallsPerSave(op, (dir_ / "probe.bin").string());
    std::filesystem::remove(dir_ / "probe.bin");
    ASSERT_GT(calls, 0) << static_cast<int>(op);
    for (int nth = 1; nth <= calls; ++nth) {
      SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(op) << " call " << nth);
      model.Step(nth);  // the model moves on; the save of it fails
      FaultInjectionFileSystem faulty(&posix_);
      faulty.FailNth(op, nth);
      const Status st = SaveCheckpoint(path_, *model.arena, *model.optimizer, &faulty);
      ASSERT_TRUE(st.IsIOError()) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("injected"));
      EXPECT_EQ(Listing(), std::vector<std::string>{"ckpt.bin"});
      EXPECT_EQ(Bytes(), saved);
      const auto [params, step] = Loaded();
      EXPECT_EQ(params, saved_params);
      EXPECT_EQ(step, 1);
      ++injected;
    }
  }
  EXPECT_GE(injected, 5);
}

TEST_F(CheckpointFaultTest, DiskFullMidwayLeavesThePreviousCheckpointIntact) {
  Model model;
  model.Step(0);
  ASSERT_TRUE(SaveCheckpoint(path_, *model.arena, *model.optimizer).ok());
  const std::string saved = Bytes();
  model.Step(1);
  // No room at all, room for part of the header, for part of the data, and
  // for all but the last byte (the checksum's).
  for (int64_t space : {int64_t{0}, int64_t{10}, static_cast<int64_t>(saved.size() / 2),
                        static_cast<int64_t>(saved.size() - 1)}) {
    SCOPED_TRACE(::testing::Message() << space << " bytes free");
    FaultInjectionFileSystem full(&posix_);
    full.SetSpaceLeft(space);
    const Status st = SaveCheckpoint(path_, *model.arena, *model.optimizer, &full);
    ASSERT_TRUE(st.IsIOError()) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("no space left on device"));
    EXPECT_THAT(st.message(), HasSubstr(path_ + ".tmp"));
    EXPECT_EQ(Listing(), std::vector<std::string>{"ckpt.bin"});
    EXPECT_EQ(Bytes(), saved);
    EXPECT_EQ(Loaded().second, 1);
  }
  // With room enough the same save goes through.
  FaultInjectionFileSystem roomy(&posix_);
  roomy.SetSpaceLeft(static_cast<int64_t>(saved.size()));
  ASSERT_TRUE(SaveCheckpoint(path_, *model.arena, *model.optimizer, &roomy).ok());
  EXPECT_EQ(Loaded().second, 2);
  EXPECT_EQ(Loaded().first, model.arena->ParamsToHost());
}

// A failed directory sync comes after the rename: the new checkpoint is in
// place (and loads) but the save says it may not survive a crash.
TEST_F(CheckpointFaultTest, FailedDirectorySyncReportsTheSaveAsFailed) {
  Model model;
  model.Step(0);
  FaultInjectionFileSystem faulty(&posix_);
  faulty.FailNth(Op::kSyncDir, 1);
  const Status st = SaveCheckpoint(path_, *model.arena, *model.optimizer, &faulty);
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_EQ(Listing(), std::vector<std::string>{"ckpt.bin"});
  EXPECT_EQ(Loaded().first, model.arena->ParamsToHost());
}

// A process killed in the middle of a save leaves its torn temporary file;
// the checkpoint it would have replaced still loads. The torn bytes, put
// where the checkpoint belongs (a copy cut short, a file system that lost
// the tail), are refused as Corruption naming the file, and the model that
// tried to load them keeps its parameters and step.
TEST_F(CheckpointFaultTest, TornFileIsRefusedNotLoaded) {
  Model model;
  model.Step(0);
  ASSERT_TRUE(SaveCheckpoint(path_, *model.arena, *model.optimizer).ok());
  const std::string saved = Bytes();
  model.Step(1);
  {
    FaultInjectionFileSystem dying(&posix_);
    dying.DieAtNth(Op::kAppend, 2);  // after the header, in the parameters
    ASSERT_FALSE(SaveCheckpoint(path_, *model.arena, *model.optimizer, &dying).ok());
  }
  EXPECT_EQ(Listing(), (std::vector<std::string>{"ckpt.bin", "ckpt.bin.tmp"}));
  EXPECT_EQ(Bytes(), saved);
  EXPECT_EQ(Loaded().second, 1);
  const std::string torn = posix_.ReadFile(path_ + ".tmp").value();
  ASSERT_LT(torn.size(), saved.size());

  Model other;
  const std::vector<float> before = other.arena->ParamsToHost();
  // The killed save's bytes, and cuts of a good file at the header, in the
  // data and just before the checksum.
  for (const std::string& bytes :
       {torn, saved.substr(0, 20), saved.substr(0, saved.size() / 2), saved.substr(0, saved.size() - 1)}) {
    SCOPED_TRACE(::testing::Message() << bytes.size() << " of " << saved.size() << " bytes");
    ASSERT_TRUE(WriteFileAtomically(path_, bytes, &posix_).ok());
    for (bool params_only : {false, true}) {
      const Status st = params_only
                            ? LoadCheckpointParams(path_, other.arena.get(), &posix_)
                            : LoadCheckpoint(path_, other.arena.get(), other.optimizer.get(), &posix_);
      EXPECT_TRUE(st.IsCorruption()) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("checksum mismatch (truncated or damaged)"));
      EXPECT_THAT(st.message(), HasSubstr(path_));
      EXPECT_EQ(other.arena->ParamsToHost(), before);
      EXPECT_EQ(other.optimizer->step(), 0);
    }
  }
}

}  // namespace
}  // namespace fleet::trainer
