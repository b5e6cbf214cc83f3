// Test helpers for the KV store and the collectives: an in-process KV
// server on a free port, N ranks as threads with the first failure rethrown,
// and per-rank seed data in which every element on every rank differs (the
// idea of gloo's Fixture::assignValues).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/gloo_collective.h"
#include "comm/kv_store.h"
#include "comm/shm_collective.h"

namespace fleet::testing {

// A KvStoreServer on 127.0.0.1 and a port the OS picked, so two test runs
// never collide. Stops on destruction.
class LocalKvServer {
 public:
  LocalKvServer() : server_(KvStoreServerOptions{}) {
    Status st = server_.Start();
    if (!st.ok()) throw std::runtime_error("kv server did not start: " + st.ToString());
  }
  KvStoreServer& server() { return server_; }
  std::string endpoint() const { return server_.endpoint(); }
  std::unique_ptr<KvStoreClient> Client(const std::string& job) const {
    return std::make_unique<KvStoreClient>(endpoint(), job);
  }

 private:
  KvStoreServer server_;
};

// A job id unique to the running test, so tests sharing a server (or a
// repeated test) never see each other's keys.
inline std::string UniqueJob() {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "job";
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return name + "." + std::to_string(counter++);
}

// Runs body(rank) for rank in [0, size) on size threads and rethrows the
// first exception once all have ended. Bodies signal failure by throwing;
// the group timeout bounds how long the other ranks stay blocked.
inline void RunRanks(int size, const std::function<void(int)>& body) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Element i of rank `rank` in a group of `size`: distinct across ranks and
// elements, a small integer (so float sums are exact), and the rank holding
// the maximum rotates with i.
inline float SeedValue(int rank, size_t i, int size) {
  return static_cast<float>(i * size + (rank + i) % size);
}

inline std::vector<float> SeedVector(int rank, size_t count, int size) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = SeedValue(rank, i, size);
  return v;
}

// What each collective must produce from every rank's SeedVector, computed
// locally (shared by the Gloo and NCCL tests).
inline std::vector<float> ExpectedAllReduce(ReduceOp op, size_t count, int size) {
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i) {
    float sum = 0, max = SeedValue(0, i, size);
    for (int r = 0; r < size; ++r) {
      sum += SeedValue(r, i, size);
      max = std::max(max, SeedValue(r, i, size));
    }
    want[i] = op == ReduceOp::kSum    ? sum
              : op == ReduceOp::kMean ? sum * (1.0f / static_cast<float>(size))
                                      : max;
  }
  return want;
}

inline std::vector<float> ExpectedAllGather(size_t count, int size) {
  std::vector<float> want;
  for (int r = 0; r < size; ++r) {
    std::vector<float> part = SeedVector(r, count, size);
    want.insert(want.end(), part.begin(), part.end());
  }
  return want;
}

// Rank `rank`'s slice of the sum of every rank's SeedVector(r, count * size).
inline std::vector<float> ExpectedReduceScatter(int rank, size_t count, int size) {
  std::vector<float> want(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    for (int r = 0; r < size; ++r) want[i] += SeedValue(r, rank * count + i, size);
  }
  return want;
}

// Throws naming the first index where got != want.
inline void ExpectExactly(const std::vector<float>& got, const std::vector<float>& want,
                          const std::string& what) {
  if (got.size() != want.size()) {
    throw std::runtime_error(what + ": size " + std::to_string(got.size()) + " != " +
                             std::to_string(want.size()));
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      throw std::runtime_error(what + ": index " + std::to_string(i) + " got " +
                               std::to_string(got[i]) + " want " + std::to_string(want[i]));
    }
  }
}

inline void ThrowIfError(const Status& st, const std::string& what) {
  if (!st.ok()) throw std::runtime_error(what + ": " + st.ToString());
}

// The grid of ranks x floats per rank that every Collective's CheckEveryOp
// test runs over, and its test names ("ranks2_count1000").
inline auto RanksAndCounts() {
  return ::testing::Combine(::testing::Values(1, 2, 3, 4),
                            ::testing::Values(size_t{0}, size_t{1}, size_t{1000}, size_t{100003}));
}
inline std::string RanksAndCountsName(
    const ::testing::TestParamInfo<std::tuple<int, size_t>>& info) {
  return "ranks" + std::to_string(std::get<0>(info.param)) + "_count" +
         std::to_string(std::get<1>(info.param));
}

