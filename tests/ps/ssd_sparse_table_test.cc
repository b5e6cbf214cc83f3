// The disk tier (SsdSparseTable over RowDb) against the memory table: the
// same requests must leave the same rows, bit for bit, however small the
// cache, and checkpoints must move between the two kinds and server counts.
#include "ps/table/ssd_sparse_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ps/checkpoint.h"
#include "table_test_util.h"

namespace fleet::ps {
namespace {

using ::testing::HasSubstr;

// A CTR table small enough to see every path: embedx created after 2 shows,
// rows deleted after 2 unseen passes, adagrad state in row and extension.
std::string CtrYaml(const std::string& storage, int min_count = 1,
                    const std::string& partition = "hash") {
  return absl::StrFormat(
      "{id: 4, kind: sparse, dim: 3, accessor: ctr, shard_num: 24, local_shard_num: 5, "
      "partition: %s, "
      "optimizer: {rule: adagrad, learning_rate: 0.05}, initializer: {kind: uniform, range: 0.1, "
      "seed: 3}, ctr: {embedx_threshold: 1.5, nonclk_coeff: 1, delete_after_unseen_passes: 2}, "
      "admission: {min_count: %d}%s}",
      partition, min_count, storage.empty() ? "" : absl::StrCat(", storage: ", storage));
}

class SsdTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            absl::StrCat("ssd_table_test_", ::getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A database per `folder` (and server rank) under the test's root.
  std::string Storage(uint64_t cache_rows, int evict_unseen_passes = 1,
                      const std::string& folder = "tier") const {
    return absl::StrFormat("{kind: ssd, path: '%s', cache_rows: %d, evict_unseen_passes: %d}",
                           (root_ / folder).string(), cache_rows, evict_unseen_passes);
  }

  // A disk-tier table as server `rank` holds it, on a database of its own.
  std::unique_ptr<SparseTable> MakeSsd(const std::string& yaml, ThreadPool* pool,
                                       ShardRange owned = {}, int rank = 0) {
    const TableConfig c = ConfigFromYaml(yaml);
    if (owned.end == 0) owned = {0, c.shard_num};
    dbs_.push_back(std::make_unique<RowDbSet>(rank));
    Result<std::unique_ptr<SparseTable>> t = CreateSparseTable(c, owned, pool, dbs_.back().get());
    CHECK(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }

  std::filesystem::path root_;
  std::vector<std::unique_ptr<RowDbSet>> dbs_;
};

// Random requests of one of the kinds, the same on both tables.
class Driver {
 public:
  // `spread`: key k of [0, key_space) is sent as k * (2^64 / key_space),
  // so the keys cover the whole uint64 range (and every range shard).
  explicit Driver(uint64_t seed, bool spread = false) : rng_(seed), spread_(spread) {}

  // Runs `steps` random operations on every table and checks that each
  // pull returned the same bits. Keys come from [0, key_space) (spread).
  void Run(std::vector<SparseTable*> tables, int steps, uint64_t key_space) {
    const size_t dim = tables[0]->pull_dim();
    for (int s = 0; s < steps; ++s) {
      const int op = std::uniform_int_distribution<int>(0, 19)(rng_);
      std::vector<uint64_t> keys(std::uniform_int_distribution<int>(1, 40)(rng_));
      for (uint64_t& k : keys) k = Pick(key_space) * (spread_ ? UINT64_MAX / key_space : 1);
      std::vector<float> grads(keys.size() * dim), shows(keys.size()), clicks(keys.size());
      for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(rng_);
      for (size_t i = 0; i < keys.size(); ++i) {
        shows[i] = 1;
        clicks[i] = static_cast<float>(std::bernoulli_distribution(0.3)(rng_));
      }
      if (op < 8) {
        std::vector<std::vector<float>> pulled;
        for (SparseTable* t : tables) {
          pulled.emplace_back(keys.size() * dim);
          ASSERT_TRUE(t->Pull(keys, pulled.back()).ok());
        }
        for (size_t i = 1; i < pulled.size(); ++i) ASSERT_EQ(pulled[0], pulled[i]) << "step " << s;
      } else if (op < 16) {
        for (SparseTable* t : tables) ASSERT_TRUE(t->PushGrad(keys, grads, shows, clicks).ok());
      } else if (op < 18) {
        for (SparseTable* t : tables) ASSERT_TRUE(t->PushDelta(keys, grads, shows, clicks).ok());
      } else if (op == 18) {
        for (SparseTable* t : tables) t->EndPass();
      } else {
        std::vector<uint64_t> deleted;
        for (SparseTable* t : tables) deleted.push_back(t->Shrink());
        for (uint64_t d : deleted) ASSERT_EQ(d, deleted[0]) << "step " << s;
      }
    }
  }

 private:
  // Skewed: a few keys are hot, as CTR data is.
  uint64_t Pick(uint64_t key_space) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    return static_cast<uint64_t>(static_cast<double>(key_space) * u * u * u);
  }
  std::mt19937_64 rng_;
  const bool spread_;
};

TEST_F(SsdTableTest, SameRowsAsTheMemoryTableWhateverTheCache) {
  ThreadPool pool(2);
  for (int min_count : {1, 2}) {
    for (uint64_t cache : {1, 7, 60, 100000}) {
      SCOPED_TRACE(absl::StrCat("cache_rows ", cache, ", admission ", min_count));
      auto memory = SparseTable::Create(ConfigFromYaml(CtrYaml("", min_count)), {0, 24}, &pool);
      ASSERT_TRUE(memory.ok());
      auto ssd = MakeSsd(
          CtrYaml(Storage(cache, 1, absl::StrCat("tier", cache, "_", min_count)), min_count),
          cache == 7 ? nullptr : &pool);
      Driver driver(cache * 31 + min_count);
      for (int round = 0; round < 6; ++round) {
        driver.Run({memory->get(), ssd.get()}, 120, 400);
        const SparseTableStats m = (*memory)->Stats(), d = ssd->Stats();
        ASSERT_EQ(m.rows, d.rows);
        ASSERT_EQ(m.ext_rows, d.ext_rows);
        ASSERT_EQ(m.pending_keys, d.pending_keys);
        ASSERT_LE(d.rows - d.disk_rows, std::max<uint64_t>(cache, 40))
            << "more rows in memory than the bound plus one request's keys";
        ASSERT_EQ(DumpRows(**memory), DumpRows(*ssd)) << "round " << round;
      }
      // Rows read back one by one (DebugRow ages rows on disk the same way).
      std::vector<float> mr, me, dr, de;
      for (uint64_t k = 0; k < 400; ++k) {
        ASSERT_EQ((*memory)->DebugRow(k, &mr, &me), ssd->DebugRow(k, &dr, &de)) << k;
        ASSERT_EQ(mr, dr) << k;
        ASSERT_EQ(me, de) << k;
      }
      if (cache < 100) {
        EXPECT_GT(ssd->Stats().disk_rows, 0u);
      }
    }
  }
}

TEST_F(SsdTableTest, EndPassMovesRowsNotSeenDown) {
  auto t = MakeSsd(CtrYaml(Storage(1000, /*evict_unseen_passes=*/1)), nullptr);
  std::vector<uint64_t> a = {1, 2, 3, 4}, b = {5, 6};
  std::vector<float> ga(a.size() * t->push_dim(), 0.5f), gb(b.size() * t->push_dim(), 0.5f);
  ASSERT_TRUE(t->PushGrad(a, ga).ok());
  t->EndPass();  // a was seen in this pass: stays
  EXPECT_EQ(t->Stats().disk_rows, 0u);
  ASSERT_TRUE(t->PushGrad(b, gb).ok());
  t->EndPass();  // a unseen for one pass now: down
  SparseTableStats s = t->Stats();
  EXPECT_EQ(s.rows, 6u);
  EXPECT_EQ(s.disk_rows, 4u);
  // Pulling a brings it back up.
  std::vector<float> v(a.size() * t->pull_dim());
  ASSERT_TRUE(t->Pull(a, v).ok());
  EXPECT_EQ(t->Stats().disk_rows, 0u);
}

// Either partition: the disk tier writes and reads the shard files of its
// table's partition.
TEST_F(SsdTableTest, CheckpointsMoveBetweenKindsAndServerCounts) {
  for (const std::string partition : {"hash", "range"}) {
    SCOPED_TRACE(partition);
    auto yaml = [&](const std::string& storage) { return CtrYaml(storage, 1, partition); };
    auto folder = [&](const std::string& name) { return absl::StrCat(name, "_", partition); };
    ThreadPool pool(2);
    auto ssd = MakeSsd(yaml(Storage(30, 1, folder("tier"))), &pool);
    auto reference = SparseTable::Create(ConfigFromYaml(yaml("")), {0, 24}, &pool).value();
    Driver driver(7, /*spread=*/true);
    driver.Run({reference.get(), ssd.get()}, 300, 300);
    FileSystem* fs = DefaultFileSystem();
    const std::string dir = (root_ / folder("ckpt")).string();
    Checkpointer one(fs, 0, 1, &pool);
    ASSERT_TRUE(one.Save(dir, SaveMode::kBase, {{ssd.get()}, {}}).ok());
    // A delta after shrinking (deleted keys) and more pushes.
    driver.Run({reference.get(), ssd.get()}, 200, 300);
    ASSERT_GT(ssd->Shrink(), 0u);
    ASSERT_GT(reference->Shrink(), 0u);
    driver.Run({reference.get(), ssd.get()}, 100, 300);
    ASSERT_TRUE(one.Save(dir, SaveMode::kDelta, {{ssd.get()}, {}}).ok());
    const std::string want = DumpRows(*reference);

    // Into memory tables on 3 servers: together they hold the same rows.
    std::string got;
    std::vector<std::unique_ptr<SparseTable>> three;
    for (int r = 0; r < 3; ++r) {
      three.push_back(
          SparseTable::Create(ConfigFromYaml(yaml("")), AssignShards(24, 3, r).value(), &pool)
              .value());
      Checkpointer c(fs, r, 3, &pool);
      ASSERT_TRUE(c.Load(dir, {{three.back().get()}, {}}).ok());
      EXPECT_GT(three.back()->Stats().rows, 0u) << "server " << r;
      got += DumpRows(*three.back());
    }
    EXPECT_EQ(got, want);
    // Into disk-tier tables on 2 servers, and from a memory table's checkpoint.
    got.clear();
    for (int r = 0; r < 2; ++r) {
      auto t =
          MakeSsd(yaml(Storage(5, 1, folder("two"))), &pool, AssignShards(24, 2, r).value(), r);
      Checkpointer c(fs, r, 2, &pool);
      ASSERT_TRUE(c.Load(dir, {{t.get()}, {}}).ok());
      EXPECT_EQ(t->Stats().rows - t->Stats().disk_rows, 0u) << "a load leaves memory empty";
      got += DumpRows(*t);
    }
    EXPECT_EQ(got, want);
    const std::string memory_dir = (root_ / folder("from_memory")).string();
    ASSERT_TRUE(one.Save(memory_dir, SaveMode::kBase, {{reference.get()}, {}}).ok());
    auto loaded = MakeSsd(yaml(Storage(5, 1, folder("loaded"))), nullptr);
    ASSERT_TRUE(one.Load(memory_dir, {{loaded.get()}, {}}).ok());
    EXPECT_EQ(DumpRows(*loaded), want);
  }
}

TEST_F(SsdTableTest, FailedSaveKeepsDeletionsForTheNextDelta) {
  auto t = MakeSsd(CtrYaml(Storage(3)), nullptr);
  auto reference = SparseTable::Create(ConfigFromYaml(CtrYaml("")), {0, 24}, nullptr).value();
  Driver driver(11);
  driver.Run({reference.get(), t.get()}, 200, 100);
  FaultInjectionFileSystem fs(DefaultFileSystem());
  Checkpointer c(&fs, 0, 1, nullptr);
  const std::string dir = (root_ / "ckpt").string();
  ASSERT_TRUE(c.Save(dir, SaveMode::kBase, {{t.get()}, {}}).ok());
  for (int i = 0; i < 3; ++i) {
    t->EndPass();
    reference->EndPass();
  }
  ASSERT_GT(t->Shrink(), 0u);
  reference->Shrink();
  fs.FailNth(FaultInjectionFileSystem::Op::kRename, 1);
  ASSERT_FALSE(c.Save(dir, SaveMode::kDelta, {{t.get()}, {}}).ok());
  ASSERT_TRUE(c.Save(dir, SaveMode::kDelta, {{t.get()}, {}}).ok());
  auto loaded = SparseTable::Create(ConfigFromYaml(CtrYaml("")), {0, 24}, nullptr).value();
  ASSERT_TRUE(c.Load(dir, {{loaded.get()}, {}}).ok());
  EXPECT_EQ(DumpRows(*loaded), DumpRows(*reference));
}

TEST_F(SsdTableTest, ConcurrentRequestsWhileRowsMove) {
  ThreadPool pool(2);
  // sgd with learning rate 1 and gradient 1: embed_w falls by 1 a push.
  auto t = MakeSsd(absl::StrCat("{id: 1, kind: sparse, dim: 2, accessor: ctr, shard_num: 16, "
                                "optimizer: {rule: sgd, learning_rate: 1}, ctr: {embedx_threshold: "
                                "1e9, show_click_decay: 1}, "
                                "storage: ",
                                Storage(64), "}"),
                   &pool);
  constexpr int kThreads = 6, kRounds = 120, kBatch = 50, kKeys = 600;
  std::vector<std::atomic<int>> pushes(kKeys);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::vector<uint64_t> keys(kBatch);
      std::vector<float> grads(kBatch * 3, 0.0f), pulled(kBatch * 3);
      for (int i = 0; i < kBatch; ++i) grads[i * 3] = 1.0f;
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < kBatch; ++i)
          keys[i] = (uint64_t(th) * 7919 + r * 104729 + i * 31) % kKeys;
        std::sort(keys.begin(), keys.end());
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        ASSERT_TRUE(t->PushGrad(keys, std::span<const float>(grads).first(keys.size() * 3)).ok());
        for (uint64_t k : keys) pushes[k].fetch_add(1);
        ASSERT_TRUE(t->Pull(keys, std::span<float>(pulled).first(keys.size() * 3)).ok());
        if (r % 40 == 39 && th == 0) t->EndPass();
      }
    });
  }
  for (auto& th : threads) th.join();
  const SparseTableStats s = t->Stats();
  EXPECT_GT(s.disk_rows, 0u);
  std::vector<float> row, ext;
  int stored = 0;
  for (uint64_t k = 0; k < kKeys; ++k) {
    if (pushes[k].load() == 0) continue;
    ++stored;
    ASSERT_TRUE(t->DebugRow(k, &row, &ext)) << k;
    // row: show, click, unseen, embed_w (initial 0).
    EXPECT_EQ(row[CtrAccessor::kEmbed], -float(pushes[k].load())) << "key " << k;
    EXPECT_EQ(row[CtrAccessor::kShow], float(pushes[k].load())) << "key " << k;
  }
  EXPECT_EQ(s.rows, uint64_t(stored));
}

