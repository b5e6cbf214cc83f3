// parallel_bench: GPT pretraining on 2 CPU ranks (threads over one
// shared-memory group, or a Gloo group with --collective=gloo) under each
// sharding combination, tensor and pipeline parallelism, beside plain data
// parallel in the same run: step time and the bytes each rank hands to its
// collectives per step.
//
//   combinations: dp 2 (the reference), sharding 2 at stages 1, 2 and 3,
//                 stages 1 and 3 with the optimizer offloaded, mp 2 (Megatron
//                 tensor parallelism: both ranks run the whole global
//                 batch on half the model), pp 2 (pipeline parallelism:
//                 each rank runs half the blocks of every micro-batch of
//                 the whole global batch, 1F1B, collective/gpt_pipeline.h)
//   model:        configs/gpt/pretrain_gpt_tiny.yaml (4 layers, hidden 256,
//                 sequence 128, micro-batch 8), float32, 1 kernel thread a rank
//   bytes/step:   what each rank sends per step under ring algorithms (the
//                 plan's measure, gpt_plan.h): 2 (W-1)/W of an all-reduce's
//                 buffer, (W-1)/W of an all-gather's output or a
//                 reduce-scatter's input, (W-1)/W of a broadcast, counted
//                 from the calls the rank makes over the timed steps but the
//                 last (whose end saves a checkpoint)
//
// Before timing it verifies the run: every combination's losses equal the
// data-parallel ones within 1e-4 relative (the same global batch).
// Tensor parallelism moves activations, not gradients: per step
// 2 (W-1)/W x (4 L + 2) all-reduces of [B T, C] per micro-batch forward and
// backward, against data parallel's one all-reduce of the gradients.
// Pipeline parallelism moves one [B T, C] activation up and its gradient
// down per micro-batch (two broadcasts over the 2-rank link, each counted
// half on either rank), plus wte's gradient all-reduced between the stages.
//
//   parallel_bench [--config=configs/gpt/pretrain_gpt_tiny.yaml] [--steps=20] [--warmup=5]
//                  [--collective=shm|gloo] [--only=offload]
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "comm/gloo_collective.h"
#include "comm/kv_store.h"
#include "comm/shm_collective.h"
#include "collective/gpt_pretrain.h"
#include "collective/config/gpt_config.h"
#include "collective/config/gpt_data.h"

DEFINE_string(config, "configs/gpt/pretrain_gpt_tiny.yaml",
              "GPT config to train (run from the repo root).");
DEFINE_int32(steps, 20, "Steps per combination.");
DEFINE_int32(warmup, 5, "Steps not timed nor counted at the start of each combination.");
DEFINE_string(collective, "shm",
              "The ranks' group: shm (shared memory, reduced on the rank's own thread) or gloo "
              "(reduced on a communication thread, beside backward).");
DEFINE_string(only, "",
              "When set, only data parallel (the reference) and the combinations whose label "
              "contains this string.");