// Every operation of `group` (rank `rank` of `size`) on `count` floats per
// rank, checked exactly against the expectation computed locally from every
// rank's seed data. Throws naming the operation and rank. Shared by the
// tests of every Collective, so each meets the same contract.
inline void CheckEveryOp(Collective& group, int rank, int size, size_t count) {
  const std::string where = " (rank " + std::to_string(rank) + ")";
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
    std::vector<float> data = SeedVector(rank, count, size);
    ThrowIfError(group.AllReduce(data.data(), count, op), "allreduce" + where);
    ExpectExactly(data, ExpectedAllReduce(op, count, size),
                  "allreduce op " + std::to_string(static_cast<int>(op)) + where);
  }
  for (int root : {0, size - 1}) {
    std::vector<float> data = SeedVector(rank, count, size);
    ThrowIfError(group.Broadcast(data.data(), count, root), "broadcast" + where);
    ExpectExactly(data, SeedVector(root, count, size), "broadcast root " + std::to_string(root) + where);
  }
  {
    std::vector<float> in = SeedVector(rank, count, size);
    std::vector<float> out(count * size, -1.0f);
    ThrowIfError(group.AllGather(in.data(), out.data(), count), "allgather" + where);
    ExpectExactly(out, ExpectedAllGather(count, size), "allgather" + where);
  }
  {
    // In place: the input is this rank's slot of the output.
    std::vector<float> out(count * size, -1.0f);
    const std::vector<float> mine = SeedVector(rank, count, size);
    std::copy(mine.begin(), mine.end(), out.begin() + rank * count);
    ThrowIfError(group.AllGather(out.data() + rank * count, out.data(), count),
                 "allgather in place" + where);
    ExpectExactly(out, ExpectedAllGather(count, size), "allgather in place" + where);
  }
  {
    std::vector<float> in = SeedVector(rank, count * size, size);
    std::vector<float> out(count, -1.0f);
    ThrowIfError(group.ReduceScatter(in.data(), out.data(), count), "reducescatter" + where);
    ExpectExactly(out, ExpectedReduceScatter(rank, count, size), "reducescatter" + where);
  }
  ThrowIfError(group.Barrier(), "barrier" + where);
}

// Throws naming the first of `parts` missing from `st`'s message.
inline void ExpectMessageHas(const Status& st, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    if (st.message().find(part) == std::string::npos) {
      throw std::runtime_error("'" + part + "' not in: " + st.message());
    }
  }
}

// Ranks 0 and 1 of a group of 3 call `create(rank)`; rank 2 never does. Each
// must get Timeout within 4x `timeout`, its message holding `parts` and
// "rank <r> of 3".
inline void CheckRendezvousTimesOut(const std::function<Status(int rank)>& create,
                                    std::chrono::milliseconds timeout,
                                    const std::vector<std::string>& parts) {
  RunRanks(2, [&](int rank) {
    const auto start = std::chrono::steady_clock::now();
    const Status st = create(rank);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    if (!st.IsTimeout()) throw std::runtime_error("rank " + std::to_string(rank) + " got " + st.ToString());
    std::vector<std::string> want = parts;
    want.push_back("rank " + std::to_string(rank) + " of 3");
    ExpectMessageHas(st, want);
    if (took > 4 * timeout) throw std::runtime_error("took " + std::to_string(took.count()) + " ms");
  });
}

