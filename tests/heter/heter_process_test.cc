// Heterogeneous jobs through the real programs (fleetrun, ps_server,
// ps_worker, heter_worker), where process death is the point: a heter
// worker killed with SIGKILL mid-run fails the job within 10 s, naming it,
// or with --max_restart is restarted and the job still reaches the AUC bar.
// FLEET_KEEP_TEST_DIR=1 keeps the logs in /tmp/fleet_heter_process_<pid>.
// The model is the small one of the in-process tests (dense dim 4321).
#include <gtest/gtest.h>
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

#include "tests/child_process.h"
#include "tests/test_paths.h"

namespace fleet {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using testing::ReadAll;

// fleetrun as a child process, its output (stdout and stderr) in a file.
class Fleetrun {
 public:
  // Its own process group, so a failed test can stop the whole job.
  Fleetrun(const std::vector<std::string>& args, const fs::path& output)
      : output_(output),
        child_(args, testing::ChildOptions{.stdout_file = output.string(),
                                           .stderr_file = output.string(),
                                           .own_process_group = true}) {}

  std::string output() const { return ReadAll(output_); }

  // Waits until the output matches `pattern` (its first group returned), at
  // most `timeout`; empty when it never did or fleetrun ended first.
  std::string WaitFor(const std::string& pattern, std::chrono::seconds timeout) {
    const std::regex re(pattern);
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      std::smatch m;
      const std::string out = output();
      if (std::regex_search(out, m, re)) return m.size() > 1 ? m[1].str() : m[0].str();
      if (Exited()) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "";
  }

  // The exit code, waiting at most `timeout` (-1 when still running).
  int Wait(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!Exited() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return exit_code_ < -1 ? -1 : exit_code_;
  }

 private:
  bool Exited() {
    if (exit_code_ >= -1) return true;
    const std::optional<testing::Exit> exit = child_.Poll();
    if (!exit) return false;
    exit_code_ = exit->exited ? exit->code : -1;
    return true;
  }

  fs::path output_;
  testing::Child child_;  // killed with its group if the test ends first
  int exit_code_ = -2;  // -2: running
};

class HeterProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = testing::BinDir();
    src_ = testing::SourceDir();
    dir_ = fs::temp_directory_path() / ("fleet_heter_process_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string gen = bin_ + "/gen_ctr_data --out_dir=" + (dir_ / "data").string() +
                            " --train_files=2 --test_files=1 --lines_per_file=75000 --seed=5 > " +
                            (dir_ / "gen.log").string() + " 2>&1";
    ASSERT_EQ(testing::RunCommand(gen).exit_code, 0) << ReadAll(dir_ / "gen.log");
  }
  void TearDown() override {
    if (std::getenv("FLEET_KEEP_TEST_DIR") == nullptr) fs::remove_all(dir_);
  }

