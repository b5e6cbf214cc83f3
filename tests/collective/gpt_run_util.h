// Helpers of the GPT pretraining tests (gpt_pretrain_test, parallel_test):
// a tiny FleetX-style job, training it on N ranks as threads (Gloo groups
// over one in-process KV store, hybrid subgroups included), and comparisons
// of losses and parameters with stated tolerances.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/comm/collective_test_util.h"
#include "tests/data/test_util.h"
#include "collective/gpt_pretrain.h"
#include "collective/config/gpt_config.h"

namespace fleet::trainer::collective::testing_gpt {

using config::GptJobConfig;
using std::chrono::milliseconds;
namespace fs = std::filesystem;
namespace testing = ::fleet::testing;

// This process's folder for the tests' checkpoints, removed when the
// process exits (a run of collective_parallel_test alone writes ~75 MB of
// checkpoints, and every run used to leave them in the temporary folder).
inline const fs::path& ProcessTestDir() {
  // Never destroyed: the exit handler runs after static destructors.
  static const fs::path* const root = [] {
    auto* dir = new fs::path(fs::path(::testing::TempDir()) /
                             ("gpt_pretrain_test." + std::to_string(::getpid())));
    fs::remove_all(*dir);
    fs::create_directories(*dir);
    std::atexit([] {
      std::error_code ignored;  // nothing to report to at exit
      fs::remove_all(ProcessTestDir(), ignored);
    });
    return dir;
  }();
  return *root;
}

// A fresh directory for one test's checkpoints.
inline fs::path FreshDir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = ProcessTestDir() / (std::string(info->name()) + "." + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A 2-layer, 64-wide GPT on the fortunes (byte vocabulary, 32 tokens),
// global batch 8 in micro-batches of 2: 20 steps take a second or two.
inline GptJobConfig TinyJob(int world, const fs::path& output_dir,
                            std::vector<std::string> extra = {}) {
  const std::string cache = (fs::path(::testing::TempDir()) / "gpt_pretrain_test_tokens").string();
  std::vector<std::string> overrides = {
      "Model.num_layers=2",
      "Model.hidden_size=64",
      "Model.num_attention_heads=2",
      "Model.ffn_hidden_size=256",
      "Model.max_position_embeddings=32",
      "Data.Train.dataset.max_seq_len=32",
      "Data.Eval.dataset.max_seq_len=32",
      "Data.Train.dataset.cache_dir=" + cache,
      "Data.Eval.dataset.cache_dir=" + cache,
      "Global.global_batch_size=8",
      "Global.micro_batch_size=2",
      "Engine.max_steps=20",
      "Engine.logging_freq=5",
      "Engine.eval_freq=10",
      "Engine.eval_iters=2",
      "Engine.save_load.output_dir=" + output_dir.string(),
      "Engine.save_load.save_steps=10",
      "Optimizer.lr.decay_steps=20",
      "Optimizer.lr.max_lr=3.0e-3",
  };
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  auto config = config::LoadGptJobConfig(
      data::testing::SourcePath("configs/gpt/pretrain_gpt_tiny.yaml"), overrides, world);
  if (!config.ok()) throw std::runtime_error(config.status().ToString());
  return *std::move(config);
}

struct RankRun {
  TrainReport report;
  std::string log;
};

// How Train runs its ranks.
struct TrainOptions {
  // Every group's kind: "gloo" or "shm" (shared memory).
  std::string collective = "gloo";
  // GptPretrainOptions::measure_memory.
  bool measure_memory = false;
};

// Trains `config` on `world` ranks (threads; one process without a group
// for 1) and returns each rank's report and log. The world and, for hybrid
// degrees, the sharding and data-parallel groups are groups of
// options.collective over one in-process KV store.
inline std::vector<RankRun> Train(const GptJobConfig& config, int world,
                                  const TrainOptions& train = {}) {
  std::vector<RankRun> runs(world);
  GptPretrainOptions base;
  base.measure_memory = train.measure_memory;
  auto body = [&](int rank, Collective* group, const GptPretrainOptions& options) {
    std::ostringstream log;
    auto report = RunGptPretrain(config, group, options, &log);
    testing::ThrowIfError(report.status(), "rank " + std::to_string(rank));
    runs[rank] = RankRun{*std::move(report), log.str()};
  };
  if (world == 1) {
    body(0, nullptr, base);
    return runs;
  }
  testing::LocalKvServer kv;
  const std::string job = testing::UniqueJob();
  const milliseconds timeout(30000);
  // Group "test<suffix>", as a separate process would join it.
  auto join = [&](const std::string& suffix, int rank,
                  int size) -> Result<std::unique_ptr<Collective>> {
    auto client = kv.Client(job);
    if (train.collective == "shm") {
      ShmCollectiveOptions o = testing::ShmOptions(rank, size, timeout);
      o.group += suffix;
      FLEET_ASSIGN_OR_RETURN(std::unique_ptr<ShmCollective> group,
                             ShmCollective::Create(*client, o));
      return std::unique_ptr<Collective>(std::move(group));
    }
    GlooCollectiveOptions o;
    o.group = "test" + suffix;
    o.rank = rank;
    o.size = size;
    o.timeout = timeout;
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> group,
                           GlooCollective::Create(*client, o));
    return std::unique_ptr<Collective>(std::move(group));
  };
  testing::RunRanks(world, [&](int rank) {
    Result<std::unique_ptr<Collective>> group = join("", rank, world);
    testing::ThrowIfError(group.status(), "group of rank " + std::to_string(rank));
    GptPretrainOptions options = base;
    options.join_group = [&](const std::string& name, int sub_rank, int size) {
      return join("." + name, sub_rank, size);
    };
    body(rank, group->get(), options);
  });
  return runs;
}

// The loss of each step over all ranks: the mean of the ranks' losses (each
// the mean over its samples; every rank has as many).
inline std::vector<double> MeanLosses(const std::vector<RankRun>& runs) {
  std::vector<double> mean(runs[0].report.step_losses.size(), 0.0);
  for (const RankRun& run : runs) {
    EXPECT_EQ(run.report.step_losses.size(), mean.size());
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += run.report.step_losses[i] / runs.size();
  }
  return mean;
}

inline void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, double rel,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << what << ", step " << i + 1;
  }
}

// Parameters within abs + 1e-3 |want| (Adam turns the last-bit differences
// of near-zero gradients into steps of up to lr, so nearly untrained
// parameters get an absolute bound, 1e-5 unless said).
inline void ExpectParamsClose(const std::vector<float>& got, const std::vector<float>& want,
                              const std::string& what, double abs = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess =
        std::abs(double{got[i]} - want[i]) - (abs + 1e-3 * std::abs(double{want[i]}));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_LE(worst_excess, 0.0) << what << ": worst parameter " << worst << " " << got[worst]
                               << " vs " << want[worst];
}

inline std::vector<double> AsDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace fleet::trainer::collective::testing_gpt
