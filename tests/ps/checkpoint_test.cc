#include "ps/checkpoint.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "table_test_util.h"

namespace fleet::ps {
namespace {

using ::testing::HasSubstr;

const char* kSparseYaml =
    "{id: 1, kind: sparse, dim: 4, shard_num: 12, optimizer: {rule: adagrad, learning_rate: 0.1}, "
    "initializer: {kind: uniform, range: 0.5, seed: 11}}";
const char* kCtrYaml =
    "{id: 3, kind: sparse, dim: 3, accessor: ctr, shard_num: 12, optimizer: {rule: adam, learning_rate: 0.1}, "
    "initializer: {kind: uniform, range: 0.5}, ctr: {embedx_threshold: 2, nonclk_coeff: 1, "
    "delete_after_unseen_passes: 1}}";
const char* kDenseYaml = "{id: 2, kind: dense, dim: 10, optimizer: {rule: adam, learning_rate: 0.1}}";

// One simulated server: its tables and its checkpointer.
struct Server {
  std::unique_ptr<SparseTable> sparse;
  std::unique_ptr<DenseTable> dense;
  ServerTables tables() const { return {{sparse.get()}, {dense.get()}}; }
};

std::vector<Server> MakeCluster(int num_servers, const char* sparse_yaml, ThreadPool* pool) {
  std::vector<Server> servers;
  const TableConfig sc = ConfigFromYaml(sparse_yaml), dc = ConfigFromYaml(kDenseYaml);
  for (int r = 0; r < num_servers; ++r) {
    servers.push_back({SparseTable::Create(sc, AssignShards(sc.shard_num, num_servers, r).value(), pool).value(),
                       DenseTable::Create(dc, SplitDenseRange(dc.dim, num_servers, r).value()).value()});
  }
  return servers;
}

Server& OwnerOf(std::vector<Server>& servers, uint64_t key) {
  const uint32_t shard = servers[0].sparse->sharder()(key);
  for (Server& s : servers)
    if (s.sparse->owned_shards().contains(shard)) return s;
  LOG(FATAL) << "no owner";
}

// Pushes grad (i + 1) * scale for key i of keys, routed to the owners, and
// a dense gradient over all elements.
void PushAll(std::vector<Server>& servers, const std::vector<uint64_t>& keys, float scale) {
  for (uint64_t k : keys) {
    Server& s = OwnerOf(servers, k);
    std::vector<float> g(s.sparse->push_dim(), scale * float(k % 17 + 1));
    ASSERT_TRUE(s.sparse->PushGrad(std::vector<uint64_t>{k}, g, std::vector<float>{1}, std::vector<float>{0}).ok());
  }
  for (Server& s : servers) {
    std::vector<float> g(s.dense->range().size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = scale * float(s.dense->range().begin + i);
    ASSERT_TRUE(s.dense->PushGrad(g).ok());
  }
}

// Stored rows (row + extension floats) of keys, and the dense vector.
struct Snapshot {
  std::map<uint64_t, std::pair<std::vector<float>, std::vector<float>>> rows;
  std::vector<float> dense;
  bool operator==(const Snapshot&) const = default;
};

Snapshot Capture(std::vector<Server>& servers, const std::vector<uint64_t>& keys) {
  Snapshot snap;
  for (uint64_t k : keys) {
    std::vector<float> row, ext;
    if (OwnerOf(servers, k).sparse->DebugRow(k, &row, &ext)) snap.rows[k] = {row, ext};
  }
  for (Server& s : servers) {
    std::vector<float> v(s.dense->range().size());
    CHECK(s.dense->Pull(v).ok());
    snap.dense.insert(snap.dense.end(), v.begin(), v.end());
  }
  return snap;
}

uint64_t TotalRows(const std::vector<Server>& servers) {
  uint64_t n = 0;
  for (const Server& s : servers) n += s.sparse->Stats().rows;
  return n;
}

std::vector<uint64_t> Range(uint64_t begin, uint64_t end) {
  std::vector<uint64_t> v;
  for (uint64_t k = begin; k < end; ++k) v.push_back(k);
  return v;
}

Snapshot Capture(std::vector<Server>& servers, uint64_t max_key) {
  return Capture(servers, Range(0, max_key));
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("ps_ckpt_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string Dir(const std::string& name) const { return (root_ / name).string(); }

  Status SaveAll(FileSystem* fs, std::vector<Server>& servers, const std::string& dir, SaveMode mode) {
    for (size_t r = 0; r < servers.size(); ++r) {
      Checkpointer ck(fs, static_cast<int>(r), static_cast<int>(servers.size()), &pool_);
      FLEET_RETURN_IF_ERROR(ck.Save(dir, mode, servers[r].tables()));
    }
    return Status::OK();
  }
  Status LoadAll(FileSystem* fs, std::vector<Server>& servers, const std::string& dir) {
    for (size_t r = 0; r < servers.size(); ++r) {
      Checkpointer ck(fs, static_cast<int>(r), static_cast<int>(servers.size()), &pool_);
      FLEET_RETURN_IF_ERROR(ck.Load(dir, servers[r].tables()));
    }
    return Status::OK();
  }

  std::filesystem::path root_;
  PosixFileSystem fs_;
  ThreadPool pool_{2};
};

TEST_F(CheckpointTest, RoundTripReshardsTwoServersToThree) {
  std::vector<Server> two = MakeCluster(2, kSparseYaml, &pool_);
  PushAll(two, Range(0, 1000), 0.1f);
  PushAll(two, Range(500, 1500), -0.2f);
  const Snapshot saved = Capture(two, 1500);
  ASSERT_EQ(saved.rows.size(), 1500u);
  ASSERT_TRUE(SaveAll(&fs_, two, Dir("ck"), SaveMode::kBase).ok());

  std::vector<Server> three = MakeCluster(3, kSparseYaml, &pool_);
  PushAll(three, Range(0, 10), 5.0f);  // state that the load must replace
  Status st = LoadAll(&fs_, three, Dir("ck"));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(TotalRows(three), 1500u);  // nothing lost, nothing duplicated
  EXPECT_EQ(Capture(three, 1500), saved);

  // Optimizer state came along: the same pushes give the same results.
  PushAll(two, Range(0, 1500), 0.3f);
  PushAll(three, Range(0, 1500), 0.3f);
  EXPECT_EQ(Capture(three, 1500), Capture(two, 1500));

  // And back to one server.
  std::vector<Server> one = MakeCluster(1, kSparseYaml, &pool_);
  ASSERT_TRUE(LoadAll(&fs_, one, Dir("ck")).ok());
  EXPECT_EQ(Capture(one, 1500), saved);
}

// Under the range partition a shard file holds one range of the key space
// (checked key by key on load) and a checkpoint reshards like the hash
// partition's.
TEST_F(CheckpointTest, RangePartitionRoundTripReshards) {
  const std::string yaml =
      "{id: 1, kind: sparse, dim: 4, shard_num: 12, partition: range, "
      "optimizer: {rule: adagrad, learning_rate: 0.1}, initializer: {kind: uniform, range: 0.5, "
      "seed: 11}}";
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 600; ++i) keys.push_back(i * (UINT64_MAX / 600) + i % 3);
  std::vector<Server> two = MakeCluster(2, yaml.c_str(), &pool_);
  PushAll(two, keys, 0.1f);
  for (const Server& s : two) EXPECT_GT(s.sparse->Stats().rows, 200u);  // spread over both
  const Snapshot saved = Capture(two, keys);
  ASSERT_EQ(saved.rows.size(), 600u);
  ASSERT_TRUE(SaveAll(&fs_, two, Dir("ck"), SaveMode::kBase).ok());

  std::vector<Server> three = MakeCluster(3, yaml.c_str(), &pool_);
  Status st = LoadAll(&fs_, three, Dir("ck"));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(TotalRows(three), 600u);
  EXPECT_EQ(Capture(three, keys), saved);
  PushAll(two, keys, 0.3f);
  PushAll(three, keys, 0.3f);
  EXPECT_EQ(Capture(three, keys), Capture(two, keys));
}

TEST_F(CheckpointTest, DeltasApplyOnTopOfBaseIncludingDeletes) {
  std::vector<Server> two = MakeCluster(2, kCtrYaml, &pool_);
  PushAll(two, Range(0, 200), 0.1f);
  PushAll(two, Range(0, 200), 0.1f);  // score 2: every row gets its embedx
  ASSERT_TRUE(SaveAll(&fs_, two, Dir("ck"), SaveMode::kBase).ok());
  for (Server& s : two) s.sparse->EndPass();
  PushAll(two, Range(0, 100), 0.2f);  // seen again this pass
  for (Server& s : two) s.sparse->Shrink();  // deletes 100..199
  PushAll(two, Range(200, 250), 0.3f);
  ASSERT_TRUE(SaveAll(&fs_, two, Dir("ck"), SaveMode::kDelta).ok());
  PushAll(two, Range(0, 50), 0.4f);
  ASSERT_TRUE(SaveAll(&fs_, two, Dir("ck"), SaveMode::kDelta).ok());
  const Snapshot saved = Capture(two, 300);
  ASSERT_EQ(saved.rows.size(), 150u);

  std::vector<Server> three = MakeCluster(3, kCtrYaml, &pool_);
  Status st = LoadAll(&fs_, three, Dir("ck"));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(TotalRows(three), 150u);
  EXPECT_EQ(Capture(three, 300), saved);

  // A delta after a load continues the chain, even with the new server count.
  PushAll(three, Range(0, 300), 0.5f);
  ASSERT_TRUE(SaveAll(&fs_, three, Dir("ck"), SaveMode::kDelta).ok());
  std::vector<Server> two_again = MakeCluster(2, kCtrYaml, &pool_);
  ASSERT_TRUE(LoadAll(&fs_, two_again, Dir("ck")).ok());
  EXPECT_EQ(Capture(two_again, 300), Capture(three, 300));
}

TEST_F(CheckpointTest, SaveRulesAreChecked) {
  std::vector<Server> one = MakeCluster(1, kSparseYaml, &pool_);
  Status st = SaveAll(&fs_, one, Dir("ck"), SaveMode::kDelta);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  PushAll(one, Range(0, 50), 0.1f);
  ASSERT_TRUE(SaveAll(&fs_, one, Dir("ck"), SaveMode::kBase).ok());
  PushAll(one, Range(0, 80), 0.1f);
  ASSERT_TRUE(SaveAll(&fs_, one, Dir("ck"), SaveMode::kDelta).ok());
  // A second base in the same directory starts a new chain after the delta.
  PushAll(one, Range(20, 120), 0.1f);
  ASSERT_TRUE(SaveAll(&fs_, one, Dir("ck"), SaveMode::kBase).ok());
  EXPECT_TRUE(std::filesystem::exists(Dir("ck") + "/MANIFEST-g000002-s00000-of-00001"));
  std::vector<Server> fresh = MakeCluster(1, kSparseYaml, &pool_);
  ASSERT_TRUE(LoadAll(&fs_, fresh, Dir("ck")).ok());
  EXPECT_EQ(Capture(fresh, 200), Capture(one, 200));
  // Another server count must load into different tables: a delta from
  // tables that were never saved or loaded in this dir is refused.
  std::vector<Server> other = MakeCluster(1, kSparseYaml, &pool_);
  st = SaveAll(&fs_, other, Dir("ck"), SaveMode::kDelta);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  st = LoadAll(&fs_, one, Dir("nothing-here"));
  EXPECT_TRUE(st.IsNotFound()) << st.ToString();
}

// ---- Corruption: one defect each; exact code, a message naming it, state unchanged ----

class CorruptionTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    std::vector<Server> one = MakeCluster(1, kSparseYaml, &pool_);
    PushAll(one, Range(0, 300), 0.1f);
    ASSERT_TRUE(SaveAll(&fs_, one, Dir("ck"), SaveMode::kBase).ok());
    target_ = MakeCluster(1, kSparseYaml, &pool_);
    PushAll(target_, Range(0, 40), 0.7f);
    before_ = DumpRows(*target_[0].sparse);
    dense_before_ = Capture(target_, 0).dense;
  }

