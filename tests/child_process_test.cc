// tests/child_process.h, the one way tests start processes: environment,
// output, groups, bounded waits, forked functions, shell commands; and a
// scan of tests/ that keeps it the only one.
#include "tests/child_process.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "tests/test_paths.h"

namespace fleet::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

class ChildProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fleet_child_process_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string File(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(ChildProcessTest, TheEnvironmentIsInheritedFilteredAndExtended) {
  setenv("FLEET_CHILD_KEEP", "kept", 1);
  setenv("FLEET_CHILD_DROP", "dropped", 1);
  const std::string out = File("env");
  Child child({"/usr/bin/env"}, ChildOptions{.env = {"FLEET_CHILD_ADDED=added"},
                                             .drop_env_prefixes = {"FLEET_CHILD_DROP"},
                                             .stdout_file = out});
  const Exit exit = child.Wait(seconds(30));
  ASSERT_TRUE(exit.exited && exit.code == 0) << exit.ShellCode();
  const std::string env = ReadAll(out);
  EXPECT_NE(env.find("FLEET_CHILD_KEEP=kept\n"), std::string::npos) << env;
  EXPECT_NE(env.find("FLEET_CHILD_ADDED=added\n"), std::string::npos) << env;
  EXPECT_EQ(env.find("FLEET_CHILD_DROP"), std::string::npos) << env;

  // The log form: `env` is the whole environment, both streams in one file.
  const std::string log = File("log");
  Child alone({"/bin/sh", "-c", "env; echo to-stderr >&2"}, {"ONLY=this"}, log);
  ASSERT_EQ(alone.Wait(seconds(30)).code, 0);
  const std::string text = ReadAll(log);
  EXPECT_NE(text.find("ONLY=this"), std::string::npos) << text;
  EXPECT_EQ(text.find("FLEET_CHILD_KEEP"), std::string::npos) << text;
  EXPECT_NE(text.find("to-stderr"), std::string::npos) << text;
}

TEST_F(ChildProcessTest, AWaitPastItsBoundKillsTheWholeGroup) {
  // The shell starts a grandchild in the same group and records its pid.
  const std::string pid_file = File("grandchild");
  Child child({"/bin/sh", "-c", "sleep 60 & echo $! > " + pid_file + "; wait"},
              ChildOptions{.own_process_group = true});
  for (int i = 0; i < 500 && ReadAll(pid_file).empty(); ++i) std::this_thread::sleep_for(milliseconds(10));
  const pid_t grandchild = std::atoi(ReadAll(pid_file).c_str());
  ASSERT_GT(grandchild, 0);
  const Exit exit = child.Wait(milliseconds(200));
  EXPECT_TRUE(exit.timed_out);
  EXPECT_EQ(exit.signal, SIGKILL);
  EXPECT_LT(exit.seconds, 10);
  // The grandchild (reparented, so not ours to reap) is gone too.
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string ignored, state;
    gone = !(stat >> ignored >> ignored >> state) || state == "Z";
    if (!gone) std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(gone) << "grandchild " << grandchild << " survived";
}

TEST_F(ChildProcessTest, AForkedFunctionExitsWithItsValueAndPipesCarryOutput) {
  int hook_ran = 0;
  Child child = Child::Fork(
      [&hook_ran] {
        std::printf("out %d\n", hook_ran);
        std::fflush(stdout);
        return 7;
      },
      ChildOptions{.pipe_output = true, .in_child = [&hook_ran] { hook_ran = 1; }});
  const Exit exit = child.Wait(seconds(30));
  EXPECT_TRUE(exit.exited);
  EXPECT_EQ(exit.code, 7);
  char buf[32] = {};
  EXPECT_EQ(read(child.out_fd(), buf, sizeof(buf) - 1), 6);
  EXPECT_STREQ(buf, "out 1\n");
  EXPECT_EQ(hook_ran, 0) << "the hook runs in the child only";
}

TEST_F(ChildProcessTest, AProgramThatCannotStartFailsTheTestNamingIt) {
  EXPECT_NONFATAL_FAILURE(
      {
        Child child({File("no-such-program")}, ChildOptions{});
        EXPECT_EQ(child.Wait(seconds(30)).code, 127);
      },
      "no-such-program: No such file or directory");
}

TEST_F(ChildProcessTest, RunCommandReturnsTheCodeAndBothStreams) {
  const CommandResult run = RunCommand("echo out; echo err >&2; exit 3");
  EXPECT_EQ(run.exit_code, 3);
  EXPECT_EQ(run.output, "out\nerr\n");
  EXPECT_NONFATAL_FAILURE(EXPECT_EQ(RunCommand("sleep 30", milliseconds(100)).exit_code, -1),
                          "did not finish within 100 ms");
}

// Only this header (and launch_fixture, the program whose own children are
// under test) starts processes in tests/.
TEST(ChildProcessScanTest, NoOtherTestStartsProcessesItsOwnWay) {
  const std::regex spawn(R"(\b(fork|vfork|posix_spawnp?|popen|execve?|execvp)\s*\(|\bsystem\s*\()");
  const fs::path tests = fs::path(SourceDir()) / "tests";
  std::string offenders;
  for (const auto& entry : fs::recursive_directory_iterator(tests)) {
    const std::string ext = entry.path().extension();
    if (ext != ".cc" && ext != ".h") continue;
    const std::string rel = fs::relative(entry.path(), tests).string();
    if (rel == "child_process.h" || rel == "child_process_test.cc" || rel == "launch/fixtures/launch_fixture.cc") {
      continue;
    }
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      const std::string code = line.substr(0, line.find("//"));
      if (std::regex_search(code, spawn)) offenders += "tests/" + rel + ":" + std::to_string(n) + ": " + line + "\n";
    }
  }
  EXPECT_EQ(offenders, "") << "start processes through tests/child_process.h";
}

}  // namespace
}  // namespace fleet::testing
