// A PS job rides out a server crash through the real fleetrun: 2 ps_server +
// 2 ps_worker training ctr_dnn with server.recovery_dir and --max_restart=1;
// server 1 is killed with SIGKILL mid-training (sync, async and geo). fleetrun restarts it, it
// recovers from its checkpoint and push log ("lost 0 acknowledged
// updates"), the workers resend their calls to it (PsClient) and the job
// ends with exit 0 and the held-out AUC bar of an undisturbed run
// (tests/worker/fleetrun_ctr_test.cc). Prints the time from the kill to
// the workers being answered again and the run's slowdown against an
// undisturbed run of the same job (ctest -V).
// The same job also rides out kill -9 of worker 1: the restarted worker
// rejoins (sync: at the step the servers hold; async: after its last
// progress line), logging "rejoined at step S (skipped N batches ...); lost
// 0 updates", and worker 0 is never restarted.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>

#include "tests/launch/fleet_job.h"
#include "tests/test_paths.h"

namespace fleet {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::FleetJob;

class RestartTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bin_ = testing::BinDir();
    src_ = testing::SourceDir();
    dir_ = fs::temp_directory_path() / ("fleet_restart_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    // fleetrun_ctr_test's data set, so its AUC bar applies.
    ASSERT_EQ(testing::GenerateCtrData(bin_, dir_ / "data", 20000), "");
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_);
    std::printf("\nserver or worker crash under --max_restart=1:\n%s", table_.c_str());
  }

  // Starts ctr_dnn on 2 servers x 2 workers, 2 epochs, crash recovery on (in
  // the folder the test names, or the one fleetrun picks).
  FleetJob Start(const std::string& name, const std::string& mode) {
    const std::string job_id = "restart_" + name + "_" + std::to_string(getpid());
    const fs::path data = dir_ / "data";
    std::vector<std::string> args = {
        bin_ + "/fleetrun", "--server_num=2", "--worker_num=2", "--max_restart=1",
        "--http_port=0", "--grace_period=1", "--job_id=" + job_id,
        "--log_dir=" + (dir_ / "log").string(), "--config=" + src_ + "/configs/ctr_dnn.yaml"};
    std::vector<std::string> overrides = {
        "data.train=" + (data / "train").string(), "data.test=" + (data / "test").string(),
        "data.oracle=" + (data / "oracle.txt").string(), std::string("train.epochs=2"),
        "Distributed.mode=" + mode};
    if (name_recovery_dir_) overrides.push_back("server.recovery_dir=" + (dir_ / ("rec_" + name)).string());
    for (const std::string& o : overrides) args.insert(args.end(), {"-o", o});
    return testing::StartFleetrun(args, dir_ / (name + ".out"), job_id);
  }

  // Runs the job to its end, bounded by 120 s; returns its wall time and
  // the held-out AUC (checked against `bar`).
  double RunToEnd(FleetJob& job, Clock::time_point start, double bar, double* auc) {
    std::optional<int> exit_code = job.WaitForExit(std::chrono::seconds(120));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string out = job.Output();
    EXPECT_EQ(exit_code, std::optional<int>(0)) << out;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(summary: held-out auc ([0-9.]+))"))) << out;
    *auc = m.empty() ? 0 : std::stod(m[1]);
    EXPECT_GT(*auc, bar) << out;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a straggler would show now
    EXPECT_TRUE(job.Left().empty()) << "processes of the job left running\n" << out;
    return seconds;
  }

  // Where CrashServerOne and KillWorkerOne start from: an undisturbed run
  // of the job, and a second run training, with the process to kill.
  struct Disturbed {
    double plain_s = 0;       // the undisturbed run's wall time
    double auc_plain = 0;     // and its held-out AUC
    Clock::time_point start;  // when `job` started
    FleetJob job;
    pid_t victim = -1;
  };

  // Runs the undisturbed job of `mode` to its end (RunToEnd; once per mode
  // and test program: every case of a mode compares with the same run),
  // then starts `mode`_`job_name`, waits for worker 0's training steps and
  // picks `victim` ("server 1", "worker 1") from fleetrun's output. A fatal
  // failure when the job does not train or has no such process.
  void StartDisturbed(const std::string& mode, double bar, const std::string& job_name,
                      const std::string& victim, Disturbed* out) {
    auto plain_run = plain_runs_.find(mode);
    if (plain_run == plain_runs_.end()) {
      const auto start = Clock::now();
      FleetJob plain = Start(mode + "_plain", mode);
      PlainRun run;
      run.seconds = RunToEnd(plain, start, bar, &run.auc);
      plain_run = plain_runs_.emplace(mode, run).first;
    }
    out->plain_s = plain_run->second.seconds;
    out->auc_plain = plain_run->second.auc;
    EXPECT_GT(out->auc_plain, bar) << "the undisturbed " << mode << " run";

    out->start = Clock::now();
    FleetJob& job = out->job = Start(mode + "_" + job_name, mode);
    ASSERT_TRUE(job.WaitFor("epoch 1 step", std::chrono::seconds(60))) << job.Output();
    ASSERT_EQ(job.pids.count(victim), 1u) << job.Output();
    out->victim = job.pids[victim];
  }

  // An undisturbed run and one whose server 1 is killed once worker 0 logs
  // training steps; checks and reports both.
  void CrashServerOne(const std::string& mode, double bar) {
    Disturbed run;
    // Distinct names (job ids, output files) for each variant.
    const std::string tag = name_recovery_dir_ ? "" : "_fleetrun_rec";
    StartDisturbed(mode, bar, "crash" + tag, "server 1", &run);
    if (HasFatalFailure()) return;
    FleetJob& job = run.job;
    const pid_t victim = run.victim;
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    const auto killed = Clock::now();
    // Worker 0 logs on fleetrun's terminal when its resent calls are answered.
    const bool resumed = job.WaitFor("parameter server 1 (", std::chrono::seconds(60)) &&
                         job.WaitFor("answers again", std::chrono::seconds(60));
    const double resume_s = std::chrono::duration<double>(Clock::now() - killed).count();
    EXPECT_TRUE(resumed) << job.Output();
    double auc_crash = 0;
    const double crash_s = RunToEnd(job, run.start, bar, &auc_crash);
    const std::string out = job.Output();
    // The worker's own figure: from its first failed call to the first answer.
    std::smatch back;
    const double worker_ms = std::regex_search(out, back, std::regex(R"(answers again (\d+) ms)"))
                                 ? std::stod(back[1])
                                 : -1;
    EXPECT_NE(out.find("restarting (1 of 1)"), std::string::npos) << out;
    EXPECT_NE(job.pids["server 1"], victim) << "no restarted server 1 in fleetrun's output\n" << out;
    const std::string serverlog =
        testing::ReadAll(dir_ / "log" / job.job_id / "serverlog.1") +
        testing::ReadAll(dir_ / "log" / "serverlog.1");
    EXPECT_NE(serverlog.find("lost 0 acknowledged updates"), std::string::npos) << serverlog;
    if (!name_recovery_dir_) {
      EXPECT_NE(out.find("without server.recovery_dir: servers keep their push log and recovery checkpoints in " +
                         (dir_ / "log" / job.job_id / "recovery").string()),
                std::string::npos)
          << out;
    }
    char row[384];
    std::snprintf(row, sizeof(row),
                  "  %-5s kill -9 server 1%s: answered again after %.2f s (worker 0: %.0f ms after its "
                  "first failed call); run %.1f s vs %.1f s undisturbed (%+.1f s); auc %.4f vs %.4f\n",
                  mode.c_str(), name_recovery_dir_ ? "" : " (recovery_dir by fleetrun)", resume_s, worker_ms, crash_s, run.plain_s, crash_s - run.plain_s,
                  auc_crash, run.auc_plain);
    table_ += row;
  }

  // Worker 0's progress lines ("epoch E step I/N") on fleetrun's terminal,
  // not counting the log tails fleetrun quotes ("  | ...").
  static int ProgressLines(const std::string& out) {
    static const std::regex line(R"((^|\n)I[^\n]*\] epoch \d+ step \d+/)");
    return static_cast<int>(
        std::distance(std::sregex_iterator(out.begin(), out.end(), line), std::sregex_iterator()));
  }

  // An undisturbed run and one whose worker 1 is killed once worker 0 logs
  // training steps: the restarted worker rejoins at the servers' step.
  void KillWorkerOne(const std::string& mode, double bar) {
    Disturbed run;
    StartDisturbed(mode, bar, "wkill", "worker 1", &run);
    if (HasFatalFailure()) return;
    FleetJob& job = run.job;
    const pid_t victim = run.victim;
    const int lines_at_kill = ProgressLines(job.Output());
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    const auto killed = Clock::now();
    const fs::path log = dir_ / "log" / job.job_id / "workerlog.1";
    std::smatch m;
    std::string workerlog;
    const std::regex rejoined(R"(rejoined at step (\d+) \(skipped (\d+) batches)");
    while (!std::regex_search(workerlog, m, rejoined) && !job.Ended() &&
           Clock::now() - killed < std::chrono::seconds(60)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      workerlog = testing::ReadAll(log);
    }
    const double rejoin_s = std::chrono::duration<double>(Clock::now() - killed).count();
    ASSERT_FALSE(m.empty()) << workerlog << job.Output();
    const int64_t step = std::stoll(m[1]);
    EXPECT_GT(step, 0) << workerlog;
    EXPECT_EQ(std::stoll(m[2]), step) << workerlog;
    // Worker 0's next progress line: the step waiting for worker 1 passed.
    bool trains = false;
    while (!(trains = ProgressLines(job.Output()) > lines_at_kill) && !job.Ended() &&
           Clock::now() - killed < std::chrono::seconds(60)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const double trains_s = std::chrono::duration<double>(Clock::now() - killed).count();
    EXPECT_TRUE(trains) << job.Output();
    double auc_kill = 0;
    const double kill_s = RunToEnd(job, run.start, bar, &auc_kill);
    const std::string out = job.Output();
    workerlog = testing::ReadAll(log);
    EXPECT_NE(out.find("worker 1 (pid " + std::to_string(victim) + ") was killed by signal 9"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("restarting (1 of 1)"), std::string::npos) << out;
    EXPECT_NE(job.pids["worker 1"], victim) << "no restarted worker 1 in fleetrun's output\n"
                                            << out;
    EXPECT_NE(workerlog.find("lost 0 updates"), std::string::npos) << workerlog;
    // Only worker 1 was restarted: worker 0 rode it out.
    EXPECT_EQ(out.find("worker 0 (pid"), std::string::npos) << out;
    char row[384];
    std::snprintf(
        row, sizeof(row),
        "  %-5s kill -9 worker 1: rejoined at step %lld %.2f s after the kill, worker 0's "
        "next progress line after %.2f s; run %.1f s vs %.1f s undisturbed (%+.1f s); "
        "auc %.4f vs %.4f\n",
        mode.c_str(), static_cast<long long>(step), rejoin_s, trains_s, kill_s, run.plain_s,
        kill_s - run.plain_s, auc_kill, run.auc_plain);
    table_ += row;
  }

  struct PlainRun {
    double seconds = 0;
    double auc = 0;
  };
  static std::string bin_, src_, table_;
  static fs::path dir_;
  static std::map<std::string, PlainRun> plain_runs_;  // by mode
  // Whether Start names a server.recovery_dir (else fleetrun picks one).
  bool name_recovery_dir_ = true;
};

std::string RestartTest::bin_, RestartTest::src_, RestartTest::table_;
fs::path RestartTest::dir_;
std::map<std::string, RestartTest::PlainRun> RestartTest::plain_runs_;

TEST_F(RestartTest, SyncJobRidesOutAServerKill) { CrashServerOne("sync", 0.72); }

TEST_F(RestartTest, AsyncJobRidesOutAServerKill) { CrashServerOne("async", 0.70); }

TEST_F(RestartTest, GeoJobRidesOutAServerKill) { CrashServerOne("geo", 0.70); }

// --max_restart=1 and no server.recovery_dir: fleetrun gives the servers one
// under the log folder, so the restarted server comes back with every
// acknowledged update (it restarted empty, the workers logged a false "lost
// 0 updates" and the job failed).
TEST_F(RestartTest, SyncJobRidesOutAServerKillWithoutARecoveryDirGiven) {
  name_recovery_dir_ = false;
  CrashServerOne("sync", 0.72);
}

TEST_F(RestartTest, SyncWorkerRejoinsAfterAKill) { KillWorkerOne("sync", 0.72); }

TEST_F(RestartTest, AsyncWorkerRejoinsAfterAKill) { KillWorkerOne("async", 0.70); }

}  // namespace
}  // namespace fleet