  std::string FileOf(const std::string& prefix) const {
    for (const auto& e : std::filesystem::directory_iterator(Dir("ck")))
      if (e.path().filename().string().starts_with(prefix)) return e.path().string();
    ADD_FAILURE() << "no file " << prefix;
    return {};
  }

  // Loads, expects `code` with `needle` in the message, and an unchanged target.
  void ExpectRefused(StatusCode code, const std::string& needle, std::vector<Server>* servers = nullptr) {
    std::vector<Server>& s = servers ? *servers : target_;
    Status st = LoadAll(&fs_, s, Dir("ck"));
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr(needle));
    if (!servers) {
      EXPECT_EQ(DumpRows(*target_[0].sparse), before_);
      EXPECT_EQ(Capture(target_, 0).dense, dense_before_);
    }
  }

  static void FlipByte(const std::string& path, size_t offset_from_end) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff pos = static_cast<std::streamoff>(f.tellg()) - static_cast<std::streamoff>(offset_from_end);
    f.seekg(pos);
    char c;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(pos);
    f.write(&c, 1);
  }

  std::vector<Server> target_;
  std::string before_;
  std::vector<float> dense_before_;
};

TEST_F(CorruptionTest, FlippedByteInShardFile) {
  const std::string file = FileOf("t1-g000000-shard00003");
  FlipByte(file, 5);
  ExpectRefused(StatusCode::kCorruption, "checksum mismatch");
  ExpectRefused(StatusCode::kCorruption, std::filesystem::path(file).filename().string());
}

