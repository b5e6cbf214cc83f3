// The by-hand recipe of README.md ("By hand"): fleetrun --store_only hosts
// the KV store, and 2 ps_server and 2 ps_worker processes are started the
// way the design card shows them, with the flags fleetrun takes (a bare ip
// in --workers, each server's rank from the position of its --endpoint in
// --servers). Also: a second server given a rank already taken is refused
// at registration, naming the holder.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "comm/job_auth.h"
#include "comm/kv_store.h"
#include "comm/progress_report.h"
#include "tests/child_process.h"

namespace fleet {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing::BinPath;
using testing::Child;
using testing::Exit;
using testing::ReadAll;

// `count` distinct ports free now (bound together, then closed).
std::vector<int> FreePorts(int count) {
  std::vector<int> fds, ports;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("cannot bind a free port");
    }
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  return ports;
}

// Waits (bounded) until `path` holds a match of `pattern`; returns group 1.
std::string WaitForLine(const fs::path& path, const std::regex& pattern, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::smatch m;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string text = ReadAll(path);
    if (std::regex_search(text, m, pattern)) return m[1];
    std::this_thread::sleep_for(milliseconds(50));
  }
  return "";
}

class ByHandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fleet_by_hand_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    secret_ = (dir_ / "job.secret").string();
    std::ofstream(secret_) << std::string(64, 'a') << "\n";
    fs::permissions(secret_, fs::perms::owner_read | fs::perms::owner_write);
    store_ = std::make_unique<Child>(
        std::vector<std::string>{BinPath("fleetrun"), "--store_only", "--http_port=0",
                                 "--job_secret_file=" + secret_,
                                 "--log_dir=" + (dir_ / "log").string()},
        env_, (dir_ / "store.log").string());
    const std::string port =
        WaitForLine(dir_ / "store.log", std::regex(R"(KV store serving on 127\.0\.0\.1:(\d+))"),
                    milliseconds(20000));
    ASSERT_FALSE(port.empty()) << ReadAll(dir_ / "store.log");
    kv_ = "127.0.0.1:" + port;
  }
  void TearDown() override {
    if (store_) {
      kill(store_pid(), SIGTERM);
      store_->Wait(milliseconds(10000));
    }
    fs::remove_all(dir_);
  }
  pid_t store_pid() const { return store_->pid(); }

  // The flags every process of the recipe shares.
  std::vector<std::string> Common(const std::string& servers) const {
    const fs::path data = dir_ / "data";
    return {"--servers=" + servers,
            "--workers=127.0.0.1,127.0.0.1",
            "--kv_endpoint=" + kv_,
            "--job_secret_file=" + secret_,
            "--config=" + testing::SourcePath("configs/ctr_dnn.yaml"),
            "--override=data.train=" + (data / "train").string() +
                ";data.test=" + (data / "test").string() +
                ";data.oracle=" + (data / "oracle.txt").string() + ";train.epochs=2"};
  }
  std::unique_ptr<Child> StartServer(const std::string& endpoint, const std::string& servers,
                                     std::vector<std::string> extra, const std::string& log) {
    std::vector<std::string> args = {BinPath("ps_server"), "--endpoint=" + endpoint};
    for (const std::string& a : Common(servers)) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(args, env_, (dir_ / log).string());
  }

  // The CTR data of every job here: 2 train files and 1 test file.
  void GenerateData(int lines_per_file) {
    Child gen({BinPath("gen_ctr_data"), "--out_dir=" + (dir_ / "data").string(), "--train_files=2",
               "--test_files=1", "--lines_per_file=" + std::to_string(lines_per_file)},
              env_, (dir_ / "gen.log").string());
    ASSERT_EQ(gen.Wait(milliseconds(60000)).code, 0) << ReadAll(dir_ / "gen.log");
  }
  // Two free loopback endpoints: the --servers list.
  static std::vector<std::string> TwoServerEndpoints() {
    const std::vector<int> ports = FreePorts(2);
    return {"127.0.0.1:" + std::to_string(ports[0]), "127.0.0.1:" + std::to_string(ports[1])};
  }
  std::unique_ptr<Child> StartWorker(int rank, const std::string& servers,
                                     std::vector<std::string> extra) {
    std::vector<std::string> args = {BinPath("ps_worker"), "--rank=" + std::to_string(rank)};
    for (const std::string& a : Common(servers)) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<Child>(args, env_,
                                   (dir_ / ("worker" + std::to_string(rank) + ".log")).string());
  }

  const std::vector<std::string> env_ = {"PATH=/usr/bin:/bin"};
  fs::path dir_;
  std::string secret_, kv_;
  std::unique_ptr<Child> store_;
};