  // 2 servers, 2 CPU workers, 2 heter workers, configs/ctr_dnn_heter.yaml
  // with the small model, async, 4 epochs.
  std::vector<std::string> Args(const std::vector<std::string>& extra) {
    const fs::path data = dir_ / "data";
    std::vector<std::string> a = {bin_ + "/fleetrun",
                                  "--server_num=2",
                                  "--worker_num=2",
                                  "--heter_worker_num=2",
                                  "--http_port=0",
                                  "--grace_period=2",
                                  "--log_dir=" + (dir_ / "log").string(),
                                  "--config=" + src_ + "/configs/ctr_dnn_heter.yaml",
                                  "-o",
                                  "data.train=" + (data / "train").string(),
                                  "-o",
                                  "data.test=" + (data / "test").string(),
                                  "-o",
                                  "data.oracle=" + (data / "oracle.txt").string(),
                                  "-o",
                                  "tables.0.dim=4",
                                  "-o",
                                  "tables.0.shard_num=8",
                                  "-o",
                                  "tables.1.dim=4321",
                                  "-o",
                                  "tables.1.optimizer.learning_rate=0.003",
                                  "-o",
                                  "model.hidden=[32, 16]",
                                  "-o",
                                  "train.batch_size=128",
                                  "-o",
                                  "train.epochs=4"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  std::string bin_, src_;
  fs::path dir_;
};

double HeldOutAuc(const std::string& output, double* oracle) {
  std::smatch m;
  if (!std::regex_search(output, m,
                         std::regex(R"(summary: held-out auc ([0-9.]+) \(oracle ([0-9.]+))"))) {
    return -1;
  }
  *oracle = std::stod(m[2]);
  return std::stod(m[1]);
}

// kill -9 of a heter worker mid-run: fleetrun fails the job within 10 s,
// naming the heter worker and showing its log tail.
TEST_F(HeterProcessTest, AKilledHeterWorkerFailsTheJobNamingIt) {
  Fleetrun run(Args({}), dir_ / "out_kill.txt");
  const std::string pid =
      run.WaitFor(R"(started heter_worker 1 .* pid ([0-9]+))", std::chrono::seconds(60));
  ASSERT_FALSE(pid.empty()) << run.output();
  // Mid-run: once worker 0 reported training progress.
  ASSERT_FALSE(run.WaitFor(R"(epoch 1 step 100/)", std::chrono::seconds(120)).empty())
      << run.output();
  const auto killed = Clock::now();
  ASSERT_EQ(kill(std::stoi(pid), SIGKILL), 0);
  const int code = run.Wait(std::chrono::seconds(30));
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  const std::string out = run.output();
  EXPECT_NE(code, 0) << out;
  EXPECT_LT(seconds, 10.0) << out;
  EXPECT_NE(out.find("heter_worker 1 (pid " + pid + ")"), std::string::npos) << out;
  EXPECT_NE(out.find("killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("heterlog.1"), std::string::npos) << out;
  EXPECT_NE(out.find("heter worker 1/2 serving on"), std::string::npos) << "its log tail\n" << out;
}

// A heter worker that stops answering (SIGSTOP: alive, silent): the
// transport's heartbeats declare it lost after 5 s, the CPU workers resend
// elsewhere, and once it has stayed away for down_timeout_ms (2 s here) the
// job fails naming it, with its log tail, within 10 s.
TEST_F(HeterProcessTest, AHeterWorkerThatStopsAnsweringFailsTheJobNamingIt) {
  Fleetrun run(Args({"-o", "Distributed.heter.down_timeout_ms=2000"}), dir_ / "out_stop.txt");
  const std::string pid =
      run.WaitFor(R"(started heter_worker 1 .* pid ([0-9]+))", std::chrono::seconds(60));
  ASSERT_FALSE(pid.empty()) << run.output();
  ASSERT_FALSE(run.WaitFor(R"(epoch 1 step 100/)", std::chrono::seconds(120)).empty())
      << run.output();
  const auto stopped = Clock::now();
  ASSERT_EQ(kill(std::stoi(pid), SIGSTOP), 0);
  const std::string failed = run.WaitFor(R"((job failed))", std::chrono::seconds(30));
  const double seconds = std::chrono::duration<double>(Clock::now() - stopped).count();
  kill(std::stoi(pid), SIGCONT);  // so fleetrun's SIGTERM can end it
  const int code = run.Wait(std::chrono::seconds(30));
  const std::string out = run.output();
  ASSERT_FALSE(failed.empty()) << out;
  EXPECT_LT(seconds, 10.0) << out;
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("heter worker 1 ("), std::string::npos) << out;
  EXPECT_NE(out.find("unreachable for"), std::string::npos) << out;
  EXPECT_NE(out.find("lines of its log:"), std::string::npos) << out;
}

// With --max_restart=1 the killed heter worker is restarted on its endpoint,
// the micro-batches it had are resent, and the job reaches the bar; each
// heter worker logs to heterlog.N, the restarted one after a marker.
TEST_F(HeterProcessTest, WithMaxRestartTheJobFinishesAndReachesTheBar) {
  Fleetrun run(Args({"--max_restart=1"}), dir_ / "out_restart.txt");
  const std::string pid =
      run.WaitFor(R"(started heter_worker 0 .* pid ([0-9]+))", std::chrono::seconds(60));
  ASSERT_FALSE(pid.empty()) << run.output();
  ASSERT_FALSE(run.WaitFor(R"(epoch 1 step 100/)", std::chrono::seconds(120)).empty())
      << run.output();
  ASSERT_EQ(kill(std::stoi(pid), SIGKILL), 0);
  const int code = run.Wait(std::chrono::seconds(200));
  const std::string out = run.output();
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("restarting (1 of 1)"), std::string::npos) << out;
  double oracle = 0;
  const double auc = HeldOutAuc(out, &oracle);
  EXPECT_GE(auc, oracle - 0.02) << out;
  // The restarted heter worker served again (its log has a second start).
  const std::string log = ReadAll(dir_ / "log" / "heterlog.0");
  EXPECT_NE(log.find("==== fleetrun: restart 1 of heter_worker 0 ===="), std::string::npos) << log;
  const std::string after = log.substr(log.find("==== fleetrun: restart 1"));
  const std::string other = ReadAll(dir_ / "log" / "heterlog.1");
  for (const std::string& served : {after, other}) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(served, m, std::regex(R"(stopped after ([0-9]+) micro-batches)")))
        << served;
    EXPECT_GT(std::stoi(m[1]), 0) << served;
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(([0-9]+) micro-batches resent)"))) << out;
}

}  // namespace
}  // namespace fleet