// Both ranks of a group of 2 join (`join(rank)`, bounded by `timeout`);
// rank 1 never calls the all-reduce rank 0 makes. Rank 0 must get Timeout
// after at least `at_least` and at most 4x `timeout`, its message holding
// `parts`, and FailedPrecondition from any later call.
inline void CheckOpTimesOutWhenAPeerNeverCallsIt(
    const std::function<std::unique_ptr<Collective>(int rank)>& join,
    std::chrono::milliseconds timeout, std::chrono::milliseconds at_least,
    const std::vector<std::string>& parts) {
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  RunRanks(2, [&](int rank) {
    std::unique_ptr<Collective> group = join(rank);
    if (rank == 1) {
      // Stays in the group but never joins the all-reduce.
      if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
        throw std::runtime_error("rank 0 never finished");
      }
      return;
    }
    std::vector<float> data(10, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    const Status st = group->AllReduce(data.data(), data.size(), ReduceOp::kSum);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    const Status again = group->Barrier();
    rank0_done.set_value();
    if (!st.IsTimeout()) throw std::runtime_error("allreduce gave " + st.ToString());
    ExpectMessageHas(st, parts);
    if (took < at_least || took > 4 * timeout) {
      throw std::runtime_error("took " + std::to_string(took.count()) + " ms");
    }
    if (again.code() != StatusCode::kFailedPrecondition) {
      throw std::runtime_error("call after failure gave " + again.ToString());
    }
  });
}

// Creates rank `rank` of Gloo group "test" through its own KV client, as a
// separate process would. Throws when creation fails.
inline std::unique_ptr<GlooCollective> JoinGloo(const LocalKvServer& kv, const std::string& job,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout) {
  auto client = kv.Client(job);
  GlooCollectiveOptions options;
  options.group = "test";
  options.rank = rank;
  options.size = size;
  options.timeout = timeout;
  auto group = GlooCollective::Create(*client, options);
  ThrowIfError(group.status(), "gloo group of rank " + std::to_string(rank));
  return std::move(group).value();
}

// body(rank, group) on `size` threads, rank r's group made by join(r). A
// rank starts its body only once every rank has its group: a body that ends
// at once would otherwise close its rank's connections while another rank
// is still completing the rendezvous with it, and Gloo reports that as the
// connection closed by peer, as for a peer that died (3% of the runs of a
// 4-rank test whose bodies return at once, under load). A body that returns
// early still leaves the group then, as tests of a departed peer want.
template <typename Join>
void RunJoinedRanks(int size, const Join& join, const std::function<void(int, Collective&)>& body) {
  std::latch joined(size);
  RunRanks(size, [&](int rank) {
    std::unique_ptr<Collective> group;
    try {
      group = join(rank);
    } catch (...) {
      joined.count_down();  // the others go on (and fail on their own)
      throw;
    }
    joined.arrive_and_wait();
    body(rank, *group);
  });
}

// body(rank, group) on `size` threads, each rank with its own GlooCollective
// over one in-process KV server. Bodies fail by throwing.
inline void RunGlooRanks(int size, std::chrono::milliseconds timeout,
                         const std::function<void(int, Collective&)>& body) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  RunJoinedRanks(size, [&](int rank) { return JoinGloo(kv, job, rank, size, timeout); }, body);
}

// Creates a rank of a shared-memory group through its own KV client, as a
// separate process would. Throws when creation fails.
inline std::unique_ptr<ShmCollective> JoinShm(const LocalKvServer& kv, const std::string& job,
                                              const ShmCollectiveOptions& options) {
  auto client = kv.Client(job);
  auto group = ShmCollective::Create(*client, options);
  ThrowIfError(group.status(), "shm group of rank " + std::to_string(options.rank));
  return std::move(group).value();
}

// The options of rank `rank` of a shared-memory group "test" of `size`.
inline ShmCollectiveOptions ShmOptions(int rank, int size, std::chrono::milliseconds timeout) {
  ShmCollectiveOptions options;
  options.group = "test";
  options.rank = rank;
  options.size = size;
  options.timeout = timeout;
  return options;
}

// As RunGlooRanks, over `kind`: "gloo" or "shm".
inline void RunRanksOver(const std::string& kind, int size, std::chrono::milliseconds timeout,
                         const std::function<void(int, Collective&)>& body) {
  if (kind == "gloo") return RunGlooRanks(size, timeout, body);
  if (kind != "shm") throw std::invalid_argument("unknown collective " + kind);
  LocalKvServer kv;
  const std::string job = UniqueJob();
  RunJoinedRanks(
      size, [&](int rank) { return JoinShm(kv, job, ShmOptions(rank, size, timeout)); }, body);
}

}  // namespace fleet::testing