TEST_F(ByHandTest, TwoServersTwoWorkersTrainThroughTheStore) {
  ASSERT_NO_FATAL_FAILURE(GenerateData(20000));
  const std::vector<std::string> endpoints = TwoServerEndpoints();
  const std::string &s0 = endpoints[0], &s1 = endpoints[1];
  const std::string servers = s0 + "," + s1;
  // No --rank: each is the position of its --endpoint in --servers.
  std::unique_ptr<Child> server0 =
      StartServer(s0, servers, {"--status_every_s=0.5"}, "server0.log");
  std::unique_ptr<Child> server1 =
      StartServer(s1, servers, {"--status_every_s=0.5"}, "server1.log");
  std::vector<std::unique_ptr<Child>> workers;
  for (int r = 0; r < 2; ++r) workers.push_back(StartWorker(r, servers, {}));
  for (int r = 0; r < 2; ++r) {
    const Exit exit = workers[r]->Wait(milliseconds(150000));
    EXPECT_TRUE(exit.exited && exit.code == 0)
        << ReadAll(dir_ / ("worker" + std::to_string(r) + ".log")) << ReadAll(dir_ / "server0.log")
        << ReadAll(dir_ / "server1.log");
  }
  const std::string log0 = ReadAll(dir_ / "worker0.log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log0, m, std::regex(R"(summary: held-out auc ([0-9.]+))"))) << log0;
  // 40k lines and 2 epochs, as worker_fleetrun_ctr_test: the job learns.
  EXPECT_GT(std::stod(m[1]), 0.70) << log0;
  EXPECT_NE(ReadAll(dir_ / "server0.log").find("ps_server 0 listening on " + s0),
            std::string::npos);
  EXPECT_NE(ReadAll(dir_ / "server1.log").find("ps_server 1 listening on " + s1),
            std::string::npos);
  // Servers log their status while they serve.
  const std::string server_log = ReadAll(dir_ / "server0.log");
  EXPECT_TRUE(std::regex_search(
      server_log,
      std::regex(
          R"(ps_server 0: requests/s \{[^}]*pull_sparse [0-9.]+[^}]*\}, in [0-9.]+ MiB/s, out [0-9.]+ MiB/s, table 0: \d+ rows [0-9.]+ MiB.*, rss \d+ MiB \(peak \d+ MiB\), push log off)")))
      << server_log;
  for (Child* server : {server0.get(), server1.get()}) {
    kill(server->pid(), SIGTERM);
    const Exit exit = server->Wait(milliseconds(20000));
    EXPECT_TRUE(exit.exited && exit.code == 0);
  }
  kill(store_pid(), SIGTERM);
  const Exit stopped = store_->Wait(milliseconds(10000));
  store_.reset();
  EXPECT_TRUE(stopped.exited && stopped.code == 0) << ReadAll(dir_ / "store.log");
}

TEST_F(ByHandTest, ASecondServerWithATakenRankIsRefusedNamingTheHolder) {
  const std::vector<std::string> endpoints = TwoServerEndpoints();
  const std::string &s0 = endpoints[0], &s1 = endpoints[1];
  const std::string servers = s0 + "," + s1;
  std::unique_ptr<Child> first = StartServer(s0, servers, {"--rank=0"}, "first.log");
  ASSERT_FALSE(
      WaitForLine(dir_ / "first.log", std::regex(R"((listening on))"), milliseconds(20000)).empty())
      << ReadAll(dir_ / "first.log");
  std::unique_ptr<Child> second = StartServer(s1, servers, {"--rank=0"}, "second.log");
  const Exit exit = second->Wait(milliseconds(30000));
  const std::string log = ReadAll(dir_ / "second.log");
  EXPECT_TRUE(exit.exited && exit.code == 2) << log;
  EXPECT_NE(log.find("server rank 0 is already taken by " + s0 + " (this is " + s1 + ")"),
            std::string::npos)
      << log;
  kill(first->pid(), SIGTERM);
  first->Wait(milliseconds(20000));
}

// fleetrun serves the progress processes report as Prometheus text on
// /metrics: on loopback to any user of the machine (read-only), while the
// store's keys stay the job's.
TEST_F(ByHandTest, StoreServesReportedProgressOnMetrics) {
  Result<std::shared_ptr<const JobAuth>> auth = JobAuth::FromFile(secret_);
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  KvStoreClient job(kv_, "default", {.auth = *auth});
  const int64_t now_ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  ProgressValue progress;
  progress.step = 40;
  progress.total_steps = 100;
  progress.samples_per_s = 2560.0;
  progress.unix_ms = now_ms;
  ASSERT_TRUE(job.Set(ProgressKey("worker", 1), FormatProgressValue(progress)).ok());
  const std::regex step(R"(fleet_process_steps_total\{rank="1",role="worker"\} 40\n)");
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline && !std::regex_search(text, step)) {
    Result<std::string> metrics = job.Metrics();
    ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
    text = *metrics;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(std::regex_search(text, step)) << text;
  EXPECT_NE(text.find("# TYPE fleet_process_samples_per_second gauge"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(fleet_process_samples_per_second{rank="1",role="worker"} 2560)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(fleet_process_total_steps{rank="1",role="worker"} 100)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("fleet_process_last_report_timestamp_seconds{rank=\"1\",role=\"worker\"} " +
                      std::to_string(now_ms / 1000)),
            std::string::npos)
      << text;
  // Without the job's credential: /metrics reads (the store is on loopback),
  // the job's keys do not.
  KvStoreClient stranger(kv_, "default", {});
  EXPECT_TRUE(stranger.Metrics().ok());
  EXPECT_FALSE(stranger.Get(ProgressKey("worker", 1)).ok());
  const std::string jsonl = ReadAll(dir_ / "log" / "metrics.jsonl");
  EXPECT_NE(jsonl.find(
                R"("job": "default", "role": "worker", "rank": 1, "step": 40, "total_steps": 100)"),
            std::string::npos)
      << jsonl;
}

// By hand, a dead peer is noticed through the store within seconds: after
// kill -9 of worker 1 mid-training, worker 0 and both servers say which
// process died and exit 1 (without the watch they waited a minute, the
// servers forever).
TEST_F(ByHandTest, AKilledWorkerStopsEveryOtherProcessNamingIt) {
  ASSERT_NO_FATAL_FAILURE(GenerateData(4000));
  const std::vector<std::string> endpoints = TwoServerEndpoints();
  const std::string servers = endpoints[0] + "," + endpoints[1];
  std::vector<std::unique_ptr<Child>> others;
  for (int s = 0; s < 2; ++s) {
    others.push_back(StartServer(endpoints[s], servers, {}, "server" + std::to_string(s) + ".log"));
  }
  others.push_back(StartWorker(0, servers, {"-o", "train.epochs=100"}));
  std::unique_ptr<Child> victim = StartWorker(1, servers, {"-o", "train.epochs=100"});
  ASSERT_FALSE(
      WaitForLine(dir_ / "worker0.log", std::regex(R"((epoch 1 step))"), milliseconds(60000))
          .empty())
      << ReadAll(dir_ / "worker0.log");
  const pid_t victim_pid = victim->pid();
  kill(victim_pid, SIGKILL);
  victim->Wait(milliseconds(10000));
  const auto killed = std::chrono::steady_clock::now();
  for (size_t i = 0; i < others.size(); ++i) {
    const std::string log =
        (dir_ / (i < 2 ? "server" + std::to_string(i) + ".log" : "worker0.log")).string();
    const Exit exit = others[i]->Wait(milliseconds(15000));
    ASSERT_TRUE(exit.exited) << log << ":\n" << ReadAll(log);
    EXPECT_EQ(exit.code, 1) << ReadAll(log);
    EXPECT_NE(ReadAll(log).find("worker 1 (host "), std::string::npos) << ReadAll(log);
    EXPECT_NE(
        ReadAll(log).find("pid " + std::to_string(victim_pid) + ") stopped: its process is gone"),
        std::string::npos)
        << ReadAll(log);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::printf("every process stopped %.1f s after kill -9 of worker 1\n", seconds);
}

// A store kept across runs (the same job id) holds the last run's beats,
// "done" marks and failure: the next run is not fooled by them. Here a run
// that failed (kill -9 of a worker), then one that completes.
TEST_F(ByHandTest, AStoreKeptAcrossRunsServesTheNextRun) {
  ASSERT_NO_FATAL_FAILURE(GenerateData(2000));
  for (const bool kill_worker_1 : {true, false}) {
    SCOPED_TRACE(kill_worker_1 ? "run with kill -9" : "clean run");
    const std::vector<std::string> endpoints = TwoServerEndpoints();
    const std::string servers = endpoints[0] + "," + endpoints[1];
    std::vector<std::unique_ptr<Child>> processes;
    for (int s = 0; s < 2; ++s) {
      processes.push_back(
          StartServer(endpoints[s], servers, {}, "server" + std::to_string(s) + ".log"));
    }
    for (int r = 0; r < 2; ++r) {
      processes.push_back(
          StartWorker(r, servers, {"-o", kill_worker_1 ? "train.epochs=100" : "train.epochs=1"}));
    }
    if (kill_worker_1) {
      ASSERT_FALSE(
          WaitForLine(dir_ / "worker0.log", std::regex(R"((epoch 1 step))"), milliseconds(60000))
              .empty())
          << ReadAll(dir_ / "worker0.log");
      kill(processes[3]->pid(), SIGKILL);
    }
    for (size_t i = 0; i < processes.size(); ++i) {
      const std::string log = (dir_ / (i < 2 ? "server" + std::to_string(i) + ".log"
                                             : "worker" + std::to_string(i - 2) + ".log"))
                                  .string();
      const Exit exit = processes[i]->Wait(milliseconds(30000));
      ASSERT_FALSE(exit.timed_out) << ReadAll(log);
      if (!kill_worker_1) {
        EXPECT_EQ(exit.code, 0) << ReadAll(log);
      }
    }
    if (!kill_worker_1) {
      EXPECT_NE(ReadAll(dir_ / "worker0.log").find("summary: held-out auc"), std::string::npos)
          << ReadAll(dir_ / "worker0.log");
    }
  }
}

// Two workers without a store fail at once, before reading any data.
TEST_F(ByHandTest, SeveralWorkersWithoutAStoreAreToldBeforeLoadingData) {
  Child worker(
      {BinPath("ps_worker"), "--rank=1", "--servers=127.0.0.1:0", "--workers=127.0.0.1,127.0.0.1",
       "--auth=off", "--config=" + testing::SourcePath("configs/ctr_dnn.yaml")},
      env_, (dir_ / "worker.log").string());
  const Exit exit = worker.Wait(milliseconds(20000));
  const std::string log = ReadAll(dir_ / "worker.log");
  EXPECT_TRUE(exit.exited && exit.code == 2) << log;
  EXPECT_NE(log.find("2 workers meet through a KV store: give --kv_endpoint"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace fleet
