// ps_server as real processes: 2 servers x 3 clients over TCP, endpoints
// discovered through the KV store (port 0), and a graceful SIGTERM that
// finishes requests, saves, and exits 0. Process death is the point here,
// so this is a multi-process test (the in-process fixture can't kill a
// server).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include <gtest/gtest.h>

#include "comm/cluster.h"
#include "comm/kv_store.h"
#include "tests/child_process.h"
#include "tests/ps/ps_cluster.h"
#include "tests/test_paths.h"

namespace fleet::ps {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using fleet::testing::Child;
using fleet::testing::ChildOptions;
using fleet::testing::Exit;

// The job secret the servers get (FLEET_JOB_SECRET, as fleetrun hands it
// down): their traffic is authenticated, so the clients here need the same keys.
constexpr char kSecret[] = "ps-server-process-test-secret-0123456789abcdef";

std::shared_ptr<const JobAuth> TestAuth() { return JobAuth::FromSecret(kSecret, "test").value(); }

// Worker `rank` of `num_workers`, with the job's secret, on `servers`.
std::unique_ptr<PsClient> Connect(const JobConfig& job, std::vector<std::string> servers,
                                  int rank = 0, int num_workers = 1) {
  PsClientOptions o;
  o.servers = std::move(servers);
  o.worker_rank = rank;
  o.num_workers = num_workers;
  o.auth = TestAuth();
  return PsClient::Create(o, job).value();
}

constexpr char kTables[] =
    "tables:\n"
    "  - {id: 0, kind: sparse, dim: 2, shard_num: 20, optimizer: {rule: sgd, learning_rate: 1.0}}\n"
    "  - {id: 1, kind: dense, dim: 7, optimizer: {rule: sgd, learning_rate: 1.0}}\n";

class ServerProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("fleet_ps_process_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    save_dir_ = dir_ / "ckpt";
    config_ = dir_ / "job.yaml";
    std::ofstream(config_) << "Distributed: {mode: async, timeout_ms: 5000}\n"
                           << "server: {save_dir: " << save_dir_.string() << "}\n"
                           << kTables;
    kv_ = std::make_unique<KvStoreServer>(KvStoreServerOptions{});
    ASSERT_TRUE(kv_->Start().ok());
    server_bin_ = fleet::testing::BinPath("ps_server");
    ASSERT_TRUE(fs::exists(server_bin_)) << server_bin_;
  }

  void TearDown() override {
    servers_.clear();  // kills and reaps what still runs
    fs::remove_all(dir_);
  }

  // Starts a process with stderr to `log`.
  void Spawn(std::vector<std::string> args, const fs::path& log,
             std::vector<std::string> extra_env = {}) {
    extra_env.push_back(std::string("FLEET_JOB_SECRET=") + kSecret);
    servers_.emplace_back(args, ChildOptions{.env = std::move(extra_env), .stderr_file = log.string()});
  }

  // Starts server `rank` of `n`; returns its bound endpoint from the store.
  std::string StartServer(int rank, int n, std::vector<std::string> extra_env = {}) {
    std::vector<std::string> args = {
        server_bin_,
        "--endpoint=127.0.0.1:0",
        "--rank=" + std::to_string(rank),
        "--world_size=" + std::to_string(n),
        "--num_workers=3",
        "--config=" + config_.string(),
        "--kv_endpoint=" + kv_->endpoint(),
        "--job_id=proc",
        "--role=server"};
    // A rank started again publishes again: wait for its new value, not the old.
    (void)KvStoreClient(kv_->endpoint(), "proc").Delete(EndpointKey(Role::kServer, rank));
    Spawn(std::move(args), dir_ / ("serverlog." + std::to_string(rank)), std::move(extra_env));
    KvStoreClient kv(kv_->endpoint(), "proc");
    auto endpoint = kv.WaitGet(EndpointKey(Role::kServer, rank), 15s);
    EXPECT_TRUE(endpoint.ok()) << endpoint.status().ToString();
    return endpoint.ok() ? endpoint.value() : "";
  }

  // Waits for a server process to exit, at most `timeout`; its exit code,
  // or -1 on timeout, or 128+signal.
  int WaitExit(size_t index, std::chrono::milliseconds timeout) {
    const Exit exit = servers_[index].Wait(timeout);
    return exit.timed_out ? -1 : exit.ShellCode();
  }