TEST_F(CorruptionTest, TruncatedShardFile) {
  const std::string file = FileOf("t1-g000000-shard00007");
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  ExpectRefused(StatusCode::kCorruption, "differs from the manifest");
  ExpectRefused(StatusCode::kCorruption, "shard00007");
}

TEST_F(CorruptionTest, MissingShardFile) {
  std::filesystem::remove(FileOf("t1-g000000-shard00000"));
  ExpectRefused(StatusCode::kCorruption, "missing");
  ExpectRefused(StatusCode::kCorruption, "shard00000");
}

TEST_F(CorruptionTest, FlippedByteInDenseFile) {
  FlipByte(FileOf("t2-g000000-dense"), 1);
  ExpectRefused(StatusCode::kCorruption, "t2-g000000-dense-s00000.bin");
}

TEST_F(CorruptionTest, FlippedByteInManifest) {
  FlipByte(FileOf("MANIFEST-g000000"), 20);
  ExpectRefused(StatusCode::kCorruption, "manifest checksum mismatch");
  ExpectRefused(StatusCode::kCorruption, "MANIFEST-g000000-s00000-of-00001");
}

TEST_F(CorruptionTest, TruncatedManifest) {
  const std::string file = FileOf("MANIFEST-g000000");
  std::filesystem::resize_file(file, 6);
  ExpectRefused(StatusCode::kCorruption, "manifest truncated");
}

