// Chaos test: faults injected into a real PS job (fleetrun in simulation
// mode, 2 ps_server + 2 ps_worker training ctr_dnn in sync mode), one fault
// per run: kill -9 of a server, of a worker and of fleetrun itself, SIGSTOP of
// a worker, Ctrl-C (SIGINT) to fleetrun. For each it checks the exit code and
// the message that names the fault, that the job ends within a bound, and
// that no process of the job is left (neither the pids fleetrun logged nor
// any process carrying the job's FLEET_JOB_ID). It prints the observed times
// and messages as a table (ctest -V, or run the binary).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Running and not a zombie (a zombie whose parent does not reap it runs
// nothing).
bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// Live processes whose environment holds FLEET_JOB_ID=<job_id>: every
// process fleetrun started for the job, and any child they forked.
std::vector<pid_t> ProcessesOfJob(const std::string& job_id) {
  const std::string needle = "FLEET_JOB_ID=" + job_id + '\0';
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    std::string env = ReadFile(entry.path() / "environ");
    env.push_back('\0');
    if (env.find(needle) != std::string::npos && Alive(pid)) out.push_back(pid);
  }
  return out;
}

struct Job {
  pid_t fleetrun = -1;
  fs::path output;  // fleetrun's stdout and stderr
  std::string job_id;
  // "server 0" -> pid, from fleetrun's "started ..." lines.
  std::map<std::string, pid_t> pids;
};

struct Outcome {
  int exit_code = -1;      // fleetrun's; 128 + signal when killed
  double seconds = 0;      // from the fault to the end of the job
  std::string message;     // the line naming the failure
  std::vector<pid_t> left; // processes of the job still alive afterwards
  fs::path logs;           // the job's log folder
};

class ChaosTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* bin = std::getenv("FLEET_BIN_DIR");
    const char* src = std::getenv("FLEET_SOURCE_DIR");
    ASSERT_NE(bin, nullptr) << "run through ctest (FLEET_BIN_DIR)";
    ASSERT_NE(src, nullptr);
    bin_ = bin;
    src_ = src;
    dir_ = fs::temp_directory_path() / ("fleet_chaos_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    const std::string gen = bin_ + "/gen_ctr_data --out_dir=" + (dir_ / "data").string() +
                            " --train_files=2 --test_files=1 --lines_per_file=4000 >/dev/null 2>&1";
    ASSERT_EQ(std::system(gen.c_str()), 0) << gen;
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_);
    std::printf("\nchaos summary (time from the fault to the job's end):\n%s", table_.c_str());
  }

  // Starts the job and waits until worker 0 has logged training steps.
  Job Launch(const std::string& name) {
    Job job;
    std::string id = name;
    for (char& c : id) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    job.job_id = "chaos_" + id + "_" + std::to_string(getpid());
    job.output = dir_ / (id + ".out");
    const fs::path data = dir_ / "data";
    std::vector<std::string> args = {
        bin_ + "/fleetrun", "--server_num=2", "--worker_num=2", "--http_port=0", "--grace_period=1",
        "--job_id=" + job.job_id, "--log_dir=" + (dir_ / "log").string(),
        "--config=" + src_ + "/configs/ctr_dnn.yaml", "-o", "data.train=" + (data / "train").string(),
        "-o", "data.test=" + (data / "test").string(), "-o", "data.oracle=" + (data / "oracle.txt").string(),
        "-o", "train.epochs=1000", "-o", "train.batch_size=64", "-o", "train.log_interval=5",
        // A hung peer is noticed after this long (the README's bound for it).
        "-o", "Distributed.timeout_ms=3000"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    job.fleetrun = fork();
    if (job.fleetrun == 0) {
      const int fd = open(job.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execve(argv[0], argv.data(), environ);
      _exit(127);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    const std::regex started(R"(fleetrun: started (\w+ \d+) .* pid (\d+))");
    while (Clock::now() < deadline) {
      const std::string out = ReadFile(job.output);
      if (out.find("epoch 1 step") != std::string::npos) {
        for (std::sregex_iterator it(out.begin(), out.end(), started), end; it != end; ++it) {
          job.pids[(*it)[1]] = std::stoi((*it)[2]);
        }
        return job;
      }
      int status = 0;
      if (waitpid(job.fleetrun, &status, WNOHANG) == job.fleetrun) {
        ADD_FAILURE() << name << ": fleetrun ended before training:\n" << out;
        job.fleetrun = -1;
        return job;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    ADD_FAILURE() << name << ": no training step within 30 s:\n" << ReadFile(job.output);
    return job;
  }

  // Runs `inject` on a training job, waits for the end (bounded by `limit`)
  // and records what happened.
  Outcome Inject(const std::string& name, const std::function<void(Job&)>& inject, double limit_s) {
    Job job = Launch(name);
    Outcome o;
    if (job.fleetrun < 0) return o;
    EXPECT_EQ(job.pids.size(), 4u) << ReadFile(job.output);
    const auto fault = Clock::now();
    inject(job);
    const auto limit = fault + milliseconds(static_cast<int64_t>(limit_s * 1000));
    int status = 0;
    bool reaped = false;
    // fleetrun's end; after a kill -9 of fleetrun, the end of its processes.
    while (Clock::now() < limit) {
      if (!reaped && waitpid(job.fleetrun, &status, WNOHANG) == job.fleetrun) reaped = true;
      if (reaped && ProcessesOfJob(job.job_id).empty()) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    o.seconds = std::chrono::duration<double>(Clock::now() - fault).count();
    o.logs = dir_ / "log" / job.job_id;
    if (!reaped) {
      ADD_FAILURE() << name << ": fleetrun still running " << limit_s << " s after the fault";
      kill(job.fleetrun, SIGKILL);
      waitpid(job.fleetrun, &status, 0);
    }
    o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(milliseconds(200));  // a straggler would show now
    o.left = ProcessesOfJob(job.job_id);
    for (const auto& [who, pid] : job.pids) {
      if (Alive(pid)) o.left.push_back(pid);
    }
    // The first line fleetrun wrote about the end, and the last line of the
    // log tail it printed after it (the failed process's own error).
    const std::string out = ReadFile(job.output);
    std::smatch m;
    if (std::regex_search(out, m, std::regex(R"(fleetrun: (received|\w+ \d+ \(pid \d+\))[^\n]*)"))) {
      o.message = m[0];
      const size_t at = m.position(0);
      const size_t tail_end = out.find("\nfleetrun: job failed", at);
      const size_t last = tail_end == std::string::npos ? std::string::npos : out.rfind("\n  | ", tail_end);
      if (last != std::string::npos && last > at) o.message += " // " + out.substr(last + 5, tail_end - last - 5);
    }
    char row[512];
    std::snprintf(row, sizeof(row), "  %-18s exit %3d  %6.2f s  left %zu  %s\n", name.c_str(), o.exit_code,
                  o.seconds, o.left.size(), o.message.empty() ? "(fleetrun printed nothing)" : o.message.c_str());
    table_ += row;
    if (!o.left.empty() || HasFailure()) std::printf("%s output:\n%s\n", name.c_str(), out.c_str());
    return o;
  }

  static std::string bin_, src_, table_;
  static fs::path dir_;
};

std::string ChaosTest::bin_, ChaosTest::src_, ChaosTest::table_;
fs::path ChaosTest::dir_;

TEST_F(ChaosTest, KillNineOfAServerFailsTheJobNamingIt) {
  pid_t victim = -1;
  Outcome o = Inject("kill -9 server 0", [&](Job& j) { kill(victim = j.pids["server 0"], SIGKILL); }, 5);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.message.find("server 0 (pid " + std::to_string(victim) + ") was killed by signal 9"),
            std::string::npos)
      << o.message;
  EXPECT_TRUE(o.left.empty());
}

TEST_F(ChaosTest, KillNineOfAWorkerFailsTheJobNamingIt) {
  Outcome o = Inject("kill -9 worker 1", [](Job& j) { kill(j.pids["worker 1"], SIGKILL); }, 5);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.message.find("worker 1 (pid"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("killed by signal 9"), std::string::npos) << o.message;
  EXPECT_TRUE(o.left.empty());
}

// fleetrun gets no chance to stop anyone: PR_SET_PDEATHSIG takes the
// processes down with it.
TEST_F(ChaosTest, KillNineOfFleetrunLeavesNoProcess) {
  Outcome o = Inject("kill -9 fleetrun", [](Job& j) { kill(j.fleetrun, SIGKILL); }, 5);
  EXPECT_EQ(o.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(o.left.empty());
  EXPECT_LT(o.seconds, 2.0);
}

// A frozen worker: in sync mode the others wait for its push; they give up
// after Distributed.timeout_ms (3 s here) and the job fails.
TEST_F(ChaosTest, StoppedWorkerIsNoticedWithinTheTimeout) {
  Outcome o = Inject("SIGSTOP worker 1", [](Job& j) { kill(j.pids["worker 1"], SIGSTOP); }, 15);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_FALSE(o.message.empty());
  EXPECT_LT(o.seconds, 3.0 + 5.0);  // the timeout, then the stop (SIGTERM, SIGKILL after 1 s)
  EXPECT_TRUE(o.left.empty());
  // Stopping continues a stopped process, so it acts on SIGTERM instead of
  // being SIGKILLed after the grace period.
  EXPECT_NE(ReadFile(o.logs / "workerlog.1").find("ps_worker: signal 15"), std::string::npos)
      << ReadFile(o.logs / "workerlog.1");
}

TEST_F(ChaosTest, CtrlCStopsEveryProcess) {
  Outcome o = Inject("SIGINT fleetrun", [](Job& j) { kill(j.fleetrun, SIGINT); }, 5);
  EXPECT_EQ(o.exit_code, 128 + SIGINT);
  EXPECT_NE(o.message.find("received"), std::string::npos) << o.message;
  EXPECT_TRUE(o.left.empty());
}

}  // namespace
