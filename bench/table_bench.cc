// table_bench: one server's sparse table alone (no network), next to a
// reference measured in the same run: an absl::flat_hash_map from key to a
// row of one contiguous array, updated with the same optimizer rule on one
// thread, without shards, locks, admission or change marks. The ratio shows
// what SparseTable's structure costs (or saves: it prefetches and may use
// the pool) per key.
//
//   build/bin/table_bench            # 131072-key requests, 528384 rows, adagrad
//   build/bin/table_bench --rows=10000000 --keys=16384 --rule=sgd
//   build/bin/table_bench --rows=4000 --keys=1000 --dim=1 --threads=0
//
// Both sides hold the same rows and serve the same requests (distinct keys
// drawn at random from the rows, new ones each request); times are per key,
// min and median over requests.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "comm/absl_mutex_mode.h"
#include "comm/splitmix.h"
#include "ps/table/optimizer.h"
#include "ps/table/sparse_table.h"

DEFINE_int64(rows, 528384, "rows in the table (populated before measuring)");
DEFINE_int64(keys, 131072, "distinct keys per request");
DEFINE_int64(dim, 8, "values per key");
DEFINE_string(rule, "adagrad", "optimizer rule: sgd | adagrad | adam");
DEFINE_int32(threads, 2, "table pool threads (0: everything on the calling thread)");
DEFINE_int32(local_shards, 64, "local_shard_num of the table");
DEFINE_int32(requests, 0, "requests per measurement; 0 = about 1.5 s worth");

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;

// The reference: key -> index into one array of rows [value | state].
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
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  std::vector<float> rows_;
};

struct PerKey {
  double min_ns = 0, p50_ns = 0;
};

// Times fn(request) over `n` requests (each with fresh keys), per key.
PerKey Measure(int n, size_t keys_per_request, const std::function<void(int)>& fn) {
  std::vector<double> ns;
  for (int r = 0; r < n; ++r) {
    const auto t0 = Clock::now();
    fn(r);
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                 keys_per_request);
  }
  std::sort(ns.begin(), ns.end());
  return {ns.front(), ns[ns.size() / 2]};
}

int Main() {
  bench::PrintEnvironment("table_bench");
  UseReleaseMutexChecksInOptimizedBuilds();  // as ps_server does
  CHECK_GE(FLAGS_rows, FLAGS_keys)
      << "--rows must be >= --keys (requests hold distinct stored keys)";
  // Through the job-config parser, so a bad --rule is refused as a config would be.
  auto parsed = ps::ParseTableConfig(YAML::Load(
      absl::StrFormat("{id: 1, kind: sparse, dim: %d, local_shard_num: %d, optimizer: {rule: %s}}",
                      FLAGS_dim, FLAGS_local_shards, FLAGS_rule)));
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
  Reference reference(config.optimizer, dim, all);
  std::printf(
      "%ld rows of dim %ld (%s), %ld keys per request, %d pool threads, %d local shards; populated "
      "in %.1f s\n",
      FLAGS_rows, FLAGS_dim, FLAGS_rule.c_str(), FLAGS_keys, FLAGS_threads, FLAGS_local_shards,
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
  }

  const PerKey table_pull =
      Measure(requests, n, [&](int r) { CHECK(table->Pull(keys[r], values).ok()); });
  const PerKey ref_pull =
      Measure(requests, n, [&](int r) { reference.Pull(keys[r], values.data()); });
  const PerKey table_push =
      Measure(requests, n, [&](int r) { CHECK(table->PushGrad(keys[r], grads).ok()); });
  const PerKey ref_push =
      Measure(requests, n, [&](int r) { reference.Push(keys[r], grads.data()); });

  std::printf("%d requests each                 min ns/key  p50 ns/key   Mkeys/s (p50)\n",
              requests);
  auto row = [](const char* label, const PerKey& p) {
    std::printf("  %-28s %10.1f  %10.1f  %10.2f\n", label, p.min_ns, p.p50_ns, 1e3 / p.p50_ns);
  };
  row("SparseTable pull", table_pull);
  row("reference pull (1 thread)", ref_pull);
  row("SparseTable push", table_push);
  row("reference push (1 thread)", ref_push);
  std::printf("ratio SparseTable/reference, p50 time per key: pull %.2fx, push %.2fx\n",
              table_pull.p50_ns / ref_pull.p50_ns, table_push.p50_ns / ref_push.p50_ns);
  return 0;
}

}  // namespace
}  // namespace fleet

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return fleet::Main();
}