TEST_F(SsdTableTest, RefusesFoldersItDidNotMake) {
  const std::string path = (root_ / "tier").string();
  std::filesystem::create_directories(root_ / "tier" / "s0");
  std::ofstream(root_ / "tier" / "s0" / "precious.txt") << "user data";
  Result<std::shared_ptr<RowDb>> db = RowDb::Open(path, 0, 1 << 20);
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), StatusCode::kFailedPrecondition) << db.status().ToString();
  EXPECT_THAT(db.status().ToString(), HasSubstr("marker"));
  EXPECT_TRUE(std::filesystem::exists(root_ / "tier" / "s0" / "precious.txt"));

  // A symbolic link in the folder's place is not followed.
  std::filesystem::create_directories(root_ / "elsewhere");
  std::filesystem::create_directory_symlink(root_ / "elsewhere", root_ / "tier" / "s1");
  db = RowDb::Open(path, 1, 1 << 20);
  ASSERT_FALSE(db.ok());
  EXPECT_THAT(db.status().ToString(), HasSubstr("symbolic link"));

  // A folder it made is emptied and reused; a second live user is refused.
  {
    Result<std::shared_ptr<RowDb>> first = RowDb::Open(path, 2, 1 << 20);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    struct stat st;
    ASSERT_EQ(::stat((root_ / "tier" / "s2").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    Result<std::shared_ptr<RowDb>> second = RowDb::Open(path, 2, 1 << 20);
    ASSERT_FALSE(second.ok());
    EXPECT_THAT(second.status().ToString(), HasSubstr("in use"));
    // A link planted among its files is removed itself, never followed.
    std::ofstream(root_ / "elsewhere" / "keep.txt") << "keep";
    std::filesystem::create_symlink(root_ / "elsewhere" / "keep.txt",
                                    root_ / "tier" / "s2" / "planted");
  }
  Result<std::shared_ptr<RowDb>> again = RowDb::Open(path, 2, 1 << 20);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_FALSE(std::filesystem::is_symlink(root_ / "tier" / "s2" / "planted"));
  EXPECT_TRUE(std::filesystem::exists(root_ / "elsewhere" / "keep.txt"));
}

TEST(SsdTableConfigTest, StorageKeysAreChecked) {
  auto parse = [](const std::string& storage, const std::string& accessor = "ctr") {
    return ParseTableConfig(YAML::Load(absl::StrCat(
        "{id: 0, kind: sparse, dim: 2, accessor: ", accessor, ", storage: ", storage, "}")));
  };
  Result<TableConfig> ok = parse("{kind: ssd, path: /tmp/x, cache_rows: 10}");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->storage.kind, StorageKind::kSsd);
  EXPECT_EQ(ok->storage.cache_rows, 10u);
  EXPECT_EQ(ok->storage.evict_unseen_passes, 1u);
  // Round trip through a manifest's YAML.
  Result<TableConfig> back = ParseTableConfig(YAML::Load(TableConfigToYaml(*ok)));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->storage.path, "/tmp/x");
  EXPECT_EQ(back->storage.cache_rows, 10u);
  for (const auto& [storage, accessor, key] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"{kind: ssd, path: /tmp/x}", "plain", "storage.kind"},
           {"{kind: ssd}", "ctr", "storage.path"},
           {"{kind: ssd, path: /x, cache_rows: 0}", "ctr", "storage.cache_rows"},
           {"{kind: ssd, path: /x, evict_unseen_passes: 0}", "ctr", "storage.evict_unseen_passes"},
           {"{kind: disk, path: /x}", "ctr", "storage.kind"},
           {"{kind: ssd, path: /x, cache: 3}", "ctr", "storage.cache"}}) {
    Result<TableConfig> bad = parse(storage, accessor);
    ASSERT_FALSE(bad.ok()) << storage;
    EXPECT_THAT(bad.status().ToString(), HasSubstr(key)) << storage;
  }
  Result<TableConfig> quota = ParseTableConfig(
      YAML::Load("{id: 0, kind: sparse, dim: 2, accessor: ctr, max_rows_per_server: 5, "
                 "storage: {kind: ssd, path: /x}}"));
  ASSERT_FALSE(quota.ok());
  EXPECT_THAT(quota.status().ToString(), HasSubstr("max_rows_per_server"));
}

}  // namespace
}  // namespace fleet::ps