TEST_F(CorruptionTest, MissingManifest) {
  std::filesystem::remove(FileOf("MANIFEST-g000000"));
  ExpectRefused(StatusCode::kNotFound, "no complete checkpoint");
}

TEST_F(CorruptionTest, IncompatibleConfig) {
  for (const char* yaml :
       {"{id: 1, kind: sparse, dim: 8, shard_num: 12, optimizer: {rule: adagrad}}",
        "{id: 1, kind: sparse, dim: 4, shard_num: 12, optimizer: {rule: sgd}}",
        "{id: 1, kind: sparse, dim: 4, shard_num: 16, optimizer: {rule: adagrad}}",
        "{id: 1, kind: sparse, dim: 4, shard_num: 12, partition: range, optimizer: {rule: "
        "adagrad}}"}) {
    std::vector<Server> other = MakeCluster(1, yaml, &pool_);
    PushAll(other, Range(0, 20), 1.0f);
    const std::string other_before = DumpRows(*other[0].sparse);
    const TableConfig c = other[0].sparse->config();
    const char* field = c.dim != 4                        ? "dim"
                        : c.shard_num != 12               ? "shard_num"
                        : c.partition != Partition::kHash ? "partition"
                                                          : "optimizer.rule";
    ExpectRefused(StatusCode::kInvalidArgument, field, &other);
    ExpectRefused(StatusCode::kInvalidArgument, "MANIFEST-g000000", &other);
    EXPECT_EQ(DumpRows(*other[0].sparse), other_before);
  }
}