  fs::path dir_, save_dir_, config_;
  std::string server_bin_;
  std::unique_ptr<KvStoreServer> kv_;
  std::vector<Child> servers_;
};

TEST_F(ServerProcesses, TwoServersThreeClientsThenGracefulSigtermSaves) {
  const std::vector<std::string> endpoints = {StartServer(0, 2), StartServer(1, 2)};
  ASSERT_FALSE(endpoints[0].empty());
  ASSERT_FALSE(endpoints[1].empty());
  auto job = LoadJobConfig(config_.string(), {});
  ASSERT_TRUE(job.ok()) << job.status().ToString();

  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < 3; ++w) clients.push_back(Connect(job.value(), endpoints, w, 3));
  std::vector<uint64_t> keys(64);
  std::iota(keys.begin(), keys.end(), 1000);
  const std::vector<float> ones(keys.size() * 2, 1.0f);

  // Clients push until the servers go away; each counts acknowledged pushes.
  std::atomic<bool> sigterm_sent{false};
  std::vector<int> acked(3, 0);
  std::vector<Status> last_error(3);
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 100000; ++i) {
        Status s = clients[w]->PushSparseGrad(0, keys, ones);
        if (!s.ok()) {
          last_error[w] = s;
          return;
        }
        ++acked[w];
        if (acked[w] == 50 && w == 0) sigterm_sent.store(true);
      }
    });
  }
  while (!sigterm_sent.load()) std::this_thread::sleep_for(1ms);
  servers_[0].Kill(SIGTERM);
  servers_[1].Kill(SIGTERM);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitExit(0, 15s), 0) << "server 0 must exit 0 after SIGTERM";
  EXPECT_EQ(WaitExit(1, 15s), 0) << "server 1 must exit 0 after SIGTERM";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (auto& t : threads) t.join();
  for (int w = 0; w < 3; ++w) {
    // Clients see the shutdown as an error, never a hang.
    EXPECT_TRUE(last_error[w].IsUnavailable() || last_error[w].IsTimeout())
        << last_error[w].ToString();
  }

  // Load what the servers saved into a fresh (in-process) job: every push
  // a client saw acknowledged is in it. A push whose reply was lost in the
  // shutdown may be in it too, at most one per client.
  const int total_acked = acked[0] + acked[1] + acked[2];
  testing::PsCluster fresh(job.value(), 2, 1);
  ASSERT_TRUE(fresh.client(0).Load(save_dir_.string()).ok());
  std::vector<float> values(keys.size() * 2);
  ASSERT_TRUE(fresh.client(0).PullSparse(0, keys, values).ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const int applied = static_cast<int>(-values[i]);
    EXPECT_GE(applied, total_acked) << "element " << i;
    EXPECT_LE(applied, total_acked + 3) << "element " << i;
  }
}

TEST_F(ServerProcesses, RestartedServerReloadsItsSaveDir) {
  auto job = LoadJobConfig(config_.string(), {});
  ASSERT_TRUE(job.ok());
  const std::vector<uint64_t> keys = {1, 2, 3};
  auto pull = [&](const std::string& endpoint) {
    auto c = Connect(job.value(), {endpoint});
    std::vector<float> v(keys.size() * 2);
    EXPECT_TRUE(c->PullSparse(0, keys, v).ok());
    return std::make_pair(std::move(c), v);
  };
  {
    auto [c, v] = pull(StartServer(0, 1));
    ASSERT_TRUE(c->PushSparseGrad(0, keys, std::vector<float>(6, 1.5f)).ok());
    servers_[0].Kill(SIGTERM);  // graceful: saves into server.save_dir
    ASSERT_EQ(WaitExit(0, 15s), 0);
  }
  // A plain start begins empty; a restart (as fleetrun --max_restart does)
  // reloads what was saved.
  {
    auto [c, v] = pull(StartServer(0, 1));
    EXPECT_EQ(v, std::vector<float>(6, 0.0f));
    servers_[1].Kill(SIGKILL);
    WaitExit(1, 5s);
  }
  auto [c, v] = pull(StartServer(0, 1, {"FLEET_RESTART=1"}));
  EXPECT_EQ(v, std::vector<float>(6, -1.5f));
}

