// mnist_mlp as real processes, where process death is the point: a rank
// killed mid-training makes the surviving rank fail within its collective
// timeout with an error naming itself and the operation, and fleetrun exits
// non-zero naming the dead rank. Also one clean 2-rank run under fleetrun.
// Binaries come from FLEET_BIN_DIR (set by fleet_add_test); every process
// runs on free ports with a bounded wait.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/child_process.h"
#include "tests/collective/mnist_test_data.h"
#include "tests/comm/collective_test_util.h"

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::BinPath;
using testing::Child;
using testing::Exit;
using testing::ReadAll;

class MnistProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("mnist_process_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    files_ = testing::WriteIdxFiles(testing::SyntheticMnist(2048, 256), dir_.string());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // mnist_mlp and its flags for the synthetic data.
  std::vector<std::string> MnistArgs(std::vector<std::string> extra) const {
    std::vector<std::string> args = {BinPath("mnist_mlp"),
                                     "--train_images=" + files_.train_images,
                                     "--train_labels=" + files_.train_labels,
                                     "--test_images=" + files_.test_images,
                                     "--test_labels=" + files_.test_labels,
                                     "--blas_threads=1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  std::filesystem::path dir_;
  data::MnistFiles files_;
};

// sklearn's digits are 8x8 IDX files: the input width comes from the data,
// the hidden widths from --hidden, and the run learns them.
TEST_F(MnistProcessTest, TrainsEightByEightImagesWithHiddenFromTheFlag) {
  const data::MnistFiles small =
      testing::WriteIdxFiles(testing::SyntheticMnist(1024, 256, 3, /*side=*/8), dir_.string());
  Child rank({BinPath("mnist_mlp"), "--train_images=" + small.train_images,
              "--train_labels=" + small.train_labels, "--test_images=" + small.test_images,
              "--test_labels=" + small.test_labels, "--blas_threads=1", "--hidden=32,16",
              "--epochs=3", "--batch_size=32", "--lr=0.01", "--log_every_steps=0"},
             {"PATH=/usr/bin:/bin"}, (dir_ / "digits.log").string());
  const Exit exit = rank.Wait(milliseconds(60000));
  const std::string out = ReadAll(dir_ / "digits.log");
  ASSERT_TRUE(exit.exited && exit.code == 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(epoch: 2, test_accuracy: ([0-9.]+))"))) << out;
  // 10 classes: chance is 0.1; the hidden linear map is learnable.
  EXPECT_GT(std::stod(m[1]), 0.5) << out;
}

// Data the model cannot take is the user's input: exit 2 with the reason,
// as examples/mnist_mlp/README.md promises.
TEST_F(MnistProcessTest, BadDataExitsTwoNamingTheProblem) {
  const std::string digits_dir = (dir_ / "digits").string();
  std::filesystem::create_directories(digits_dir);
  const data::MnistFiles small =
      testing::WriteIdxFiles(testing::SyntheticMnist(64, 64, 3, /*side=*/8), digits_dir);
  const std::string garbage = (dir_ / "garbage").string();
  std::ofstream(garbage) << "not an IDX file";
  struct Case {
    std::string name;
    std::vector<std::string> flags;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"mixed sizes", {"--test_images=" + small.test_images, "--test_labels=" + small.test_labels},
       "training and test images differ in size"},
      {"garbage", {"--train_images=" + garbage}, "garbage"},
      {"bad hidden", {"--hidden=128,x"}, "--hidden"},
      {"too few samples", {"--max_train_samples=10"}, "too few training samples"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> flags = c.flags;
    flags.push_back("--epochs=1");
    Child rank(MnistArgs(flags), {"PATH=/usr/bin:/bin"}, (dir_ / "bad.log").string());
    const Exit exit = rank.Wait(milliseconds(60000));
    const std::string out = ReadAll(dir_ / "bad.log");
    EXPECT_TRUE(exit.exited && exit.code == 2) << out;
    EXPECT_NE(out.find(c.want), std::string::npos) << out;
  }
}

// Two ranks started by hand (the environment fleetrun would give them);
// rank 1 SIGKILLs itself after step 5. Rank 0 must exit 1 with an error
// naming itself and the all-reduce: over Gloo within its collective
// timeout, over shared memory at once (the group sees the pid is gone).
class MnistKilledRankTest : public MnistProcessTest,
                            public ::testing::WithParamInterface<std::string> {};

TEST_P(MnistKilledRankTest, MakesTheOtherFailNamingTheAllReduce) {
  const std::string collective = GetParam();
  testing::LocalKvServer kv;
  const int timeout_ms = 4000;
  std::vector<std::unique_ptr<Child>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<std::string> env = {
        "FLEET_ROLE=collective", "FLEET_RANK=" + std::to_string(rank), "FLEET_WORLD_SIZE=2",
        "FLEET_KV_ENDPOINT=" + kv.endpoint(), "FLEET_JOB_ID=crash", "FLEET_DEVICE=cpu"};
    ranks.push_back(std::make_unique<Child>(
        MnistArgs({"--epochs=50", "--debug_crash_at_step=5", "--debug_crash_rank=1",
                   "--cpu_collective=" + collective,
                   "--collective_timeout_ms=" + std::to_string(timeout_ms)}),
        env, (dir_ / ("rank" + std::to_string(rank) + ".log")).string()));
  }
  const Exit dead = ranks[1]->Wait(milliseconds(60000));
  const auto died = Clock::now();
  const Exit survivor = ranks[0]->Wait(milliseconds(60000));
  const double after_death = std::chrono::duration<double>(Clock::now() - died).count();
  const std::string log = ReadAll(dir_ / "rank0.log");

  EXPECT_EQ(dead.signal, SIGKILL) << ReadAll(dir_ / "rank1.log");
  ASSERT_FALSE(survivor.timed_out) << log;
  EXPECT_TRUE(survivor.exited) << log;
  EXPECT_EQ(survivor.code, 1) << log;
  EXPECT_NE(log.find("joined " + collective + " group mnist_mlp as rank 0 of 2"), std::string::npos)
      << log;
  EXPECT_LT(after_death, collective == "shm" ? 2.0 : timeout_ms / 1000.0 + 2.0) << log;
  const size_t at = log.rfind("mnist_mlp rank 0 of 2");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string error = log.substr(at, log.find('\n', at) - at);
  std::printf("%s: rank 0, %.2f s after rank 1 died: %s\n", collective.c_str(), after_death,
              error.c_str());
  EXPECT_NE(error.find("data parallel rank 0 of 2 (peer: rank 1)"), std::string::npos) << log;
  EXPECT_NE(error.find("all-reduce"), std::string::npos) << log;
  if (collective == "shm") {
    EXPECT_NE(error.find("exited before arriving"), std::string::npos) << log;
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, MnistKilledRankTest, ::testing::Values("gloo", "shm"));

// Under fleetrun: the job fails, fleetrun names the dead rank and exits 1.
TEST_F(MnistProcessTest, FleetrunExitsNonZeroWhenARankCrashes) {
  std::vector<std::string> args = {BinPath("fleetrun"), "--nproc_per_node=2", "--http_port=0",
                                   "--grace_period=2", "--log_dir=" + (dir_ / "logs").string()};
  const std::vector<std::string> mnist =
      MnistArgs({"--epochs=50", "--debug_crash_at_step=5", "--debug_crash_rank=1",
                 "--collective_timeout_ms=4000"});
  args.insert(args.end(), mnist.begin(), mnist.end());
  Child fleetrun(args, {"PATH=/usr/bin:/bin"}, (dir_ / "fleetrun.log").string());
  const Exit exit = fleetrun.Wait(milliseconds(60000));
  const std::string out = ReadAll(dir_ / "fleetrun.log");
  ASSERT_FALSE(exit.timed_out) << out;
  EXPECT_TRUE(exit.exited) << out;
  EXPECT_EQ(exit.code, 1) << out;
  EXPECT_NE(out.find("collective 1"), std::string::npos) << out;
  EXPECT_LT(exit.seconds, 30.0) << out;
}

// A clean 2-rank job under fleetrun prints the loss and accuracy lines and
// exits 0.
TEST_F(MnistProcessTest, FleetrunRunsTwoRanksToTheEnd) {
  std::vector<std::string> args = {BinPath("fleetrun"), "--nproc_per_node=2", "--http_port=0",
                                   "--log_dir=" + (dir_ / "logs").string()};
  const std::vector<std::string> mnist =
      MnistArgs({"--epochs=2", "--log_every_steps=8", "--checkpoint_dir=" + (dir_ / "ckpt").string(),
                 "--progress_every_s=0.001"});
  args.insert(args.end(), mnist.begin(), mnist.end());
  Child fleetrun(args, {"PATH=/usr/bin:/bin"}, (dir_ / "fleetrun.log").string());
  const Exit exit = fleetrun.Wait(milliseconds(60000));
  const std::string out = ReadAll(dir_ / "fleetrun.log");
  ASSERT_FALSE(exit.timed_out) << out;
  EXPECT_EQ(exit.code, 0) << out;
  // 2048 samples / 128 per step = 16 steps per epoch.
  EXPECT_NE(out.find("epoch: 0, step: 8, train_loss: "), std::string::npos) << out;
  EXPECT_NE(out.find("epoch: 1, step: 32, train_loss: "), std::string::npos) << out;
  EXPECT_NE(out.find("epoch: 1, test_accuracy: "), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "ckpt" / "mlp.ckpt"));
  // One node: the ranks meet over shared memory (--cpu_collective=auto).
  const std::string rank1 = ReadAll(dir_ / "logs" / "workerlog.1");
  EXPECT_NE(rank1.find("joined shm group mnist_mlp as rank 1 of 2"), std::string::npos) << rank1;
  // Every rank tells how far it is: its progress lines with ETAs (32 steps
  // last more than --progress_every_s), reported to fleetrun, which writes
  // them to metrics.jsonl and ends with the job's status line.
  EXPECT_TRUE(std::regex_search(rank1, std::regex(R"(mnist_mlp rank 1: step \d+/32 \(epoch \d: \d+/16\), [0-9.]+ steps/s, \d+ samples/s, eta epoch \d+s, job \d+s)")))
      << rank1;
  const std::string jsonl = ReadAll(dir_ / "logs" / "metrics.jsonl");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(jsonl.find("\"role\": \"collective\", \"rank\": " + std::to_string(rank) + ", \"step\": "),
              std::string::npos)
        << jsonl;
    EXPECT_NE(jsonl.find("\"role\": \"collective\", \"rank\": " + std::to_string(rank) +
                         ", \"event\": \"exited\", \"exit_code\": 0"),
              std::string::npos)
        << jsonl;
  }
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(fleetrun: job done, exit 0; 2 processes, 0 failed \(exit codes: collective 0 0, collective 1 0\); wall [0-9.]+ s; throughput \d+ samples/s)")))
      << out;
}

}  // namespace
}  // namespace fleet