// ---- Fault injection: a failed save leaves the previous checkpoint loadable ----

TEST_F(CheckpointTest, FailedSavesKeepPreviousCheckpoint) {
  std::vector<Server> one = MakeCluster(1, kSparseYaml, &pool_);
  PushAll(one, Range(0, 200), 0.1f);
  const std::string dir = Dir("ck");
  ASSERT_TRUE(SaveAll(&fs_, one, dir, SaveMode::kBase).ok());
  Snapshot expected = Capture(one, 400);

  // How many calls of each kind a delta save makes (a dry run elsewhere).
  auto count_calls = [&](FaultInjectionFileSystem::Op op) {
    std::vector<Server> probe = MakeCluster(1, kSparseYaml, &pool_);
    PushAll(probe, Range(0, 200), 0.1f);
    FaultInjectionFileSystem counting(&fs_);
    const std::string pdir = Dir("probe");
    std::filesystem::remove_all(pdir);
    CHECK(SaveAll(&counting, probe, pdir, SaveMode::kBase).ok());
    PushAll(probe, Range(100, 300), 0.2f);
    const int before = counting.calls(op);
    CHECK(SaveAll(&counting, probe, pdir, SaveMode::kDelta).ok());
    return counting.calls(op) - before;
  };

  using Op = FaultInjectionFileSystem::Op;
  for (Op op : {Op::kCreate, Op::kAppend, Op::kSync, Op::kClose, Op::kRename, Op::kSyncDir}) {
    const int calls = count_calls(op);
    ASSERT_GT(calls, 0);
    for (int nth = 1; nth <= calls; ++nth) {
      SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(op) << " call " << nth << " of " << calls);
      PushAll(one, Range(100 + nth, 300), 0.2f);  // new changes for this delta
      FaultInjectionFileSystem faulty(&fs_);
      faulty.FailNth(op, nth);
      Status st = SaveAll(&faulty, one, dir, SaveMode::kDelta);
      ASSERT_FALSE(st.ok());
      EXPECT_TRUE(st.IsIOError()) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("injected"));
      for (const auto& e : std::filesystem::directory_iterator(dir))
        EXPECT_FALSE(e.path().string().ends_with(".tmp")) << e.path();

      // The last checkpoint is still what a fresh server loads... unless the
      // failure came after the manifest rename (the last sync-dir).
      const bool after_publish = op == Op::kSyncDir && nth == calls;
      const bool unknown = after_publish || (op == Op::kRename && nth == calls);
      std::vector<Server> fresh = MakeCluster(1, kSparseYaml, &pool_);
      ASSERT_TRUE(LoadAll(&fs_, fresh, dir).ok());
      if (!after_publish) {
        EXPECT_TRUE(Capture(fresh, 400) == expected);
      }

      if (unknown) {
        Status again = SaveAll(&fs_, one, dir, SaveMode::kDelta);
        EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again.ToString();
        EXPECT_THAT(again.message(), HasSubstr("unknown outcome"));
        // A load re-establishes a known state; saving works again.
        ASSERT_TRUE(LoadAll(&fs_, one, dir).ok());
        PushAll(one, Range(100 + nth, 300), 0.2f);
      }
      // Retrying succeeds, and the retried delta holds everything changed
      // since the last good save (change marks were restored).
      Status retry = SaveAll(&fs_, one, dir, SaveMode::kDelta);
      ASSERT_TRUE(retry.ok()) << retry.ToString();
      expected = Capture(one, 400);
      std::vector<Server> check = MakeCluster(1, kSparseYaml, &pool_);
      ASSERT_TRUE(LoadAll(&fs_, check, dir).ok());
      ASSERT_TRUE(Capture(check, 400) == expected);
    }
  }
}