// SIGINT is how fleetrun stops the servers of an abandoned job (a process
// failed, Ctrl-C): the server stops without its final save, so save_dir
// keeps the last finished job's tables rather than an unfinished state.
TEST_F(ServerProcesses, InterruptedServerLeavesItsSaveDirAlone) {
  auto job = LoadJobConfig(config_.string(), {});
  ASSERT_TRUE(job.ok());
  const std::vector<uint64_t> keys = {1, 2, 3};
  auto connect = [&](const std::string& endpoint) { return Connect(job.value(), {endpoint}); };
  auto pull = [&](PsClient& c) {
    std::vector<float> v(keys.size() * 2);
    EXPECT_TRUE(c.PullSparse(0, keys, v).ok());
    return v;
  };
  {
    auto c = connect(StartServer(0, 1));
    ASSERT_TRUE(c->PushSparseGrad(0, keys, std::vector<float>(6, 1.5f)).ok());
    servers_[0].Kill(SIGTERM);  // a finished job: saved
    ASSERT_EQ(WaitExit(0, 15s), 0);
  }
  {
    auto c = connect(StartServer(0, 1, {"FLEET_RESTART=1"}));
    EXPECT_EQ(pull(*c), std::vector<float>(6, -1.5f));
    ASSERT_TRUE(c->PushSparseGrad(0, keys, std::vector<float>(6, 1.5f)).ok());
    EXPECT_EQ(pull(*c), std::vector<float>(6, -3.0f));
    servers_[1].Kill(SIGINT);  // an abandoned job
    ASSERT_EQ(WaitExit(1, 15s), 0);
  }
  std::ifstream in(dir_ / "serverlog.0");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("stopping without the final save"), std::string::npos) << log;
  auto c = connect(StartServer(0, 1, {"FLEET_RESTART=1"}));
  EXPECT_EQ(pull(*c), std::vector<float>(6, -1.5f)) << "the abandoned state was saved";
}

// server.recovery_dir through a real crash: kill -9 while three clients
// push (async), restart with FLEET_RESTART=1 as fleetrun --max_restart
// does: every acknowledged push is in the restarted server, from its last
// recovery checkpoint plus the replayed push log. push_log_sync none is
// enough against a process crash: the records are in the OS. The clients
// resend to the lost server for 1 s (not the default 30: the server is
// restarted only once they have given up and every ack is counted).
TEST_F(ServerProcesses, KillNineThenRestartKeepsEveryAcknowledgedPush) {
  std::ofstream(config_) << "Distributed: {mode: async, timeout_ms: 5000, "
                            "server_restart_timeout_ms: 1000}\n"
                         << "server: {recovery_dir: " << (dir_ / "recovery").string()
                         << ", checkpoint_every: 64, push_log_sync: none}\n"
                         << kTables;
  auto job = LoadJobConfig(config_.string(), {});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto client = [&](const std::string& endpoint, int rank) {
    return Connect(job.value(), {endpoint}, rank, 3);
  };
  const std::string endpoint = StartServer(0, 1);
  ASSERT_FALSE(endpoint.empty());
  std::vector<uint64_t> keys(64);
  std::iota(keys.begin(), keys.end(), 1000);
  const std::vector<float> ones(keys.size() * 2, 1.0f);
  std::vector<int> acked(3, 0);
  std::atomic<bool> kill_now{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      auto c = client(endpoint, w);
      for (int i = 0; i < 100000; ++i) {
        if (!c->PushSparseGrad(0, keys, ones).ok()) return;
        if (++acked[w] == 300 && w == 0) kill_now.store(true);
      }
    });
  }
  while (!kill_now.load()) std::this_thread::sleep_for(1ms);
  servers_[0].Kill(SIGKILL);
  EXPECT_EQ(WaitExit(0, 15s), 128 + SIGKILL);
  for (auto& t : threads) t.join();
  const int total_acked = acked[0] + acked[1] + acked[2];

  const std::string restarted = StartServer(0, 1, {"FLEET_RESTART=1"});
  ASSERT_FALSE(restarted.empty());
  auto c = client(restarted, 0);
  std::vector<float> values(keys.size() * 2);
  ASSERT_TRUE(c->PullSparse(0, keys, values).ok());
  // A push applied (logged) whose reply the kill cut off counts too: at
  // most one per client.
  for (size_t i = 0; i < values.size(); ++i) {
    const int applied = static_cast<int>(-values[i]);
    EXPECT_GE(applied, total_acked) << "element " << i << ": acknowledged pushes lost";
    EXPECT_LE(applied, total_acked + 3) << "element " << i;
  }
  std::ifstream log(dir_ / "serverlog.0");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("recovered table 0: checkpoint step"), std::string::npos) << text;
  EXPECT_NE(text.find("lost 0 acknowledged updates"), std::string::npos);
}

