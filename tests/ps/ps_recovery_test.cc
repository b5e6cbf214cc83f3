// Crash recovery (server.recovery_dir): a sync job whose server is
// destroyed between recovery checkpoints and restarted from its checkpoint
// and push log ends with tables byte-for-byte equal to an undisturbed
// run's; the push log's torn tail, damage and fsync policies.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>

#include "ps/push_log.h"
#include "tests/ps/ps_cluster.h"

namespace fleet::ps {
namespace {

using testing::MakeJob;
using testing::PsCluster;
namespace fs = std::filesystem;

constexpr int kSteps = 10;
constexpr int kKeys = 40;

// The directories TempDir made, removed after the last test.
std::vector<std::string>& MadeDirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
class RemoveTempDirs : public ::testing::Environment {
  void TearDown() override {
    for (const std::string& d : MadeDirs()) fs::remove_all(d);
  }
};
const auto* const kRemoveTempDirs = ::testing::AddGlobalTestEnvironment(new RemoveTempDirs);

std::string TempDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       (name + "-" + std::to_string(::getpid()) + "-" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  MadeDirs().push_back(dir.string());
  return dir.string();
}

// Table 0: sparse dim 4, adagrad; table 1: dense dim 10, adam. Both have
// optimizer state, which the comparison covers too.
JobConfig Job(const std::string& recovery_dir, int checkpoint_every,
              const std::string& sync = "batch", const std::string& distributed = "mode: sync") {
  std::string server;
  if (!recovery_dir.empty()) {
    server = "server: {recovery_dir: '" + recovery_dir + "', checkpoint_every: " +
             std::to_string(checkpoint_every) + ", push_log_sync: " + sync + "}\n";
  }
  return MakeJob("Distributed: {" + distributed + ", timeout_ms: 10000}\n" + server +
                 "tables:\n"
                 "  - {id: 0, kind: sparse, dim: 4, shard_num: 8,\n"
                 "     optimizer: {rule: adagrad, learning_rate: 0.5}}\n"
                 "  - {id: 1, kind: dense, dim: 10, optimizer: {rule: adam, learning_rate: 0.01}}\n");
}

// Worker w's step k: pull, then push deterministic gradients to both tables.
void Step(PsClient& c, int w, int k) {
  std::vector<uint64_t> keys(16);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 1 + (k * 7 + w * 13 + i) % kKeys;
  std::vector<float> rows(keys.size() * c.PullDim(0));
  Status pulled = c.PullSparse(0, keys, rows);
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  std::vector<float> grads(keys.size() * c.PushDim(0));
  for (size_t j = 0; j < grads.size(); ++j) grads[j] = 0.1f * std::sin(0.37f * k + 1.1f * w + 0.13f * j);
  PushOptions o;
  o.step = k;
  Status s = c.PushSparseGrad(0, keys, grads, o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<float> dense(10);
  ASSERT_TRUE(c.PullDense(1, dense).ok());
  for (size_t j = 0; j < dense.size(); ++j) dense[j] = 0.2f * std::cos(0.5f * k + 0.7f * w + 0.3f * j);
  s = c.PushDenseGrad(1, dense, o);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

void RunSteps(PsCluster& cluster, int from, int to) {
  cluster.RunWorkers([&](int w) {
    for (int k = from; k < to; ++k) Step(cluster.client(w), w, k);
  });
}

void InitDense(PsCluster& cluster) {
  std::vector<float> init(10);
  for (size_t j = 0; j < init.size(); ++j) init[j] = 0.01f * j;
  ASSERT_TRUE(cluster.client(0).InitDense(1, init).ok());
}

// Every stored row (values and optimizer state) and dense slice of every
// server, as bytes.
std::string Snapshot(PsCluster& cluster) {
  std::string out;
  for (int s = 0; s < cluster.num_servers(); ++s) {
    SparseTable* t = cluster.server(s).sparse_table(0);
    for (uint64_t key = 0; key <= kKeys + 1; ++key) {
      if (!t->owned_shards().contains(t->sharder()(key))) continue;
      std::vector<float> row, ext;
      if (!t->DebugRow(key, &row, &ext)) continue;
      out += "k" + std::to_string(key) + ":";
      out.append(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float));
      out.append(reinterpret_cast<const char*>(ext.data()), ext.size() * sizeof(float));
    }
    out += cluster.server(s).dense_table(1)->Serialize();
  }
  return out;
}

std::string Undisturbed() {
  PsCluster cluster(Job("", 0), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, kSteps);
  return Snapshot(cluster);
}

// ZeroMQ reconnects the clients to a restarted server in the background;
// until then calls to it fail at once with Unavailable.
void RestartAndReconnect(PsCluster& cluster, int server) {
  Status s = cluster.RestartServer(server);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int w = 0; w < cluster.num_workers(); ++w) {
    std::vector<float> dense(10);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!(s = cluster.client(w).PullDense(1, dense)).ok() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(s.ok()) << "worker " << w << " cannot reach restarted server " << server << ": "
                        << s.ToString();
  }
}

std::vector<std::string> FilesIn(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(PsRecoveryTest, RestartedServerEndsEqualToAnUndisturbedRun) {
  const std::string expected = Undisturbed();
  const std::string dir = TempDir("recovery");
  // 2 updates (sparse + dense step) per step and server: a checkpoint every
  // 2.5 steps, so the crash after step 6 falls between two of them (after
  // 5 and 7.5) and the restart replays a log.
  PsCluster cluster(Job(dir, 5), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, 6);
  ASSERT_FALSE(FilesIn(dir + "/s1", "pushlog-").empty());
  RestartAndReconnect(cluster, 1);
  RunSteps(cluster, 6, kSteps);
  EXPECT_TRUE(Snapshot(cluster) == expected) << "tables differ from the undisturbed run's";
}

TEST(PsRecoveryTest, WithoutTheLogARestartedServerComesBackWrong) {
  // The control: the same crash with recovery off leaves server 1 empty,
  // and the run does not end like the undisturbed one.
  const std::string expected = Undisturbed();
  PsCluster cluster(Job("", 0), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, 6);
  RestartAndReconnect(cluster, 1);
  EXPECT_FALSE(Snapshot(cluster) == expected);
}

TEST(PsRecoveryTest, ATornLastRecordIsDropped) {
  const std::string dir = TempDir("recovery-torn");
  PsCluster cluster(Job(dir, 1000), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, 3);
  const std::string before = Snapshot(cluster);
  // A crash in the middle of the next append: half a record at the end.
  const std::vector<std::string> logs = FilesIn(dir + "/s1", "pushlog-");
  ASSERT_EQ(logs.size(), 1u);
  {
    std::ofstream f(logs[0], std::ios::binary | std::ios::app);
    const char partial[] = {0x40, 0, 0, 0, 0x11, 0x22, 0x33, 0x44, 5, 0, 0};
    f.write(partial, sizeof(partial));
  }
  auto read = ReadPushLog(std::make_unique<PosixFileSystem>().get(), logs[0]);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->dropped_torn_tail);
  EXPECT_EQ(read->records.size(), 1u + 3 * 2) << "init_dense and 3 steps of 2 tables";
  RestartAndReconnect(cluster, 1);
  EXPECT_TRUE(Snapshot(cluster) == before);
  RunSteps(cluster, 3, 4);  // the restored step counter takes step 3 next
}

TEST(PsRecoveryTest, ACorruptCheckpointIsAnErrorNamingTheFile) {
  const std::string dir = TempDir("recovery-corrupt");
  PsCluster cluster(Job(dir, 4), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, 4);
  const std::vector<std::string> shards = FilesIn(dir + "/s1", "t0-");
  ASSERT_FALSE(shards.empty());
  {
    std::fstream f(shards[0], std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(12);
    f.put('\x5a');
  }
  Status s = cluster.RestartServer(1);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find(fs::path(shards[0]).filename().string()), std::string::npos)
      << s.ToString();
}

TEST(PsRecoveryTest, ACorruptStepFileIsAnErrorNamingTheFile) {
  const std::string dir = TempDir("recovery-steps");
  PsCluster cluster(Job(dir, 4), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, 2);
  const std::vector<std::string> steps = FilesIn(dir + "/s1", "steps-");
  ASSERT_EQ(steps.size(), 1u);
  {
    std::fstream f(steps[0], std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(14);
    f.put('\x7f');
  }
  Status s = cluster.RestartServer(1);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.ToString().find(fs::path(steps[0]).filename().string()), std::string::npos)
      << s.ToString();
}

TEST(PsRecoveryTest, RecoveryCheckpointsLeaveTheJobsDeltaSavesIntact) {
  const std::string dir = TempDir("recovery-delta");
  const std::string saves = TempDir("recovery-delta-saves");
  // The job's checkpoint root: PS_SAVE and PS_LOAD go nowhere else.
  const auto root = [&](PsServerOptions& o) { o.job.server.save_dir = saves; };
  PsCluster cluster(Job(dir, 3), 2, 2, root);
  InitDense(cluster);
  RunSteps(cluster, 0, 2);
  ASSERT_TRUE(cluster.client(0).Save(saves, /*delta=*/false).ok());
  RunSteps(cluster, 2, 6);  // recovery checkpoints every 1.5 steps meanwhile
  Status s = cluster.client(0).Save(saves, /*delta=*/true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const std::string expected = Snapshot(cluster);
  PsCluster fresh(Job("", 0), 2, 2, root);
  s = fresh.client(0).Load(saves);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Snapshot(fresh) == expected) << "the delta lacks rows changed before a recovery checkpoint";
}

TEST(PsRecoveryTest, ConfigKeysAreCheckedAndDefaulted) {
  auto parse = [](const std::string& server) { return ParseJobConfig(YAML::Load("server: " + server)); };
  auto defaults = parse("{threads: 2}");
  ASSERT_TRUE(defaults.ok());
  EXPECT_TRUE(defaults->server.recovery_dir.empty());
  EXPECT_EQ(defaults->server.checkpoint_every, 1000);
  EXPECT_EQ(defaults->server.checkpoint_every_mib, 256);
  EXPECT_FALSE(defaults->server.keep_recovery);
  EXPECT_EQ(defaults->server.push_log_sync, LogSync::kBatch);
  auto mib = parse("{checkpoint_every_mib: 0}");
  EXPECT_NE(mib.status().ToString().find("server.checkpoint_every_mib"), std::string::npos);
  auto every = parse("{recovery_dir: /r, push_log_sync: every, checkpoint_every: 7}");
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(every->server.push_log_sync, LogSync::kEvery);
  EXPECT_EQ(every->server.checkpoint_every, 7);
  auto bad = parse("{push_log_sync: always}");
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().ToString().find("server.push_log_sync"), std::string::npos);
  auto zero = parse("{checkpoint_every: 0}");
  EXPECT_NE(zero.status().ToString().find("checkpoint_every"), std::string::npos);
  auto same = parse("{recovery_dir: /d, save_dir: /d}");
  EXPECT_NE(same.status().ToString().find("server.recovery_dir"), std::string::npos);
}

// A finished job (the final save succeeded) leaves no recovery files unless
// server.keep_recovery; a job stopped without finishing keeps them for a
// restart.
TEST(PsRecoveryTest, AFinishedJobRemovesItsRecoveryFilesUnlessKept) {
  struct Case {
    bool finished;
    bool keep;
    bool files_left;
  };
  for (const Case c : {Case{true, false, false}, Case{true, true, true}, Case{false, false, true}}) {
    const std::string dir = TempDir("finished");
    JobConfig job = Job(dir, 5);
    job.server.keep_recovery = c.keep;
    PsCluster cluster(job, 2, 2);
    InitDense(cluster);
    RunSteps(cluster, 0, 4);
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(cluster.server(s).Shutdown(c.finished).ok());
    for (int s = 0; s < 2; ++s) {
      const std::string mine = dir + "/s" + std::to_string(s);
      EXPECT_EQ(fs::exists(mine), c.files_left)
          << "finished " << c.finished << " keep " << c.keep << ": " << mine;
    }
  }
}

// Big updates fill the push log fast: past checkpoint_every_mib a recovery
// checkpoint starts a new log (and removes the old one), however few
// updates it holds.
TEST(PsRecoveryTest, ThePushLogIsBoundedByItsSizeToo) {
  const std::string dir = TempDir("bounded");
  JobConfig job = MakeJob(
      "Distributed: {mode: async, timeout_ms: 10000}\n"
      "server: {recovery_dir: '" + dir + "', checkpoint_every: 1000000, checkpoint_every_mib: 1}\n"
      "tables: [{id: 0, kind: dense, dim: 65536, optimizer: {rule: sgd, learning_rate: 0.1}}]\n");
  PsCluster cluster(job, 1, 1);
  std::vector<float> grad(65536, 0.5f);  // 256 KiB a push
  uint64_t largest = 0;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(cluster.client(0).PushDenseGrad(0, grad).ok());
    for (const std::string& log : FilesIn(dir + "/s0", "pushlog-")) {
      largest = std::max<uint64_t>(largest, fs::file_size(log));
    }
  }
  const std::vector<std::string> logs = FilesIn(dir + "/s0", "pushlog-");
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_EQ(logs[0].find("pushlog-g000000.log"), std::string::npos) << "never rotated";
  EXPECT_LE(largest, (1u << 20) + (300u << 10));  // the bound plus the record that crossed it
}

