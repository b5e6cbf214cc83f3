// pslite_driver: ps_bench's workload on ps-lite itself (dmlc/ps-lite), over
// its public API: KVWorker::ZPull / ZPush / Wait and a KVServer request
// handle. Built only against a ps-lite built outside this project
// (-DFLEET_PSLITE_DIR, bench/README.md); ps_bench --pslite_bin runs it.
//
// One process is one ps-lite node; its role comes from ps-lite's own
// environment (DMLC_ROLE, DMLC_PS_ROOT_URI / _PORT, DMLC_NUM_SERVER /
// _WORKER), which ps_bench sets for a scheduler, the servers and one process
// per worker.
//
//  * server: an unordered_map from key to row offset over a float arena
//    (value, then adagrad's squared-gradient sums), rows made as zeros on
//    first touch; a push applies the rule in place (bench/ps_workload.h, the
//    same arithmetic as FleetPS's rules); a pull answers the keys and their
//    values in a fresh array (not zero-filled). ps-lite runs the handle on
//    its customer thread.
//  * worker: says "ready" on stdout once ps::Start returned, then reads
//    commands on stdin, one per line, and answers each with one line:
//      prepare <window> <keys> <universe> <start>  -> ok   (key sets, buffers)
//      verify <n> <first_index>  -> ok | error <why>   (two pushes, pulled back)
//      populate <universe>       -> ok   (every row, zero gradients)
//      run <pull|push> <ops>     -> done <wall seconds> <latency us>...
//      quit                      -> (ps::Finalize, exit 0)
//    Keys are the sorted sets of KeySets (ps-lite needs sorted keys; ps_bench
//    gives FleetPS the same sets), sent without copying (SArrays over the
//    sets), pulled into caller arrays, with `window` requests in flight.
//  * scheduler: ps::Start and ps::Finalize.
#include <gflags/gflags.h>
#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/ps_workload.h"
#include "ps/ps.h"

DEFINE_int64(dim, 1, "values per key");
DEFINE_string(rule, "sgd", "sgd | adagrad");
DEFINE_double(learning_rate, 0.01, "the rule's learning rate");
DEFINE_double(initial_g2sum, 0.0, "adagrad: initial squared-gradient sum");
DEFINE_double(epsilon, 1e-8, "adagrad: epsilon");

namespace fleet::bench {
namespace {

using Clock = std::chrono::steady_clock;

TableRule RuleFromFlags() {
  TableRule rule;
  rule.kind = FLAGS_rule == "adagrad" ? TableRule::kAdagrad : TableRule::kSgd;
  rule.learning_rate = static_cast<float>(FLAGS_learning_rate);
  rule.initial_g2sum = static_cast<float>(FLAGS_initial_g2sum);
  rule.epsilon = static_cast<float>(FLAGS_epsilon);
  return rule;
}

// ---------------------------------------------------------------- server

class Table {
 public:
  Table(size_t dim, TableRule rule) : dim_(dim), rule_(rule), row_floats_(rule.row_floats(dim)) {}

  void Handle(const ps::KVMeta& meta, const ps::KVPairs<float>& request,
              ps::KVServer<float>* server) {
    const size_t n = request.keys.size();
    if (meta.push) {
      if (request.vals.size() != n * dim_) {
        LOG(FATAL) << "push of " << n << " keys with " << request.vals.size() << " values, dim "
                   << dim_;
      }
      for (size_t i = 0; i < n; ++i)
        rule_.Apply(Row(request.keys[i]), &request.vals[i * dim_], dim_);
      server->Response(meta);
      return;
    }
    ps::KVPairs<float> reply;
    reply.keys = request.keys;
    reply.vals = ps::SArray<float>(new float[n * dim_], n* dim_, /*deletable=*/true);
    for (size_t i = 0; i < n; ++i)
      std::memcpy(&reply.vals[i * dim_], Row(request.keys[i]), dim_ * sizeof(float));
    server->Response(meta, reply);
  }