TEST_F(ServerProcesses, BadConfigExitsTwoWithReason) {
  std::ofstream(config_) << "tables:\n  - {id: 0, kind: sparse, dim: 0}\n";
  const fs::path log = dir_ / "bad.log";
  Spawn({server_bin_, "--config=" + config_.string(), "--rank=0"}, log);
  EXPECT_EQ(WaitExit(0, 10s), 2);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("dim"), std::string::npos) << text;
}

// Every start-up error is printed and ends the program with exit code 2,
// never a signal: ~PsServer of a half-built server used to dereference its
// missing transport (SIGSEGV, exit 139, empty log), which lost the reason
// of a missing, corrupt, truncated or mismatched checkpoint, a bad shard
// count or an unwritable save_dir.
TEST_F(ServerProcesses, StartupErrorsArePrintedAndExitTwoNotASignal) {
  // A real checkpoint of the job's tables, saved by an in-process server.
  const fs::path ckpt = dir_ / "good_ckpt";
  {
    auto job = LoadJobConfig(config_.string(), {});
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    testing::PsCluster cluster(job.value(), 1, 1,
                               [&](PsServerOptions& o) { o.job.server.save_dir = ckpt.string(); });
    ASSERT_TRUE(cluster.client(0).PushSparseGrad(0, std::vector<uint64_t>{1, 2, 3},
                                                 std::vector<float>(6, 1.0f))
                    .ok());
    ASSERT_TRUE(cluster.client(0).Save(ckpt.string(), false).ok());
  }
  // A copy of it with one shard file damaged by `damage`.
  auto damaged = [&](const std::string& name, const std::function<void(const fs::path&)>& damage) {
    const fs::path copy = dir_ / name;
    fs::copy(ckpt, copy, fs::copy_options::recursive);
    for (const auto& entry : fs::recursive_directory_iterator(copy)) {
      if (entry.is_regular_file() && entry.path().filename().string().find("shard") != std::string::npos &&
          fs::file_size(entry.path()) > 40) {
        damage(entry.path());
        break;
      }
    }
    return copy.string();
  };
  const std::string corrupt = damaged("corrupt", [](const fs::path& f) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(40);
    io.put('\x5a');
  });
  const std::string truncated =
      damaged("truncated", [](const fs::path& f) { fs::resize_file(f, fs::file_size(f) - 3); });
  const fs::path plain_file = dir_ / "plain_file";
  std::ofstream(plain_file) << "x";

  struct Case {
    std::string override_text;
    int world_size;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"server.load_dir=/tmp/fleet_nonexistent_ckpt_dir", 1, "load_dir"},
      {"server.load_dir=" + corrupt, 1, "Corruption"},
      {"server.load_dir=" + truncated, 1, "Corruption"},
      {"server.load_dir=" + ckpt.string() + ";tables.1.dim=8", 1, "dim differs"},
      {"tables.0.shard_num=1", 2, "shard"},
      {"server.save_dir=" + (plain_file / "ckpt").string(), 1, "not writable"},
      {"server.threads=100000", 1, "server.threads"},
      {"Distribued.mode=async", 1, "Distribued"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.override_text);
    const fs::path log = dir_ / ("start_error." + std::to_string(i));
    Spawn({server_bin_, "--endpoint=127.0.0.1:0", "--config=" + config_.string(),
           "--override=" + c.override_text, "--rank=0", "--role=server",
           "--world_size=" + std::to_string(c.world_size)},
          log, {"FLEET_AUTH=off"});
    EXPECT_EQ(WaitExit(servers_.size() - 1, 15s), 2) << "exit code (128 + N: killed by signal N)";
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_NE(text.find(c.reason), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace fleet::ps
