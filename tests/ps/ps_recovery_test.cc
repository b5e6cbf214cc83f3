// Crash recovery (server.recovery_dir): a sync job whose server is
// destroyed between recovery checkpoints and restarted from its checkpoint
// and push log ends with tables byte-for-byte equal to an undisturbed
// run's; the push log's torn tail, damage and fsync policies.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

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
              const std::string& sync = "batch") {
  std::string server;
  if (!recovery_dir.empty()) {
    server = "server: {recovery_dir: '" + recovery_dir + "', checkpoint_every: " +
             std::to_string(checkpoint_every) + ", push_log_sync: " + sync + "}\n";
  }
  return MakeJob("Distributed: {mode: sync, timeout_ms: 10000}\n" + server +
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
  PsCluster cluster(Job(dir, 3), 2, 2);
  InitDense(cluster);
  RunSteps(cluster, 0, 2);
  ASSERT_TRUE(cluster.client(0).Save(saves, /*delta=*/false).ok());
  RunSteps(cluster, 2, 6);  // recovery checkpoints every 1.5 steps meanwhile
  Status s = cluster.client(0).Save(saves, /*delta=*/true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const std::string expected = Snapshot(cluster);
  PsCluster fresh(Job("", 0), 2, 2);
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
  EXPECT_EQ(defaults->server.push_log_sync, LogSync::kBatch);
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
