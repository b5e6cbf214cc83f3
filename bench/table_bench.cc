// table_bench: one server's sparse table alone (no network), next to two
// references measured in the same run, each an index from key to a row of
// one contiguous array, updated with the same optimizer rule on one thread,
// without shards, locks, admission or change marks: an absl::flat_hash_map
// (a tight single-thread table), and a std::unordered_map, the table
// bench/pslite_driver.cc serves ps-lite's requests with (what ps-lite's own
// examples store rows in). The ratios show what SparseTable's structure
// costs (or saves: it prefetches and may use the pool) per key.
//
//   build/bin/table_bench            # 131072-key requests, 528384 rows, adagrad
//   build/bin/table_bench --rows=10000000 --keys=16384 --rule=sgd
//   build/bin/table_bench --rows=4000 --keys=1000 --dim=1 --threads=0
//   # ps_bench --preset=pslite's small shape as one server sees it (ps-lite's
//   # partition and key order):
//   build/bin/table_bench --rows=5000 --keys=1000 --dim=1 --rule=sgd --threads=0
//       --partition=range --sorted_keys --tier=false
//
// All three hold the same rows and serve the same requests (distinct keys
// drawn at random from the rows, new ones each request, in increasing order
// with --sorted_keys); times are per key,
// min and median over requests. --evict_kib writes other memory between
// two requests (untimed), as a server's network work does: a small table
// then no longer starts each request in the caches.
//
// Then (--tier, on by default) the disk tier beside the memory table: the
// same CTR table (--tier_rows rows, dim 8, adagrad) once in memory and once
// with storage ssd and --tier_cache rows in memory. Pull and push rows/s of
// requests whose keys are 100%, 90% and 50% rows held in memory (the rest
// read from disk), a Zipf-distributed key stream (pull then push of each
// step, the training pattern) whose hot ranks fit the cache, and the bytes
// a row takes in memory and on disk (after compaction).
//
//   build/bin/table_bench --tier_rows=4000000 --tier_cache=800000
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "comm/absl_mutex_mode.h"
#include "comm/splitmix.h"
#include "ps/table/optimizer.h"
#include "ps/table/sparse_table.h"
#include "ps/table/ssd_sparse_table.h"

DEFINE_int64(rows, 528384, "rows in the table (populated before measuring)");
DEFINE_int64(keys, 131072, "distinct keys per request");
DEFINE_int64(dim, 8, "values per key");
DEFINE_string(rule, "adagrad", "optimizer rule: sgd | adagrad | adam");
DEFINE_int32(threads, 2, "table pool threads (0: everything on the calling thread)");
DEFINE_int32(local_shards, 16, "local_shard_num of the table (16: its default)");
DEFINE_string(partition, "hash", "partition of the table: hash (its default) | range (ps-lite's)");
DEFINE_bool(sorted_keys, false,
            "each request's keys in increasing order (ps-lite's KVWorker requires it; under "
            "--partition=range the table then finds each local shard's keys by binary search)");
DEFINE_int32(evict_kib, 0,
             "write this many KiB of other memory between two timed requests (untimed), as a "
             "server's network and other work do between two requests of one table");
DEFINE_int32(requests, 0, "requests per measurement; 0 = about 1.5 s worth");
DEFINE_bool(tier, true, "also compare the disk tier (storage ssd) with the memory table");
DEFINE_int64(tier_rows, 1000000, "rows of the disk-tier comparison's CTR table");
DEFINE_int64(tier_cache, 200000, "storage.cache_rows of its disk-tier table");
DEFINE_int64(tier_keys, 4096, "distinct keys per request of the disk-tier comparison");
DEFINE_double(tier_zipf, 1.05, "Zipf exponent of the key stream's ranks");
DEFINE_string(tier_dir, "",
              "folder for the disk tier's database (default: one under /tmp, removed)");

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;