 private:
  float* Row(ps::Key key) {
    auto [it, inserted] = index_.try_emplace(key, arena_.size());
    if (inserted) {
      arena_.resize(arena_.size() + row_floats_);
      rule_.InitRow(arena_.data() + it->second, dim_);
    }
    return arena_.data() + it->second;
  }

  const size_t dim_;
  const TableRule rule_;
  const size_t row_floats_;
  std::unordered_map<ps::Key, size_t> index_;
  std::vector<float> arena_;
};

// ---------------------------------------------------------------- worker

class Worker {
 public:
  Worker(size_t dim, TableRule rule) : dim_(dim), rule_(rule), kv_(0, 0) {}

  // One command line; false on quit.
  bool Command(const std::string& line) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "quit") return false;
    if (verb == "prepare") {
      uint64_t universe = 0, start = 0;
      in >> window_ >> keys_ >> universe >> start;
      sets_ = std::make_unique<KeySets>(universe, start, keys_);
      out_.assign(window_, std::vector<float>(keys_ * dim_));
      grads_ = TimedGradients(keys_ * dim_);
      Reply("ok");
    } else if (verb == "verify") {
      size_t n = 0;
      uint64_t first = 0;
      in >> n >> first;
      Reply(Verify(n, first));
    } else if (verb == "populate") {
      uint64_t universe = 0;
      in >> universe;
      Populate(universe);
      Reply("ok");
    } else if (verb == "run") {
      std::string op;
      int64_t ops = 0;
      in >> op >> ops;
      Reply(Run(op == "push", ops));
    } else {
      Reply("error unknown command '" + verb + "'");
    }
    return true;
  }