namespace fleet::bench {
namespace {

// A Collective that counts the bytes a ring sends for each call (see the top).
class CountingCollective final : public Collective {
 public:
  explicit CountingCollective(std::unique_ptr<Collective> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  bool runs_on_caller_cpu() const override { return inner_->runs_on_caller_cpu(); }
  Status AllReduce(float* data, size_t count, ReduceOp op) override {
    Count(2 * count);
    return inner_->AllReduce(data, count, op);
  }
  Status Broadcast(float* data, size_t count, int root) override {
    Count(count);
    return inner_->Broadcast(data, count, root);
  }
  Status AllGather(const float* in, float* out, size_t count) override {
    Count(count * size());
    return inner_->AllGather(in, out, count);
  }
  Status ReduceScatter(const float* in, float* out, size_t count) override {
    Count(count * size());
    return inner_->ReduceScatter(in, out, count);
  }
  Status Barrier() override { return inner_->Barrier(); }
  // Read by the rank's own thread (after_step), written by it or its
  // communication thread.
  size_t bytes() const { return bytes_.load(); }

 private:
  // (W - 1) / W of `floats` floats.
  void Count(size_t floats) { bytes_ += floats * sizeof(float) * (size() - 1) / size(); }

  std::unique_ptr<Collective> inner_;
  std::atomic<size_t> bytes_{0};
};

struct Combination {
  std::string label;
  std::vector<std::string> overrides;
};

struct RankResult {
  std::vector<double> micros;  // timed steps
  std::vector<float> losses;
  size_t bytes = 0;  // over the timed steps
};

void Check(const Status& st, const std::string& what) {
  if (!st.ok()) LOG(FATAL) << what << ": " << st.ToString();
}

// Rank `rank` of 2 of combination `index`'s group of kind Group.
template <typename Group, typename GroupOptions>
std::unique_ptr<Collective> Join(KvStoreClient& client, int index, int rank, const char* what) {
  GroupOptions o;
  o.group = absl::StrCat("combination", index);
  o.rank = rank;
  o.size = 2;
  auto group = Group::Create(client, o);
  Check(group.status(), what);
  return *std::move(group);
}

// Rank `rank` of 2 of combination `index`'s group (--collective).
std::unique_ptr<Collective> JoinGroup(KvStoreClient& client, int index, int rank) {
  if (FLAGS_collective == "gloo") {
    return Join<GlooCollective, GlooCollectiveOptions>(client, index, rank, "Gloo group");
  }
  return Join<ShmCollective, ShmCollectiveOptions>(client, index, rank, "shared-memory group");
}

std::vector<RankResult> RunCombination(KvStoreServer& kv, const Combination& c, int index) {
  // A fresh checkpoint directory: the run saves at its end, and must not
  // resume from an earlier run's save.
  const std::string out = absl::StrCat("/tmp/parallel_bench_out/combination", index);
  std::filesystem::remove_all(out);
  std::vector<std::string> overrides = {absl::StrCat("Engine.max_steps=", FLAGS_steps),
                                        "Engine.eval_freq=0",
                                        "Engine.logging_freq=1000",
                                        "Engine.save_load.save_steps=1000000",
                                        "Engine.save_load.output_dir=" + out,
                                        "Data.Train.dataset.cache_dir=/tmp/parallel_bench_tokens",
                                        "Data.Eval.dataset.cache_dir=/tmp/parallel_bench_tokens"};
  overrides.insert(overrides.end(), c.overrides.begin(), c.overrides.end());
  auto config = trainer::config::LoadGptJobConfig(FLAGS_config, overrides, 2);
  Check(config.status(), "config of " + c.label);
  // Tokenized once here: the ranks are threads of one process, which would
  // race writing the token cache (its temporary file is named by the pid).
  for (auto part : {data::DataPart::kTrain, data::DataPart::kEval}) {
    Check(data::OpenConfiguredDataset(*config, part).status(), "data of " + c.label);
  }
  std::vector<RankResult> results(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      KvStoreClient client(kv.endpoint(), "parallel_bench");
      CountingCollective group(JoinGroup(client, index, rank));
      trainer::collective::GptPretrainOptions options;
      size_t bytes_at_warmup = 0;
      options.after_step = [&](int64_t step) {
        if (step == FLAGS_warmup) bytes_at_warmup = group.bytes();
        if (step == FLAGS_steps - 1) results[rank].bytes = group.bytes() - bytes_at_warmup;
        return Status::OK();
      };
      auto report = trainer::collective::RunGptPretrain(*config, &group, options, nullptr);
      Check(report.status(), c.label + " rank " + std::to_string(rank));
      results[rank].micros.assign(report->step_micros.begin() + FLAGS_warmup,
                                  report->step_micros.end());
      results[rank].losses = report->step_losses;
    });
  }
  for (std::thread& t : ranks) t.join();
  return results;
}

int Main() {
  PrintEnvironment("parallel_bench");
  CHECK_GT(FLAGS_steps, FLAGS_warmup + 1) << "--steps must exceed --warmup + 1";
  if (FLAGS_collective != "shm" && FLAGS_collective != "gloo") {
    std::fprintf(stderr, "--collective must be shm or gloo, not %s\n", FLAGS_collective.c_str());
    return 1;
  }
  KvStoreServer kv(KvStoreServerOptions{});
  Check(kv.Start(), "kv store");
  std::vector<Combination> combinations = {
      {"dp 2 (reference)", {}},
      {"sharding 2, stage 1",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1"}},
      {"sharding 2, stage 2",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2"}},
      {"sharding 2, stage 3",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3"}},
      {"stage 1 + offload",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1",
        "Distributed.sharding.sharding_offload=True"}},
      {"stage 3 + offload",
       {"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3",
        "Distributed.sharding.sharding_offload=True"}},
      {"mp 2 (tensor parallel)", {"Distributed.mp_degree=2"}},
      {"pp 2 (pipeline)", {"Distributed.pp_degree=2"}},
  };
  if (!FLAGS_only.empty()) {
    std::vector<Combination> chosen = {combinations[0]};  // the reference
    for (size_t i = 1; i < combinations.size(); ++i) {
      if (combinations[i].label.find(FLAGS_only) != std::string::npos) {
        chosen.push_back(combinations[i]);
      }
    }
    combinations = std::move(chosen);
  }
  std::printf("ranks: 2 threads over %s, config %s\n", FLAGS_collective.c_str(),
              FLAGS_config.c_str());
  std::vector<std::vector<RankResult>> runs;
  for (size_t i = 0; i < combinations.size(); ++i) {
    runs.push_back(RunCombination(kv, combinations[i], static_cast<int>(i)));
  }
  // Verify: the same losses as data parallel (mean over the 2 ranks).
  for (size_t i = 1; i < runs.size(); ++i) {
    for (size_t s = 0; s < runs[0][0].losses.size(); ++s) {
      const double want = (runs[0][0].losses[s] + runs[0][1].losses[s]) / 2;
      const double got = (runs[i][0].losses[s] + runs[i][1].losses[s]) / 2;
      CHECK_LE(std::abs(got - want), 1e-4 * std::abs(want))
          << combinations[i].label << " step " << s + 1 << ": loss " << got << " vs dp " << want;
    }
  }
  std::printf("verified: every combination's losses equal data parallel's within 1e-4\n\n");
  std::printf("%-22s %10s %10s %14s %12s\n", "rank 0", "p50 ms", "vs dp", "MiB/step", "vs dp");
  const double dp_p50 = Summarize(runs[0][0].micros).p50;
  const double dp_bytes = static_cast<double>(runs[0][0].bytes);
  const double steps = FLAGS_steps - 1 - FLAGS_warmup;  // counted
  for (size_t i = 0; i < runs.size(); ++i) {
    const Summary s = Summarize(runs[i][0].micros);
    const double bytes = static_cast<double>(runs[i][0].bytes);
    std::printf("%-22s %10.1f %9.2fx %14.2f %11.2fx\n", combinations[i].label.c_str(),
                s.p50 / 1000.0, s.p50 / dp_p50, bytes / steps / (1024.0 * 1024.0),
                bytes / dp_bytes);
  }
  return 0;
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return fleet::bench::Main();
}