// A link planted where the recovery folder (or a server's part of it) goes
// is refused at start, never written through.
TEST(PsRecoveryTest, APlantedLinkForTheRecoveryFolderIsRefused) {
  const std::string base = TempDir("planted");
  const std::string elsewhere = base + "/elsewhere";
  fs::create_directories(elsewhere);
  for (const std::string& link : {base + "/recovery", base + "/recovery2/s0"}) {
    fs::create_directories(fs::path(link).parent_path());
    fs::create_directory_symlink(elsewhere, link);
    PsServerOptions o;
    o.job = Job(link.ends_with("/s0") ? base + "/recovery2" : link, 5);
    auto server = PsServer::Create(o);
    ASSERT_FALSE(server.ok()) << link;
    EXPECT_NE(server.status().message().find("symbolic link"), std::string::npos)
        << server.status().ToString();
    EXPECT_TRUE(fs::is_empty(elsewhere)) << "written through " << link;
  }
}

// ---- Resends after a lost server (PsClient, Distributed.server_restart_timeout_ms) ----

// Server 1 crashes while worker 0's sync push of step 4 waits there for
// worker 1's: the pending contribution dies with it. The worker's calls are
// resent to the restarted server (the merged steps before 4 come from its
// log), worker 1 pushes step 4 after the restart, and the job ends equal
// to an undisturbed run. Without resends worker 0's push fails.
TEST(PsResendTest, SyncWorkersRideThroughAServerRestartMidStep) {
  const std::string expected = Undisturbed();
  const std::string dir = TempDir("resend");
  PsCluster cluster(Job(dir, 5), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, 4);
  auto worker0 = std::async(std::launch::async, [&] {
    for (int k = 4; k < kSteps; ++k) Step(cluster.client(0), 0, k);
  });
  // Worker 0's sparse push of step 4 is waiting on both servers now.
  ASSERT_EQ(worker0.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  ASSERT_TRUE(cluster.RestartServer(1).ok());
  for (int k = 4; k < kSteps; ++k) Step(cluster.client(1), 1, k);
  worker0.get();
  EXPECT_TRUE(Snapshot(cluster) == expected) << "tables differ from the undisturbed run's";
}

// Sends PS_PUSH_SPARSE_GRAD of gradient 1 for key 1 with a fixed request
// number over a raw node, as a PsClient resending it after a lost reply does.
Status RawPush(RpcNode& node, int peer, uint64_t seq) {
  pb::PsRequestMeta meta;
  meta.set_client_id(42);
  meta.set_sequence(seq);
  meta.set_acked_below(seq);
  Message m;
  m.header.set_command(pb::PS_PUSH_SPARSE_GRAD);
  m.header.set_table_id(0);
  m.header.set_meta(meta.SerializeAsString());
  m.AddFrame(SArray<uint64_t>(std::vector<uint64_t>{1}));
  m.AddFrame(SArray<float>(std::vector<float>(4, 1.0f)));
  return node.CallSync(peer, std::move(m)).status();
}

// Async: a push delivered twice (its reply lost) is applied once, also
// when the second copy reaches a restarted server, whose record of the
// numbers comes from the push log (checkpoint_every 1000) or from the
// recovery checkpoint (checkpoint_every 1: a checkpoint follows each push).
TEST(PsResendTest, AnAsyncPushDeliveredTwiceIsAppliedOnce) {
  for (int every : {1000, 1}) {
    SCOPED_TRACE("checkpoint_every " + std::to_string(every));
    const std::string dir = TempDir("resend_async" + std::to_string(every));
    PsCluster cluster(Job(dir, every, "batch", "mode: async"), 1, 1);
    auto raw = RpcNode::Create({}).value();
    const int peer = raw->Connect(cluster.endpoints()[0]).value();
    const uint64_t key = 1;
    std::vector<float> once(4), now(4);
    ASSERT_TRUE(RawPush(*raw, peer, 1).ok());
    ASSERT_TRUE(cluster.client(0).PullSparse(0, {&key, 1}, once).ok());
    ASSERT_TRUE(RawPush(*raw, peer, 1).ok());
    ASSERT_TRUE(cluster.client(0).PullSparse(0, {&key, 1}, now).ok());
    EXPECT_EQ(now, once) << "the resend was applied again";
    ASSERT_TRUE(cluster.RestartServer(0).ok());
    Status s;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!(s = RawPush(*raw, peer, 1)).ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(cluster.client(0).PullSparse(0, {&key, 1}, now).ok());
    EXPECT_EQ(now, once) << "the restarted server applied the resend again";
    // A new number is a new update.
    ASSERT_TRUE(RawPush(*raw, peer, 2).ok());
    ASSERT_TRUE(cluster.client(0).PullSparse(0, {&key, 1}, now).ok());
    EXPECT_NE(now, once);
  }
}

// A barrier released while one arrival's reply was lost: its resend is
// answered at once instead of waiting for a next round nobody joins.
TEST(PsResendTest, AResentBarrierArrivalThatWasReleasedIsAnswered) {
  PsCluster cluster(Job("", 0, "batch", "mode: async"), 1, 2);
  auto raw = RpcNode::Create({}).value();
  const int peer = raw->Connect(cluster.endpoints()[0]).value();
  auto arrive = [&] {
    pb::PsRequestMeta meta;
    meta.set_barrier_name("b");
    meta.set_worker_rank(0);
    meta.set_barrier_size(2);
    meta.set_client_id(7);
    meta.set_sequence(3);
    meta.set_acked_below(3);
    Message m;
    m.header.set_command(pb::PS_BARRIER);
    m.header.set_meta(meta.SerializeAsString());
    RpcOptions o;
    o.timeout = std::chrono::seconds(2);
    return raw->Call(peer, std::move(m), o);
  };
  auto first = arrive();
  ASSERT_TRUE(cluster.client(1).Barrier("b").ok());
  ASSERT_TRUE(first.get().ok());
  const auto start = std::chrono::steady_clock::now();
  Status again = arrive().get().status();
  EXPECT_TRUE(again.ok()) << again.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

// A lost server that does not come back fails the call once the window
// passed, naming the server and the window; with the window 0, or without
// recovery_dir, at once as before.
TEST(PsResendTest, AServerThatDoesNotComeBackFailsTheCallAfterTheWindow) {
  const std::string dir = TempDir("resend_gone");
  for (int window : {400, 0}) {
    SCOPED_TRACE("server_restart_timeout_ms " + std::to_string(window));
    JobConfig job = Job(dir, 1000, "batch",
                        "mode: async, server_restart_timeout_ms: " + std::to_string(window));
    PsServerOptions so;
    so.job = job;
    auto server = PsServer::Create(so).value();
    const std::string endpoint = server->Start().value();
    PsClientOptions co;
    co.servers = {endpoint};
    auto client = PsClient::Create(co, job).value();
    std::vector<float> dense(10);
    ASSERT_TRUE(client->PullDense(1, dense).ok());
    server.reset();
    const auto start = std::chrono::steady_clock::now();
    Status s = client->PullDense(1, dense);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
    if (window > 0) {
      EXPECT_NE(s.message().find("parameter server 0 did not come back within 400 ms"),
                std::string::npos)
          << s.ToString();
      EXPECT_GE(took, std::chrono::milliseconds(400));
      EXPECT_LT(took, std::chrono::seconds(3));
    } else {
      EXPECT_LT(took, std::chrono::milliseconds(300)) << s.ToString();
    }
  }
}

TEST(PsResendTest, RestartWindowKeyIsCheckedAndDefaulted) {
  auto parse = [](const std::string& d) { return ParseJobConfig(YAML::Load("Distributed: " + d)); };
  auto defaults = parse("{mode: sync}");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->distributed.server_restart_timeout, std::chrono::milliseconds(30000));
  auto bad = parse("{server_restart_timeout_ms: -1}");
  EXPECT_NE(bad.status().ToString().find("server_restart_timeout_ms"), std::string::npos);
}

// ---- PushLog on its own ----

PushRecordRef Record(const std::vector<uint64_t>& keys, const std::vector<float>& values) {
  return {.op = LogOp::kSparseGrad, .table = 3, .sender = "worker:0", .keys = keys, .values = values};
}

TEST(PushLogTest, SyncPolicyDecidesTheFsyncs) {
  const std::string dir = TempDir("pushlog-sync");
  fs::create_directories(dir);
  PosixFileSystem posix;
  const std::vector<uint64_t> keys = {1, 2};
  const std::vector<float> values = {0.5f, -1.0f};
  for (LogSync policy : {LogSync::kNone, LogSync::kBatch, LogSync::kEvery}) {
    FaultInjectionFileSystem counting(&posix);
    auto log = PushLog::Create(&counting, dir + "/log", policy);
    ASSERT_TRUE(log.ok());
    const int after_create = counting.calls(FaultInjectionFileSystem::Op::kSync);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE((*log)->Append(Record(keys, values)).ok());
    const int appended = counting.calls(FaultInjectionFileSystem::Op::kSync) - after_create;
    ASSERT_TRUE((*log)->SyncPending().ok());
    ASSERT_TRUE((*log)->SyncPending().ok());  // nothing new: no fsync
    const int batched = counting.calls(FaultInjectionFileSystem::Op::kSync) - after_create - appended;
    SCOPED_TRACE(std::string(LogSyncName(policy)));
    EXPECT_EQ(appended, policy == LogSync::kEvery ? 5 : 0);
    EXPECT_EQ(batched, policy == LogSync::kBatch ? 1 : 0);
    auto read = ReadPushLog(&posix, dir + "/log");
    ASSERT_TRUE(read.ok());
    ASSERT_EQ(read->records.size(), 5u);
    EXPECT_EQ(read->records[4].keys, keys);
    EXPECT_EQ(read->records[4].values, values);
    EXPECT_EQ(read->records[4].sender, "worker:0");
  }
}

TEST(PushLogTest, AFailedSyncUnderEveryFailsTheAppend) {
  const std::string dir = TempDir("pushlog-fail");
  fs::create_directories(dir);
  PosixFileSystem posix;
  FaultInjectionFileSystem faulty(&posix);
  auto log = PushLog::Create(&faulty, dir + "/log", LogSync::kEvery);
  ASSERT_TRUE(log.ok());
  faulty.FailNth(FaultInjectionFileSystem::Op::kSync, 1);
  Status s = (*log)->Append(Record({1}, {1.0f}));
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
}

TEST(PushLogTest, DamageBeforeTheLastRecordIsCorruption) {
  const std::string dir = TempDir("pushlog-damage");
  fs::create_directories(dir);
  PosixFileSystem posix;
  {
    auto log = PushLog::Create(&posix, dir + "/log", LogSync::kNone);
    ASSERT_TRUE(log.ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE((*log)->Append(Record({1, 2, 3}, {1, 2, 3})).ok());
    ASSERT_TRUE((*log)->Close().ok());
  }
  {
    std::fstream f(dir + "/log", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(8 + 8 + 3);  // inside the first record's payload
    f.put('\x01');
  }
  auto read = ReadPushLog(&posix, dir + "/log");
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(read.status().IsCorruption()) << read.status().ToString();
  EXPECT_NE(read.status().ToString().find(dir + "/log"), std::string::npos);
  EXPECT_NE(read.status().ToString().find("byte 8"), std::string::npos) << read.status().ToString();
}

}  // namespace
}  // namespace fleet::ps
