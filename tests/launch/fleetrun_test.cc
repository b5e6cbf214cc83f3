// Drives the real fleetrun binary (from $FLEET_BIN_DIR) with launch_fixture
// standing in for ps_server / ps_worker / heter_worker / PROGRAM.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/child_process.h"
#include "tests/test_paths.h"


namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

int64_t NowUnixMs() {
  return std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Line {
  int64_t at_ms;  // unix ms when fleetrun wrote it
  bool err;
  std::string text;
};

struct RunResult {
  int exit_code = -1;
  std::string out, err;
  std::vector<Line> lines;
  double seconds = 0;
  // Arrival time of the first line containing `needle`, or -1.
  int64_t TimeOf(const std::string& needle) const {
    for (const Line& l : lines) {
      if (l.text.find(needle) != std::string::npos) return l.at_ms;
    }
    return -1;
  }
};

// fleetrun started by Start, its stdout and stderr on pipes.
struct Running {
  fleet::testing::Child child;
  pid_t pid = -1;
  std::chrono::steady_clock::time_point start = {};
};

bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  // A zombie waiting for a parent that does not reap (pid 1 in some
  // containers) runs nothing: count it as gone.
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

class FleetrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = fleet::testing::BinDir();
    char tmpl[] = "/tmp/fleetrun_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    fake_bin_ = tmp_ / "bin";
    fs::create_directories(fake_bin_);
    for (const char* name : {"ps_server", "ps_worker", "heter_worker"}) {
      fs::create_symlink(bin_ / "launch_fixture", fake_bin_ / name);
    }
    config_ = tmp_ / "job.yaml";
    // fleetrun loads the job config as the real processes would.
    std::ofstream(config_) << "Distributed:\n  mode: sync\n"
                              "tables: [{id: 0, kind: sparse, dim: 9}, {id: 1, kind: dense, dim: 10}]\n"
                              "model: {kind: ctr_dnn}\n"
                              "data: {train: x}\n";
    log_ = tmp_ / "log";
  }
  void TearDown() override { fs::remove_all(tmp_); }

  fs::path FixtureDir(const std::string& name) {
    fs::path d = tmp_ / name;
    fs::create_directories(d);
    return d;
  }

  // PS simulation flags shared by most tests.
  std::vector<std::string> PsArgs(int servers, int workers) {
    return {"--server_num=" + std::to_string(servers), "--worker_num=" + std::to_string(workers),
            "--config=" + config_.string(), "--bin_dir=" + fake_bin_.string(), "--log_dir=" + log_.string(),
            "--http_port=0", "--grace_period=2"};
  }
  std::vector<std::string> CollectiveArgs(int nproc) {
    return {"--nproc_per_node=" + std::to_string(nproc), "--log_dir=" + log_.string(), "--http_port=0",
            "--grace_period=1", (bin_ / "launch_fixture").string()};
  }

  Running Start(const std::vector<std::string>& args, const std::vector<std::string>& env_extra) {
    std::vector<std::string> argv = {(bin_ / "fleetrun").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    Running r{.child = fleet::testing::Child(argv, {.env = env_extra,
                                                    .drop_env_prefixes = {"FIXTURE_"},
                                                    .pipe_output = true})};
    r.pid = r.child.pid();
    r.start = r.child.start_time();
    return r;
  }

  // Reads fleetrun's output until it exits; SIGKILLs it and fails the test
  // after `timeout`.
  RunResult Finish(Running& r, milliseconds timeout = milliseconds(30000)) {
    RunResult res;
    std::string partial[2];
    const auto deadline = r.start + timeout;
    int fd[2] = {r.child.out_fd(), r.child.err_fd()};
    int open_fds = 2;
    while (open_fds > 0) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) {
        ADD_FAILURE() << "fleetrun did not finish within " << timeout.count() << " ms; output so far:\n"
                      << res.out << res.err;
        r.child.Kill(SIGKILL);
        break;
      }
      pollfd fds[2] = {{fd[0], POLLIN, 0}, {fd[1], POLLIN, 0}};
      if (poll(fds, 2, std::min<int64_t>(left, 200)) <= 0) continue;
      for (int k = 0; k < 2; ++k) {
        if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP))) continue;
        char buf[8192];
        ssize_t n = read(fds[k].fd, buf, sizeof(buf));
        if (n <= 0) {
          fd[k] = -1;
          --open_fds;
          continue;
        }
        (k == 0 ? res.out : res.err).append(buf, n);
        partial[k].append(buf, n);
        size_t nl;
        while ((nl = partial[k].find('\n')) != std::string::npos) {
          res.lines.push_back({NowUnixMs(), k == 1, partial[k].substr(0, nl)});
          partial[k].erase(0, nl + 1);
        }
      }
    }
    r.child.CloseOutput();
    const fleet::testing::Exit exit = r.child.Wait(timeout);  // its output has ended: it is exiting
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
    res.exit_code = exit.ShellCode();
    return res;
  }

  RunResult Run(const std::vector<std::string>& args, const std::vector<std::string>& env_extra = {}) {
    Running r = Start(args, env_extra);
    return Finish(r);
  }

  static std::vector<pid_t> RecordedPids(const fs::path& dir) {
    std::vector<pid_t> pids;
    if (!fs::exists(dir)) return pids;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::string name = e.path().filename();
      if (name.rfind("pid.", 0) == 0) pids.push_back(std::stoi(name.substr(name.rfind('.') + 1)));
    }
    return pids;
  }

  static void ExpectNoSurvivors(const fs::path& dir) {
    std::vector<pid_t> pids = RecordedPids(dir);
    EXPECT_FALSE(pids.empty());
    for (pid_t pid : pids) EXPECT_FALSE(Alive(pid)) << "process " << pid << " survived fleetrun";
  }

  // Starts fleetrun, waits until `expected` processes recorded their pids,
  // sends `signo` to fleetrun and checks it stops everything.
  void SignalStopsEverything(const std::vector<std::string>& args, const std::vector<std::string>& env,
                             const fs::path& fx, size_t expected, int signo) {
    Running r = Start(args, env);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (RecordedPids(fx).size() < expected && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    ASSERT_EQ(RecordedPids(fx).size(), expected);
    std::this_thread::sleep_for(milliseconds(200));  // let fleetrun reach its supervise loop
    ASSERT_EQ(kill(r.pid, signo), 0);
    const auto sent = std::chrono::steady_clock::now();
    RunResult res = Finish(r);
    const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    EXPECT_EQ(res.exit_code, 128 + signo) << res.err;
    EXPECT_NE(res.err.find("received"), std::string::npos) << res.err;
    EXPECT_LT(stop_s, 5.0);
    ExpectNoSurvivors(fx);
  }

  fs::path bin_, tmp_, fake_bin_, config_, log_;
};