// A reference: key -> index into one array of rows [value | state].
template <typename Index>
class Reference {
 public:
  Reference(const ps::OptimizerConfig& config, size_t dim, const std::vector<uint64_t>& keys)
      : rule_(ps::MakeOptimizerRule(config)), dim_(dim), width_(dim + rule_->state_size(dim)) {
    rows_.assign(keys.size() * width_, 0.0f);
    index_.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      index_[keys[i]] = static_cast<uint32_t>(i);
      rule_->InitState(dim_, {rows_.data() + i * width_ + dim_, width_ - dim_});
    }
  }
  void Pull(std::span<const uint64_t> keys, float* out) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      const float* row = rows_.data() + size_t{index_.find(keys[i])->second} * width_;
      std::copy_n(row, dim_, out + i * dim_);
    }
  }
  void Push(std::span<const uint64_t> keys, const float* grads) {
    for (size_t i = 0; i < keys.size(); ++i) {
      float* row = rows_.data() + size_t{index_.find(keys[i])->second} * width_;
      rule_->Update({row, dim_}, {row + dim_, width_ - dim_}, {grads + i * dim_, dim_});
    }
  }

 private:
  std::unique_ptr<ps::OptimizerRule> rule_;
  size_t dim_, width_;
  Index index_;
  std::vector<float> rows_;
};

struct PerKey {
  double min_ns = 0, p50_ns = 0;
};

// Times fn(request) over `n` requests (each with fresh keys), per key.
PerKey Measure(int n, size_t keys_per_request, const std::function<void(int)>& fn) {
  std::vector<double> ns;
  static std::vector<char> other(static_cast<size_t>(FLAGS_evict_kib) << 10);
  for (int r = 0; r < n; ++r) {
    for (size_t at = 0; at < other.size(); at += 64) other[at] = static_cast<char>(r + at);
    const auto t0 = Clock::now();
    fn(r);
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                 keys_per_request);
  }
  std::sort(ns.begin(), ns.end());
  return {ns.front(), ns[ns.size() / 2]};
}

// ---- The disk tier beside the memory table ----

// Draws ranks 0..n-1 with P(k) ~ 1 / (k + 1)^s.
class Zipf {
 public:
  Zipf(size_t n, double s) : cdf_(n) {
    double total = 0;
    for (size_t k = 0; k < n; ++k) cdf_[k] = total += std::pow(k + 1.0, -s);
    for (double& c : cdf_) c /= total;
  }
  size_t operator()(std::mt19937_64& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::min<size_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(),
                            cdf_.size() - 1);
  }
  // Probability mass of ranks [0, k).
  double Mass(size_t k) const { return k == 0 ? 0 : cdf_[std::min(k, cdf_.size()) - 1]; }

 private:
  std::vector<double> cdf_;
};

// The memory table and the disk tier, driven the same way.
struct TierPair {
  std::unique_ptr<ps::SparseTable> memory;
  std::unique_ptr<ps::SparseTable> disk;
};