 private:
  static void Reply(const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  // Keys of the slot's request, as an SArray over memory that stays put.
  static ps::SArray<ps::Key> View(std::span<const uint64_t> keys) {
    return ps::SArray<ps::Key>(const_cast<ps::Key*>(keys.data()), keys.size());
  }

  void Pull(std::span<const uint64_t> keys, std::vector<float>& out) {
    ps::SArray<float> vals(out.data(), out.size());
    kv_.Wait(kv_.ZPull(View(keys), &vals));
  }
  void Push(std::span<const uint64_t> keys, std::vector<float>& grads) {
    kv_.Wait(kv_.ZPush(View(keys), ps::SArray<float>(grads.data(), grads.size())));
  }

  // Pushes VerifyGradient's two steps to n fresh sorted keys, pulls them,
  // and compares with the rule's arithmetic.
  std::string Verify(size_t n, uint64_t first) {
    std::vector<uint64_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = KeyOf(first + i);
    std::sort(keys.begin(), keys.end());
    std::vector<float> got(n * dim_, -1.0f), g(n * dim_);
    Pull(keys, got);
    for (float v : got) {
      if (v != 0.0f) return "error a fresh row pulled " + std::to_string(v);
    }
    std::vector<float> want(n * rule_.row_floats(dim_));
    for (size_t k = 0; k < n; ++k) rule_.InitRow(&want[k * rule_.row_floats(dim_)], dim_);
    for (int step = 0; step < 2; ++step) {
      for (size_t i = 0; i < n * dim_; ++i) g[i] = VerifyGradient(i, step);
      for (size_t k = 0; k < n; ++k)
        rule_.Apply(&want[k * rule_.row_floats(dim_)], &g[k * dim_], dim_);
      Push(keys, g);
    }
    Pull(keys, got);
    for (size_t i = 0; i < n * dim_; ++i) {
      const float w = want[i / dim_ * rule_.row_floats(dim_) + i % dim_];
      if (std::fabs(got[i] - w) > 1e-6f * std::max(1.0f, std::fabs(w)))
        return "error element " + std::to_string(i) + " pulled " + std::to_string(got[i]) +
               ", expected " + std::to_string(w);
    }
    return "ok";
  }

  void Populate(uint64_t universe) {
    const size_t batch = std::clamp<size_t>((size_t{1} << 22) / dim_, 1, 131072);
    std::vector<uint64_t> keys;
    std::vector<float> zeros(batch * dim_, 0.0f);
    for (uint64_t first = 0; first < universe; first += batch) {
      const size_t n = std::min<uint64_t>(batch, universe - first);
      keys.resize(n);
      for (size_t i = 0; i < n; ++i) keys[i] = KeyOf(first + i);
      std::sort(keys.begin(), keys.end());
      kv_.Wait(kv_.ZPush(View(keys), ps::SArray<float>(zeros.data(), n * dim_)));
    }
  }

  // ZPull / ZPush with `window_` in flight, then Wait, as RunWindow drives.
  class Loop final : public Driver {
   public:
    Loop(Worker& w, bool push)
        : w_(w),
          push_(push),
          keys_(w.window_),
          vals_(w.window_),
          timestamps_(w.window_),
          grads_(w.grads_.data(), w.grads_.size()) {}
    void Issue(int slot) override {
      keys_[slot] = View(w_.sets_->Next());
      if (push_) {
        timestamps_[slot] = w_.kv_.ZPush(keys_[slot], grads_);
      } else {
        vals_[slot] = ps::SArray<float>(w_.out_[slot].data(), w_.out_[slot].size());
        timestamps_[slot] = w_.kv_.ZPull(keys_[slot], &vals_[slot]);
      }
    }
    void Wait(int slot) override { w_.kv_.Wait(timestamps_[slot]); }

   private:
    Worker& w_;
    const bool push_;
    std::vector<ps::SArray<ps::Key>> keys_;
    std::vector<ps::SArray<float>> vals_;  // ZPull writes through these until Wait
    std::vector<int> timestamps_;
    ps::SArray<float> grads_;
  };

  std::string Run(bool push, int64_t ops) {
    if (!sets_) return "error run before prepare";
    Loop loop(*this, push);
    std::vector<double> lat;
    lat.reserve(ops);
    const auto t0 = Clock::now();
    RunWindow(loop, window_, ops, &lat);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    std::string line = "done " + std::to_string(wall);
    char buf[32];
    for (double us : lat) {
      std::snprintf(buf, sizeof(buf), " %.1f", us);
      line += buf;
    }
    return line;
  }

  const size_t dim_;
  const TableRule rule_;
  ps::KVWorker<float> kv_;
  int window_ = 1;
  size_t keys_ = 0;
  std::unique_ptr<KeySets> sets_;
  std::vector<std::vector<float>> out_;  // per slot: pulled values
  std::vector<float> grads_;
};

int Main() {
  if (FLAGS_dim < 1 || (FLAGS_rule != "sgd" && FLAGS_rule != "adagrad")) {
    std::fprintf(stderr, "pslite_driver: --dim must be >= 1 and --rule sgd or adagrad\n");
    return 2;
  }
  const size_t dim = static_cast<size_t>(FLAGS_dim);
  ps::Start(0);
  if (ps::IsServer()) {
    auto table = std::make_shared<Table>(dim, RuleFromFlags());
    auto server = std::make_shared<ps::KVServer<float>>(0);
    server->set_request_handle(
        [table](const ps::KVMeta& meta, const ps::KVPairs<float>& request, ps::KVServer<float>* s) {
          table->Handle(meta, request, s);
        });
    ps::Finalize(0, true);  // returns when every worker finalized
    return 0;
  }
  if (ps::IsWorker()) {
    Worker worker(dim, RuleFromFlags());
    std::printf("ready\n");
    std::fflush(stdout);
    for (std::string line; std::getline(std::cin, line);) {
      if (!worker.Command(line)) break;
    }
  }
  ps::Finalize(0, true);
  return 0;
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) {
  // The heap setting of FleetPS's processes (ps/ps_process.cc, and ps_bench's
  // own): freed memory stays mapped, so neither side's allocator is favoured.
  mallopt(M_TOP_PAD, 64 << 20);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return fleet::bench::Main();
}