TEST_F(FleetrunTest, PsSimulationCompletesAndEveryProcessGetsTheContract) {
  fs::path fx = FixtureDir("fx");
  std::vector<std::string> args = PsArgs(2, 3);
  args.insert(args.end(), {"--heter_worker_num=1", "--job_id=jobA", "-o", "train.epochs=2", "-odata.train=y"});
  RunResult res = Run(args, {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_worker=connect"});
  ASSERT_EQ(res.exit_code, 0) << res.out << res.err;
  EXPECT_NE(res.out.find("all workers finished"), std::string::npos);
  // Worker 0 is shown on the terminal, worker 1 only in its log.
  EXPECT_NE(res.out.find("fixture worker 0 reached 2 servers"), std::string::npos) << res.out;
  EXPECT_EQ(res.out.find("fixture worker 1 reached"), std::string::npos);
  const fs::path logs = log_ / "jobA";
  EXPECT_NE(ReadFile(logs / "workerlog.1").find("fixture worker 1 reached 2 servers"), std::string::npos);
  EXPECT_NE(ReadFile(logs / "workerlog.0").find("fixture worker 0 reached"), std::string::npos);
  for (const char* f : {"serverlog.0", "serverlog.1", "heterlog.0"}) {
    EXPECT_NE(ReadFile(logs / f).find("stopping on SIGTERM"), std::string::npos) << f;
  }

  const std::string worker = ReadFile(fx / "env.worker.1");
  for (const std::string& want : std::vector<std::string>{
           "env FLEET_ROLE=worker", "env FLEET_RANK=1", "env FLEET_WORLD_SIZE=3", "argv --role=worker", "argv --rank=1",
        "argv --world_size=3", "argv --override=train.epochs=2;data.train=y",
        "env FLEET_OVERRIDES=train.epochs=2;data.train=y", "env FLEET_CONFIG=" + config_.string(),
        "argv --config=" + config_.string(), "env FLEET_JOB_ID=jobA", "env FLEET_DEVICE=cpu",
        "env FLEET_LOG_DIR=" + logs.string(), "env FLEET_KV_ENDPOINT=127.0.0.1:", "argv --kv_endpoint=127.0.0.1:"}) {
    EXPECT_NE(worker.find(want + (want.back() == ':' ? "" : "\n")), std::string::npos) << want << " in\n" << worker;
  }
  // Workers start after the servers published: real ports only.
  for (const char* var : {"env FLEET_SERVERS=", "env FLEET_HETER_WORKERS="}) {
    size_t at = worker.find(var);
    ASSERT_NE(at, std::string::npos) << var;
    std::string list = worker.substr(at, worker.find('\n', at) - at) + ",";
    EXPECT_EQ(list.find(":0,"), std::string::npos) << list;
  }
  const std::string server = ReadFile(fx / "env.server.1");
  EXPECT_NE(server.find("argv --endpoint=127.0.0.1:0\n"), std::string::npos) << server;
  EXPECT_NE(server.find("env FLEET_ENDPOINT=127.0.0.1:0\n"), std::string::npos) << server;
  EXPECT_NE(server.find("env FLEET_ROLE=server\n"), std::string::npos);
  EXPECT_NE(ReadFile(fx / "env.heter_worker.0").find("env FLEET_ROLE=heter_worker\n"), std::string::npos);
  ExpectNoSurvivors(fx);
}

TEST_F(FleetrunTest, FailureIsReportedWithLogTailWithinTenSeconds) {
  fs::path fx = FixtureDir("fx");
  RunResult res = Run(PsArgs(1, 2), {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_worker_0=hang",
                                     "FIXTURE_MODE_worker_1=fail"});
  EXPECT_EQ(res.exit_code, 1) << res.out << res.err;
  EXPECT_NE(res.err.find("worker 1 (pid"), std::string::npos) << res.err;
  EXPECT_NE(res.err.find("exited with status 3"), std::string::npos) << res.err;
  // Last 20 of the 31 lines the worker printed: lines 10..29.
  EXPECT_NE(res.err.find("| fixture line 29\n"), std::string::npos) << res.err;
  EXPECT_NE(res.err.find("| fixture line 10\n"), std::string::npos) << res.err;
  EXPECT_EQ(res.err.find("| fixture line 9\n"), std::string::npos) << res.err;
  const int64_t died = std::stoll(ReadFile(fx / "death.worker.1"));
  const int64_t reported = res.TimeOf("exited with status 3");
  ASSERT_GT(reported, 0);
  const int64_t latency = reported - died;
  std::printf("failure detection latency: %lld ms (fleetrun ran %.2f s)\n", static_cast<long long>(latency), res.seconds);
  RecordProperty("failure_latency_ms", std::to_string(latency));
  EXPECT_LT(latency, 10000);
  ExpectNoSurvivors(fx);
}

TEST_F(FleetrunTest, CrashBySignalIsNamed) {
  fs::path fx = FixtureDir("fx");
  RunResult res = Run(CollectiveArgs(2), {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_collective_0=hang",
                                          "FIXTURE_MODE_collective_1=segv"});
  EXPECT_EQ(res.exit_code, 1) << res.err;
  EXPECT_NE(res.err.find("collective 1 (pid"), std::string::npos) << res.err;
  EXPECT_NE(res.err.find("killed by signal 11"), std::string::npos) << res.err;
  ExpectNoSurvivors(fx);
}

TEST_F(FleetrunTest, MaxRestartRestartsAFailedProcess) {
  fs::path fx = FixtureDir("fx");
  const std::vector<std::string> env = {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_collective_1=fail_once"};
  RunResult without = Run(CollectiveArgs(2), env);
  EXPECT_EQ(without.exit_code, 1) << without.err;
  fs::remove(fx / "failed.collective.1");

  std::vector<std::string> args = CollectiveArgs(2);
  args.insert(args.begin(), "--max_restart=1");
  RunResult with = Run(args, env);
  EXPECT_EQ(with.exit_code, 0) << with.err;
  EXPECT_NE(with.err.find("restarting (1 of 1)"), std::string::npos) << with.err;
  EXPECT_NE(ReadFile(log_ / "workerlog.1").find("restart 1 of collective 1"), std::string::npos);
  // The restarted process knows it is one (a server then reloads its checkpoint).
  EXPECT_NE(ReadFile(fx / "env.collective.1").find("env FLEET_RESTART=1\n"), std::string::npos)
      << ReadFile(fx / "env.collective.1");
  // Its rendezvous keys are a new generation's; rank 0 was never restarted.
  EXPECT_NE(ReadFile(fx / "env.collective.1").find("env FLEET_RESTART_GENERATION=1\n"), std::string::npos);
  EXPECT_NE(ReadFile(fx / "env.collective.0").find("env FLEET_RESTART_GENERATION=0\n"), std::string::npos);
}

TEST_F(FleetrunTest, SigintStopsEveryProcessIncludingGrandchildren) {
  fs::path fx = FixtureDir("fx");
  // 2 servers + 2 workers + the child worker 0 forks = 5 pids.
  SignalStopsEverything(PsArgs(2, 2),
                        {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_worker_0=spawn_child", "FIXTURE_MODE_worker_1=hang"},
                        fx, 5, SIGINT);
}

TEST_F(FleetrunTest, SigtermStopsEvenProcessesThatIgnoreIt) {
  fs::path fx = FixtureDir("fx");
  SignalStopsEverything(CollectiveArgs(2),
                        {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_collective_0=spawn_child",
                         "FIXTURE_MODE_collective_1=hang_ignore_term"},
                        fx, 3, SIGTERM);
}

TEST_F(FleetrunTest, HugeCountIsRefusedAtOnce) {
  fs::path fx = FixtureDir("fx");
  RunResult res = Run(PsArgs(100000, 1), {"FIXTURE_DIR=" + fx.string()});
  EXPECT_EQ(res.exit_code, 2) << res.err;
  EXPECT_EQ(res.err.rfind("fleetrun: --server_num: 100000 is more than the 1024", 0), 0u) << res.err;
  EXPECT_LT(res.seconds, 2.0);
  EXPECT_TRUE(RecordedPids(fx).empty());
  EXPECT_FALSE(fs::exists(log_));
}

// A program that cannot be exec'd fails the start-up at the first attempt,
// naming it and why; nothing after it is started.
TEST_F(FleetrunTest, ExecFailureStopsTheStartUpNamingTheProgram) {
  fs::path fx = FixtureDir("fx");
  const fs::path bad_bin = tmp_ / "bad_bin";
  fs::create_directories(bad_bin);
  // Executable bits but no program inside: execve fails with ENOEXEC.
  std::ofstream(bad_bin / "ps_server") << "not a program\n";
  fs::permissions(bad_bin / "ps_server", fs::perms::owner_all);
  for (const char* name : {"ps_worker", "heter_worker"}) fs::create_symlink(bin_ / "launch_fixture", bad_bin / name);
  std::vector<std::string> args = PsArgs(3, 2);
  args.push_back("--bin_dir=" + bad_bin.string());
  RunResult ps = Run(args, {"FIXTURE_DIR=" + fx.string()});
  EXPECT_EQ(ps.exit_code, 1) << ps.err;
  EXPECT_NE(ps.err.find("fleetrun: cannot start server 0: cannot exec (Exec format error): " +
                        (bad_bin / "ps_server").string()),
            std::string::npos)
      << ps.err;
  EXPECT_LT(ps.seconds, 5.0);
  EXPECT_FALSE(fs::exists(log_ / "serverlog.1")) << "kept spawning after a failed exec";
  EXPECT_TRUE(RecordedPids(fx).empty());

  std::vector<std::string> collective = CollectiveArgs(4);
  collective.back() = (bad_bin / "ps_server").string();
  RunResult co = Run(collective, {"FIXTURE_DIR=" + fx.string()});
  EXPECT_EQ(co.exit_code, 1) << co.err;
  EXPECT_NE(co.err.find("cannot start collective 0: cannot exec (Exec format error)"), std::string::npos) << co.err;
  EXPECT_FALSE(fs::exists(log_ / "workerlog.1"));
}

// SIGTERM while fleetrun is still starting processes: it stops starting at
// once (it used to start every one first) and leaves nothing behind.
TEST_F(FleetrunTest, SigtermDuringSpawningStopsTheStartUp) {
  fs::path fx = FixtureDir("fx");
  constexpr int kServers = 200;
  Running r = Start(PsArgs(kServers, 1), {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_server=hang"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (RecordedPids(fx).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  ASSERT_FALSE(RecordedPids(fx).empty());
  ASSERT_EQ(kill(r.pid, SIGTERM), 0);
  const auto sent = std::chrono::steady_clock::now();
  RunResult res = Finish(r);
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  EXPECT_EQ(res.exit_code, 128 + SIGTERM) << res.err;
  EXPECT_NE(res.err.find("received"), std::string::npos) << res.err;
  size_t started = 0;
  for (size_t at = 0; (at = res.out.find("fleetrun: started server", at)) != std::string::npos; ++at) ++started;
  EXPECT_LT(started, static_cast<size_t>(kServers)) << "every server was started despite SIGTERM";
  EXPECT_LT(stop_s, 5.0);
  ExpectNoSurvivors(fx);
}

// SIGTERM while waiting for a rendezvous that never completes (servers that
// never publish their endpoints): fleetrun ends promptly, nothing left.
TEST_F(FleetrunTest, SigtermDuringRendezvousEndsPromptly) {
  fs::path fx = FixtureDir("fx");
  std::vector<std::string> args = PsArgs(2, 1);
  args.push_back("--rendezvous_timeout=60");
  SignalStopsEverything(args, {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_server=hang"}, fx, 2, SIGTERM);
}

TEST_F(FleetrunTest, TwoPortZeroJobsRunSideBySide) {
  fs::path fx1 = FixtureDir("fx1"), fx2 = FixtureDir("fx2");
  auto args = [&](const std::string& job) {
    std::vector<std::string> a = PsArgs(2, 2);
    a.push_back("--job_id=" + job);
    return a;
  };
  Running one = Start(args("one"), {"FIXTURE_DIR=" + fx1.string(), "FIXTURE_MODE_worker=connect"});
  Running two = Start(args("two"), {"FIXTURE_DIR=" + fx2.string(), "FIXTURE_MODE_worker=connect"});
  RunResult r1 = Finish(one), r2 = Finish(two);
  EXPECT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  EXPECT_EQ(r2.exit_code, 0) << r2.out << r2.err;
  auto kv = [](const RunResult& r) {
    size_t at = r.out.find("KV store serving on ");
    return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find(' ', at + 20) - at);
  };
  EXPECT_NE(kv(r1), "");
  EXPECT_NE(kv(r1), kv(r2));
  EXPECT_TRUE(fs::exists(log_ / "one" / "workerlog.1"));
  EXPECT_TRUE(fs::exists(log_ / "two" / "workerlog.1"));
}

// A program written for torchrun or Paddle's fleetrun, not for FleetPS: a
// shell script that checks the variables those launchers give and fails
// naming what is missing.
TEST_F(FleetrunTest, CollectiveProcessesGetTorchrunAndPaddleVariables) {
  const fs::path script = tmp_ / "check_env.sh";
  std::ofstream(script) << R"(#!/bin/sh
fail() { echo "check_env: $*"; exit 1; }
for v in RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT PADDLE_TRAINER_ID          PADDLE_TRAINERS_NUM PADDLE_CURRENT_ENDPOINT PADDLE_TRAINER_ENDPOINTS; do
  eval "val=\${$v}"; [ -n "$val" ] || fail "$v is not set"
done
[ "$RANK" = "$FLEET_RANK" ] || fail "RANK $RANK != FLEET_RANK $FLEET_RANK"
[ "$PADDLE_TRAINER_ID" = "$RANK" ] || fail "PADDLE_TRAINER_ID $PADDLE_TRAINER_ID != RANK $RANK"
[ "$WORLD_SIZE" = 3 ] && [ "$PADDLE_TRAINERS_NUM" = 3 ] && [ "$LOCAL_WORLD_SIZE" = 3 ] || fail "sizes"
[ "$LOCAL_RANK" = "$RANK" ] || fail "LOCAL_RANK $LOCAL_RANK on one node"
[ "$MASTER_ADDR" = 127.0.0.1 ] || fail "MASTER_ADDR $MASTER_ADDR"
n=0
for ep in $(echo "$PADDLE_TRAINER_ENDPOINTS" | tr , ' '); do
  [ $n = "$RANK" ] && { [ "$ep" = "$PADDLE_CURRENT_ENDPOINT" ] || fail "endpoint $n is $ep"; }
  n=$((n + 1))
done
[ $n = 3 ] || fail "PADDLE_TRAINER_ENDPOINTS has $n entries"
[ -z "$FLAGS_selected_gpus" ] || fail "FLAGS_selected_gpus set on a CPU rank"
echo "$MASTER_PORT" > "$1/master_port.$RANK"
echo "check_env rank $RANK ok"
)";
  fs::permissions(script, fs::perms::owner_all);
  const fs::path out = FixtureDir("env");
  RunResult res = Run({"--nproc_per_node=3", "--log_dir=" + log_.string(), "--http_port=0",
                       script.string(), out.string()});
  ASSERT_EQ(res.exit_code, 0) << res.out << res.err << ReadFile(log_ / "workerlog.1")
                              << ReadFile(log_ / "workerlog.2");
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(ReadFile(log_ / ("workerlog." + std::to_string(r))).find("ok"), std::string::npos);
  }
  // One rendezvous port for all, and it was free: nothing listens on it now.
  const std::string port = ReadFile(out / "master_port.0");
  EXPECT_EQ(ReadFile(out / "master_port.1"), port);
  EXPECT_EQ(ReadFile(out / "master_port.2"), port);
  // The table of the first process, as Paddle's fleetrun prints it.
  const size_t table = res.out.find("| Distributed Envs");
  ASSERT_NE(table, std::string::npos) << res.out;
  for (const char* name : {"| PADDLE_TRAINER_ID ", "| PADDLE_TRAINER_ENDPOINTS ", "| MASTER_PORT ",
                           "| RANK ", "| FLEET_RANK "}) {
    EXPECT_NE(res.out.find(name, table), std::string::npos) << name << "\n" << res.out;
  }
  EXPECT_EQ(res.out.find("FLEET_JOB_SECRET"), std::string::npos) << res.out;
}

// The README's simulation command given twice at once (no --http_port, no
// --job_id): each job's store takes a free port by itself.
TEST_F(FleetrunTest, TwoSimulationsWithoutHttpPortRunAtOnce) {
  fs::path fx1 = FixtureDir("fx1"), fx2 = FixtureDir("fx2");
  auto args = [&](const std::string& log) {
    return std::vector<std::string>{"--server_num=2", "--worker_num=2", "--config=" + config_.string(),
                                    "--bin_dir=" + fake_bin_.string(), "--log_dir=" + (tmp_ / log).string(),
                                    "--grace_period=2"};
  };
  Running one = Start(args("log1"), {"FIXTURE_DIR=" + fx1.string(), "FIXTURE_MODE_worker=connect"});
  Running two = Start(args("log2"), {"FIXTURE_DIR=" + fx2.string(), "FIXTURE_MODE_worker=connect"});
  RunResult r1 = Finish(one), r2 = Finish(two);
  EXPECT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  EXPECT_EQ(r2.exit_code, 0) << r2.out << r2.err;
  for (const RunResult* r : {&r1, &r2}) {
    EXPECT_EQ(r->out.find("127.0.0.1:36001"), std::string::npos) << r->out;
    EXPECT_NE(r->out.find("KV store serving on 127.0.0.1:"), std::string::npos) << r->out;
  }
}

// Every node given --master (none hosting the store): each says every few
// seconds what it waits for and who should host it, then times out.
TEST_F(FleetrunTest, NodesGivenMasterSayWhatTheyWaitFor) {
  // A bound but not listening socket: nothing answers on its port.
  const int sock = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string master = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto args = [&](const std::string& log) {
    return std::vector<std::string>{"--master=" + master, "--nnodes=2", "--rendezvous_timeout=9", "--auth=off",
                                    "--log_dir=" + (tmp_ / log).string(), (bin_ / "launch_fixture").string()};
  };
  Running one = Start(args("a"), {}), two = Start(args("b"), {});
  for (RunResult r : {Finish(one), Finish(two)}) {
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("fleetrun: still waiting ("), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" of 9 s) for the KV store at " + master), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("fleetrun --nnodes=2 --host=127.0.0.1 PROGRAM"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("Timeout: the KV store at " + master + " did not answer"), std::string::npos) << r.err;
  }
  close(sock);
}

TEST_F(FleetrunTest, SlurmIsSaidInOneLine) {
  fs::path fx = FixtureDir("fx");
  RunResult res = Run(CollectiveArgs(1), {"FIXTURE_DIR=" + fx.string(), "SLURM_PROCID=0", "SLURM_NODEID=0",
                                          "SLURM_NNODES=1", "SLURM_NODELIST=localhost"});
  EXPECT_EQ(res.exit_code, 0) << res.out << res.err;
  EXPECT_NE(res.out.find("fleetrun: Slurm detected (SLURM_* variables): node 0 of 1, KV store "), std::string::npos)
      << res.out;
}

TEST_F(FleetrunTest, SpammyWorkerZeroIsTeedCompletely) {
  fs::path fx = FixtureDir("fx");
  RunResult res = Run(CollectiveArgs(1), {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_collective=spam"});
  EXPECT_EQ(res.exit_code, 0) << res.err;
  EXPECT_NE(res.out.find("fixture spam line 99999 of collective 0\n"), std::string::npos);
  EXPECT_NE(ReadFile(log_ / "workerlog.0").find("fixture spam line 99999 of collective 0\n"), std::string::npos);
}

TEST_F(FleetrunTest, InvalidFlagsExitTwoWithOneLineAndStartNothing) {
  fs::path fx = FixtureDir("fx");
  const std::string cfg = "--config=" + config_.string(), bin = "--bin_dir=" + fake_bin_.string(),
                    logd = "--log_dir=" + log_.string(), fixture = (bin_ / "launch_fixture").string();
  struct Case {
    std::vector<std::string> args;
    std::string flag;
  };
  const std::vector<Case> cases = {
      {{"--servers=1.2.3:80", "--workers=127.0.0.1", cfg, bin, logd}, "--servers"},
      {{"--servers=127.0.0.1:7001,", "--workers=127.0.0.1", cfg, bin, logd}, "--servers"},
      {{"--server_num=3", "--servers=127.0.0.1:7001,127.0.0.1:7002", "--workers=127.0.0.1", cfg, bin, logd},
       "--server_num"},
      {{"--server_num=1", "--worker_num=1", bin, logd}, "--config"},
      {{"--server_num=1", "--worker_num=1", "--config=/nonexistent.yaml", bin, logd}, "--config"},
      {{logd}, "PROGRAM"},
      {{"--nproc_per_node=2", logd, "/nonexistent/program"}, "PROGRAM"},
      {{"--gpus=0", logd, fixture}, "--gpus"},
      {{"--server_num=1", "--worker_num=1", cfg, bin, logd, "--http_port=x"}, "--http_port"},
      {{"--server_num=1", "--worker_num=1", cfg, bin, logd, "--gpus=0"}, "--gpus"},
      {{"--bogus=1", logd}, "--bogus"},
  };
  for (const Case& c : cases) {
    RunResult res = Run(c.args, {"FIXTURE_DIR=" + fx.string()});
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(res.exit_code, 2) << joined << res.err;
    EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << joined << res.err;
    EXPECT_EQ(res.err.rfind("fleetrun: " + c.flag, 0), 0u) << joined << res.err;
    EXPECT_EQ(res.out, "") << joined;
    EXPECT_FALSE(fs::exists(log_)) << joined;
    EXPECT_TRUE(RecordedPids(fx).empty()) << joined;
  }
}

// Two jobs with the same log directory (default --job_id, --http_port=0):
// the second is refused with exit 2 naming the first's fleetrun pid and
// starts nothing, so the first's logs stay whole; once the first is gone
// the directory is free again.
TEST_F(FleetrunTest, SecondJobOnALiveJobsLogDirIsRefused) {
  fs::path fx1 = FixtureDir("fx1"), fx2 = FixtureDir("fx2");
  Running one = Start(PsArgs(1, 1), {"FIXTURE_DIR=" + fx1.string(), "FIXTURE_MODE_worker=hang"});
  const fs::path worker_log = log_ / "workerlog.0";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (ReadFile(worker_log).find("mode hang") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_NE(ReadFile(worker_log).find("mode hang"), std::string::npos);

  RunResult two = Run(PsArgs(1, 1), {"FIXTURE_DIR=" + fx2.string()});
  EXPECT_EQ(two.exit_code, 2) << two.err;
  EXPECT_EQ(two.err.rfind("fleetrun: --log_dir: ", 0), 0u) << two.err;
  EXPECT_NE(two.err.find("job default host (one machine) pid " + std::to_string(one.pid)),
            std::string::npos)
      << two.err;
  EXPECT_TRUE(RecordedPids(fx2).empty());
  EXPECT_NE(ReadFile(worker_log).find("mode hang"), std::string::npos);

  ASSERT_EQ(kill(one.pid, SIGTERM), 0);
  Finish(one);
  RunResult three = Run(PsArgs(1, 1), {"FIXTURE_DIR=" + fx2.string()});
  EXPECT_EQ(three.exit_code, 0) << three.err;
}

// A log file planted as a symbolic link is refused, not followed: its
// target keeps its content.
TEST_F(FleetrunTest, LogFilePlantedAsASymlinkIsNotFollowed) {
  fs::path fx = FixtureDir("fx");
  fs::create_directories(log_);
  const fs::path target = tmp_ / "precious";
  std::ofstream(target) << "keep me\n";
  fs::create_symlink(target, log_ / "serverlog.0");
  RunResult res = Run(PsArgs(1, 1), {"FIXTURE_DIR=" + fx.string()});
  EXPECT_NE(res.exit_code, 0);
  EXPECT_NE(res.err.find("serverlog.0"), std::string::npos) << res.err;
  EXPECT_EQ(ReadFile(target), "keep me\n");
  EXPECT_TRUE(RecordedPids(fx).empty());
}

// Links planted where fleetrun writes in its log folder: at metrics.jsonl
// (JSON was appended to the target) and at recovery, where --max_restart
// puts the servers' push logs (337 MB went into the target). Neither is
// followed: the recovery link refuses the job at once (exit 2, naming it),
// the metrics link is skipped with a warning and the job runs.
TEST_F(FleetrunTest, LinksPlantedInTheLogFolderAreNotFollowed) {
  fs::path fx = FixtureDir("fx");
  fs::create_directories(log_);
  const fs::path target_file = tmp_ / "precious";
  const fs::path target_dir = FixtureDir("precious_dir");
  std::ofstream(target_file) << "keep me\n";
  fs::create_symlink(target_file, log_ / "metrics.jsonl");
  fs::create_directory_symlink(target_dir, log_ / "recovery");
  std::vector<std::string> args = PsArgs(1, 1);
  args.push_back("--max_restart=1");
  RunResult refused = Run(args, {"FIXTURE_DIR=" + fx.string()});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("symbolic link"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("recovery"), std::string::npos) << refused.err;
  EXPECT_TRUE(fs::is_empty(target_dir));
  EXPECT_TRUE(RecordedPids(fx).empty());

  fs::remove(log_ / "recovery");
  RunResult ran = Run(PsArgs(1, 1), {"FIXTURE_DIR=" + fx.string()});
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  EXPECT_EQ(ReadFile(target_file), "keep me\n");
  EXPECT_TRUE(fs::is_empty(target_dir));
}

// Rank 1 dies after rank 0 created and published its shared-memory segment
// but before mapping it; rank 0, still in the rendezvous, is stopped by
// fleetrun and cannot remove the segment: fleetrun removes it.
TEST_F(FleetrunTest, RankDyingInTheShmRendezvousLeavesNoSegment) {
  fs::path fx = FixtureDir("fx");
  RunResult res = Run(CollectiveArgs(2), {"FIXTURE_DIR=" + fx.string(), "FIXTURE_MODE_collective=shm_join",
                                          "FIXTURE_MODE_collective_1=shm_die"});
  EXPECT_EQ(res.exit_code, 1) << res.err;
  const std::string segment = ReadFile(fx / "segment.collective.1");
  ASSERT_EQ(segment.rfind("/fleet-", 0), 0u) << "rank 0 never published its segment: " << res.err;
  EXPECT_FALSE(fs::exists("/dev/shm" + segment)) << segment;
  for (pid_t pid : RecordedPids(fx)) {
    for (const auto& e : fs::directory_iterator("/dev/shm")) {
      EXPECT_NE(e.path().filename().string().rfind("fleet-" + std::to_string(pid) + "-", 0), 0u) << e.path();
    }
  }
}

// The whole job config is loaded before anything starts: a bad `-o` is named
// (not the YAML file, which is fine), a bad file is named, a duplicate key is
// an error, and an unwritable save_dir fails with exit 2 as well.
TEST_F(FleetrunTest, BadJobConfigExitsTwoNamingTheCulpritAndStartsNothing) {
  fs::path fx = FixtureDir("fx");
  const fs::path dup = tmp_ / "dup.yaml", plain = tmp_ / "plain_file";
  std::ofstream(dup) << ReadFile(config_) << "model: {kind: mlp}\n";
  std::ofstream(plain) << "x";
  struct Case {
    std::vector<std::string> extra;
    std::string message;  // what the one line of stderr starts with
  };
  const std::vector<Case> cases = {
      {{"-o", "train.batchsize=1"}, "fleetrun: -o train.batchsize=1: unknown key: train.batchsize"},
      {{"-o", "train.epochs=2", "-o", "Distributed.mode=fast"}, "fleetrun: -o Distributed.mode=fast: "},
      {{"-o", "train.batch_size=0"}, "fleetrun: -o train.batch_size=0: "},
      {{"--config=" + dup.string()}, "fleetrun: duplicate key model at line 6 (first at line 4)"},
      {{"-o", "train.save_dir=" + (plain / "ckpt").string()}, "fleetrun: train.save_dir: "},
      {{"-o", "server.save_dir=" + (plain / "ckpt").string()}, "fleetrun: server.save_dir: "},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = PsArgs(1, 1);
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    RunResult res = Run(args, {"FIXTURE_DIR=" + fx.string()});
    const std::string joined = c.extra.back();
    EXPECT_EQ(res.exit_code, 2) << joined << res.err;
    EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << joined << res.err;
    EXPECT_EQ(res.err.rfind(c.message, 0), 0u) << joined << res.err;
    EXPECT_EQ(res.err.find(config_.string()), std::string::npos) << joined << res.err;
    EXPECT_EQ(res.out, "") << joined;
    EXPECT_TRUE(RecordedPids(fx).empty()) << joined;
  }
}

}  // namespace