int TierMain(ThreadPool* pool) {
  const size_t rows = FLAGS_tier_rows, cache = FLAGS_tier_cache, n = FLAGS_tier_keys;
  CHECK(cache >= 10 && cache < rows && n * 4 < cache)
      << "--tier_cache must be in [10, --tier_rows) and above 4 x --tier_keys";
  const bool own_dir = FLAGS_tier_dir.empty();
  const std::string dir =
      own_dir ? absl::StrFormat("/tmp/table_bench_tier.%d", ::getpid()) : FLAGS_tier_dir;
  const std::string table = absl::StrFormat(
      "{id: 2, kind: sparse, dim: 8, accessor: ctr, local_shard_num: %d, "
      "optimizer: {rule: adagrad}, ctr: {embedx_threshold: 0}",
      FLAGS_local_shards);
  auto memory_config = ps::ParseTableConfig(YAML::Load(table + "}"));
  auto disk_config = ps::ParseTableConfig(YAML::Load(
      absl::StrFormat("%s, storage: {kind: ssd, path: '%s', cache_rows: %d}}", table, dir, cache)));
  CHECK(memory_config.ok() && disk_config.ok());
  ps::RowDbSet dbs(0);
  TierPair t;
  t.memory = ps::SparseTable::Create(*memory_config, {0, memory_config->shard_num}, pool).value();
  auto disk = ps::CreateSparseTable(*disk_config, {0, disk_config->shard_num}, pool, &dbs);
  CHECK(disk.ok()) << disk.status().ToString();
  t.disk = std::move(disk).value();
  const size_t dim = t.memory->pull_dim();

  // Every row pushed once (show 1); the hot set (4/5 of the cache) many
  // times more, so the accessor's score keeps it in memory.
  std::vector<uint64_t> all(rows);
  for (size_t i = 0; i < rows; ++i) all[i] = Mix64(i + 1) ^ 0x5bd1e995;
  const size_t hot = cache * 4 / 5;
  std::vector<float> grads(n * dim), shows(n, 1.0f), clicks(n, 0.0f), values(n * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 1e-3f * static_cast<float>(1 + i % 7);
  const auto populate0 = Clock::now();
  for (ps::SparseTable* tt : {t.memory.get(), t.disk.get()}) {
    for (size_t b = 0; b < rows; b += n) {
      const size_t m = std::min(n, rows - b);
      CHECK(tt->PushGrad({all.data() + b, m}, {grads.data(), m * dim}, {shows.data(), m},
                         {clicks.data(), m})
                .ok());
    }
    std::vector<float> many(n, 100.0f);
    for (size_t b = 0; b < hot; b += n) {
      const size_t m = std::min(n, hot - b);
      CHECK(tt->PushGrad({all.data() + b, m}, {grads.data(), m * dim}, {many.data(), m},
                         {clicks.data(), m})
                .ok());
    }
  }
  const ps::SparseTableStats ms = t.memory->Stats(), ds = t.disk->Stats();
  std::printf(
      "\ndisk tier beside the memory table: %zu rows (CTR accessor, dim 8 + embed 1, adagrad), "
      "storage.cache_rows %zu (%.0f%% of the rows), %zu keys per request, in %s; populated both in "
      "%.1f s\n",
      rows, cache, 100.0 * cache / rows, n, dir.c_str(),
      std::chrono::duration<double>(Clock::now() - populate0).count());
  std::printf(
      "  memory per row: %.0f B (memory table: %.0f MiB); disk tier holds %lu rows in "
      "memory (%.0f MiB), %lu on disk\n",
      double(ms.bytes) / ms.rows, ms.bytes / 1048576.0, ds.rows - ds.disk_rows,
      ds.bytes / 1048576.0, ds.disk_rows);

  std::mt19937_64 rng(11);
  const int requests = FLAGS_requests > 0 ? FLAGS_requests : 40;
  // Requests whose keys are `hit` held in memory: that share from the hot
  // set, the rest cold rows not asked for before (on disk).
  size_t next_cold = hot;
  auto make_requests = [&](double hit) {
    std::vector<std::vector<uint64_t>> out(requests);
    for (auto& k : out) {
      const size_t from_hot = static_cast<size_t>(std::lround(hit * n));
      for (size_t i = 0; i < from_hot; ++i) k.push_back(all[rng() % hot]);
      for (size_t i = from_hot; i < n; ++i) {
        k.push_back(all[next_cold]);
        next_cold = next_cold + 1 < rows ? next_cold + 1 : hot;
      }
      std::sort(k.begin(), k.end());
      k.erase(std::unique(k.begin(), k.end()), k.end());
    }
    return out;
  };
  auto rate = [&](ps::SparseTable* tt, const std::vector<std::vector<uint64_t>>& reqs, bool push) {
    const PerKey p = Measure(static_cast<int>(reqs.size()), 1, [&](int r) {
      const size_t m = reqs[r].size();
      CHECK((push ? tt->PushGrad(reqs[r], {grads.data(), m * dim}, {shows.data(), m},
                                 {clicks.data(), m})
                  : tt->Pull(reqs[r], {values.data(), m * dim}))
                .ok());
    });
    double keys = 0;
    for (const auto& k : reqs) keys += static_cast<double>(k.size());
    return keys / reqs.size() / (p.p50_ns * 1e-9) / 1e6;  // Mrows/s at the median request
  };
  std::printf(
      "  requests (p50 of %d)      memory Mrows/s     disk tier Mrows/s   disk/memory\n"
      "  hit rate                  pull     push      pull     push       pull   push   "
      "rows read from disk\n",
      requests);
  for (double hit : {1.0, 0.9, 0.5}) {
    const std::vector<std::vector<uint64_t>> pulls = make_requests(hit),
                                             pushes = make_requests(hit);
    const uint64_t read0 = t.disk->Stats().disk_rows_read;
    const double mp = rate(t.memory.get(), pulls, false), mq = rate(t.memory.get(), pushes, true);
    const double dp = rate(t.disk.get(), pulls, false), dq = rate(t.disk.get(), pushes, true);
    const double asked = static_cast<double>(requests) * (pulls[0].size() + pushes[0].size());
    std::printf(
        "  %3.0f%%                   %7.2f  %7.2f   %7.2f  %7.2f      %5.2f  %5.2f   %.0f%%\n",
        100 * hit, mp, mq, dp, dq, dp / mp, dq / mq,
        100.0 * (t.disk->Stats().disk_rows_read - read0) / asked);
  }

  // The training pattern: each step pulls its keys, then pushes them.
  const Zipf zipf(rows, FLAGS_tier_zipf);
  std::vector<std::vector<uint64_t>> steps(requests * 3);
  for (auto& k : steps) {
    for (size_t i = 0; i < n; ++i) k.push_back(all[zipf(rng)]);
    std::sort(k.begin(), k.end());
    k.erase(std::unique(k.begin(), k.end()), k.end());
  }
  auto stream = [&](ps::SparseTable* tt) {
    auto step = [&](const std::vector<uint64_t>& k) {
      const size_t m = k.size();
      CHECK(tt->Pull(k, {values.data(), m * dim}).ok());
      CHECK(tt->PushGrad(k, {grads.data(), m * dim}, {shows.data(), m}, {clicks.data(), m}).ok());
    };
    for (int s = 0; s < requests; ++s) step(steps[s]);  // warm-up: the hot ranks settle
    size_t keys = 0;
    const auto t0 = Clock::now();
    for (size_t s = requests; s < steps.size(); ++s) {
      step(steps[s]);
      keys += steps[s].size();
    }
    return keys / std::chrono::duration<double>(Clock::now() - t0).count() / 1e6;
  };
  const uint64_t read0 = t.disk->Stats().disk_rows_read;
  const double zm = stream(t.memory.get()), zd = stream(t.disk.get());
  size_t measured = 0;
  for (size_t s = 0; s < steps.size(); ++s) measured += steps[s].size();
  std::printf(
      "  Zipf(%.2f) key stream, pull + push per step (the cache holds ranks worth %.0f%% of the "
      "draws):\n    memory %.2f Mrows/s, disk tier %.2f Mrows/s, disk/memory %.2f; %.1f%% of the "
      "rows read from disk\n",
      FLAGS_tier_zipf, 100 * zipf.Mass(cache), zm, zd, zd / zm,
      100.0 * (t.disk->Stats().disk_rows_read - read0) / measured);

  auto* ssd = dynamic_cast<ps::SsdSparseTable*>(t.disk.get());
  CHECK(ssd != nullptr);
  CHECK(ssd->MoveAllToDisk().ok());
  CHECK(ssd->CompactDisk().ok());
  const ps::SparseTableStats after = t.disk->Stats();
  std::printf(
      "  bytes per row: %.0f in memory (memory table), %.0f on disk after compaction "
      "(%lu rows, %.1f MiB)\n",
      double(ms.bytes) / ms.rows, double(after.disk_bytes) / after.disk_rows, after.disk_rows,
      after.disk_bytes / 1048576.0);
  t = TierPair();
  if (own_dir) std::filesystem::remove_all(dir);
  return 0;
}

int Main() {
  bench::PrintEnvironment("table_bench");
  UseReleaseMutexChecksInOptimizedBuilds();  // as ps_server does
  CHECK_GE(FLAGS_rows, FLAGS_keys)
      << "--rows must be >= --keys (requests hold distinct stored keys)";
  // Through the job-config parser, so a bad --rule is refused as a config would be.
  auto parsed = ps::ParseTableConfig(YAML::Load(
      absl::StrFormat(
          "{id: 1, kind: sparse, dim: %d, local_shard_num: %d, partition: %s, optimizer: {rule: %s}}",
          FLAGS_dim, FLAGS_local_shards, FLAGS_partition, FLAGS_rule)));
  if (!parsed.ok()) {
    std::fprintf(stderr, "table_bench: %s\n", parsed.status().ToString().c_str());
    return 2;
  }
  const ps::TableConfig config = parsed.value();
  std::unique_ptr<ThreadPool> pool =
      FLAGS_threads > 0 ? std::make_unique<ThreadPool>(FLAGS_threads) : nullptr;
  auto table = ps::SparseTable::Create(config, {0, config.shard_num}, pool.get()).value();

  const size_t n = FLAGS_keys, dim = FLAGS_dim;
  std::vector<uint64_t> all(FLAGS_rows);
  for (size_t i = 0; i < all.size(); ++i) all[i] = Mix64(i + 1);
  std::vector<float> values(n * dim), grads(n * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 1e-3f * static_cast<float>(1 + i % 7);
  const auto populate0 = Clock::now();
  for (size_t b = 0; b < all.size(); b += n) {
    const size_t m = std::min(n, all.size() - b);
    CHECK(table->Pull({all.data() + b, m}, {values.data(), m * dim}).ok());
  }
  Reference<absl::flat_hash_map<uint64_t, uint32_t>> flat(config.optimizer, dim, all);
  Reference<std::unordered_map<uint64_t, uint32_t>> node(config.optimizer, dim, all);
  std::printf(
      "%ld rows of dim %ld (%s), %ld keys per request%s, %d pool threads, %d local shards, %s "
      "partition; populated in %.1f s\n",
      FLAGS_rows, FLAGS_dim, FLAGS_rule.c_str(), FLAGS_keys, FLAGS_sorted_keys ? " (sorted)" : "",
      FLAGS_threads, FLAGS_local_shards, FLAGS_partition.c_str(),
      std::chrono::duration<double>(Clock::now() - populate0).count());

  // Requests: distinct keys drawn from the stored rows, different each time.
  std::mt19937_64 rng(7);
  const int requests =
      FLAGS_requests > 0 ? FLAGS_requests : std::clamp<int>(static_cast<int>(3e6 / n), 5, 2000);
  std::vector<std::vector<uint64_t>> keys(requests);
  std::vector<uint64_t> deck = all;
  for (auto& k : keys) {
    // A partial Fisher-Yates shuffle: the first n of the deck are a fresh sample.
    for (size_t i = 0; i < n; ++i) std::swap(deck[i], deck[i + rng() % (deck.size() - i)]);
    k.assign(deck.begin(), deck.begin() + n);
    if (FLAGS_sorted_keys) std::sort(k.begin(), k.end());
  }

  const PerKey table_pull =
      Measure(requests, n, [&](int r) { CHECK(table->Pull(keys[r], values).ok()); });
  const PerKey flat_pull = Measure(requests, n, [&](int r) { flat.Pull(keys[r], values.data()); });
  const PerKey node_pull = Measure(requests, n, [&](int r) { node.Pull(keys[r], values.data()); });
  const PerKey table_push =
      Measure(requests, n, [&](int r) { CHECK(table->PushGrad(keys[r], grads).ok()); });
  const PerKey flat_push = Measure(requests, n, [&](int r) { flat.Push(keys[r], grads.data()); });
  const PerKey node_push = Measure(requests, n, [&](int r) { node.Push(keys[r], grads.data()); });

  std::printf("%d requests each                    min ns/key  p50 ns/key   Mkeys/s (p50)\n",
              requests);
  auto row = [](const char* label, const PerKey& p) {
    std::printf("  %-31s %10.1f  %10.1f  %10.2f\n", label, p.min_ns, p.p50_ns, 1e3 / p.p50_ns);
  };
  row("SparseTable pull", table_pull);
  row("flat_hash_map pull", flat_pull);
  row("unordered_map pull (ps-lite's)", node_pull);
  row("SparseTable push", table_push);
  row("flat_hash_map push", flat_push);
  row("unordered_map push (ps-lite's)", node_push);
  std::printf(
      "p50 time per key, SparseTable over flat_hash_map: pull %.2fx, push %.2fx; over "
      "unordered_map: pull %.2fx, push %.2fx\n",
      table_pull.p50_ns / flat_pull.p50_ns, table_push.p50_ns / flat_push.p50_ns,
      table_pull.p50_ns / node_pull.p50_ns, table_push.p50_ns / node_push.p50_ns);
  return FLAGS_tier ? TierMain(pool.get()) : 0;
}

}  // namespace
}  // namespace fleet

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return fleet::Main();
}