// kill -9 of a server in the middle of a save: the save stops at its 5th
// file append and does nothing after (no cleanup), leaving a temp file and
// shard files of a generation it never published. The next load from the
// directory removes them, and only them. (A save removes them the same way,
// RemoveUnfinishedSaves; a save of the same generation would also overwrite
// them, so a load is what shows it.)
TEST_F(CheckpointTest, LeftoversOfAKilledSaveAreRemovedByTheNextLoad) {
  std::vector<Server> two = MakeCluster(2, kSparseYaml, &pool_);
  PushAll(two, Range(0, 300), 0.1f);
  const std::string dir = Dir("ck");
  ASSERT_TRUE(SaveAll(&fs_, two, dir, SaveMode::kBase).ok());
  const Snapshot saved = Capture(two, 400);
  auto listing = [&] {
    std::set<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename());
    return names;
  };
  const std::set<std::string> complete = listing();

  PushAll(two, Range(100, 400), 0.2f);
  {
    FaultInjectionFileSystem dying(&fs_);
    dying.DieAtNth(FaultInjectionFileSystem::Op::kAppend, 5);
    Checkpointer ck(&dying, 0, 2, &pool_);
    ASSERT_FALSE(ck.Save(dir, SaveMode::kBase, two[0].tables()).ok());
  }
  int tmp = 0, unpublished = 0;
  for (const std::string& n : listing()) {
    tmp += n.ends_with(".tmp");
    unpublished += !complete.contains(n) && !n.ends_with(".tmp");
  }
  ASSERT_GE(tmp, 1);
  ASSERT_GE(unpublished, 1);
  // A temp file of server 1's (shard 11 is its) is not server 0's to remove.
  const std::string others = "t1-g000001-shard00011.bin.tmp";
  std::ofstream(std::filesystem::path(dir) / others) << "server 1 writing";

  std::vector<Server> fresh = MakeCluster(2, kSparseYaml, &pool_);
  std::set<std::string> expected = complete;
  expected.insert(others);
  for (int rank : {0, 1}) {
    Checkpointer ck(&fs_, rank, 2, &pool_);
    ASSERT_TRUE(ck.Load(dir, fresh[rank].tables()).ok());
    if (rank == 1) expected.erase(others);
    EXPECT_EQ(listing(), expected) << "after the load of server " << rank;
  }
  EXPECT_TRUE(Capture(fresh, 400) == saved);
}

TEST_F(CheckpointTest, DenseExportsAsNpy) {
  std::vector<Server> one = MakeCluster(1, kSparseYaml, &pool_);
  PushAll(one, Range(0, 1), 0.5f);
  const std::string path = Dir("w.npy");
  ASSERT_TRUE(fs_.CreateDir(Dir("")).ok());
  ASSERT_TRUE(ExportDenseNpy(*one[0].dense, &fs_, path).ok());
  std::string bytes = fs_.ReadFile(path).value();
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  uint16_t header_len;
  std::memcpy(&header_len, bytes.data() + 8, 2);
  EXPECT_EQ((10 + header_len) % 64, 0);
  const std::string header = bytes.substr(10, header_len);
  EXPECT_THAT(header, HasSubstr("'descr': '<f4'"));
  EXPECT_THAT(header, HasSubstr("'fortran_order': False"));
  EXPECT_THAT(header, HasSubstr("'shape': (10,)"));
  EXPECT_EQ(header.back(), '\n');
  ASSERT_EQ(bytes.size(), 10u + header_len + 10 * sizeof(float));
  std::vector<float> values(10), stored(10);
  ASSERT_TRUE(one[0].dense->Pull(values).ok());
  std::memcpy(stored.data(), bytes.data() + 10 + header_len, 10 * sizeof(float));
  EXPECT_EQ(stored, values);
}

}  // namespace
}  // namespace fleet::ps
