// TensorBoard curves of GPT pretraining (collective/train_loop.h's
// scalars, gpt_pretrain.h's tensorboard_dir) and of mnist_mlp (the same
// loop's default lines): the event files, decoded as TensorBoard reads them
// (tests/read_tb_events.py, python3-protobuf), hold the values the log lines
// print, at their steps. Skips, saying why, without /usr/bin/python3 or
// python3-protobuf.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "examples/mnist_mlp/mnist_mlp.h"
#include "tests/collective/gpt_run_util.h"
#include "tests/collective/mnist_test_data.h"
#include "tests/tensorboard_events.h"
#include "trainer/backend.h"
#include "data/tensorboard/event_writer.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::trainer::collective {
namespace {

using namespace testing_gpt;  // NOLINT: the helpers are this test's vocabulary

// The event files in `tb` decoded as *curves[tag][step] = value.
void ReadCurves(const fs::path& tb, std::map<std::string, std::map<int64_t, double>>* curves) {
  std::string error;
  const std::vector<fleet::testing::TbScalar> scalars =
      fleet::testing::ReadTbScalars(FLEET_PROTOC, FLEET_TEST_SOURCE_DIR, tb, &error);
  ASSERT_TRUE(error.empty()) << error;
  for (const auto& s : scalars) (*curves)[s.tag][s.step] = s.value;
}

TEST(TensorBoardCurvesTest, GptEventFilesHoldTheLoggedValues) {
  const std::string missing = fleet::testing::TbDecoderMissing();
  if (!missing.empty()) GTEST_SKIP() << "skipped: " << missing;
  const fs::path dir = FreshDir("tb");
  const GptJobConfig config = TinyJob(1, dir / "out");
  GptPretrainOptions options;
  options.tensorboard_dir = (dir / "tb").string();
  std::ostringstream log;
  Result<TrainReport> report = RunGptPretrain(config, nullptr, options, &log);
  ASSERT_TRUE(report.ok()) << report.status().ToString();

  std::map<std::string, std::map<int64_t, double>> curves;
  ASSERT_NO_FATAL_FAILURE(ReadCurves(dir / "tb", &curves));

  // [train] every 5 steps (batch is the step's index in its epoch; the
  // tiny job's epoch is longer than 20 steps, so step = batch + 1).
  const std::regex train(
      R"(\[train\] epoch: \d+, batch: (\d+), loss: ([0-9.]+),.* ips_total: (\d+) tokens/s,.* learning rate: ([0-9.e+-]+),)");
  const std::regex eval(R"(\[eval\] epoch: \d+, step: (\d+), loss: ([0-9.]+), ppl: ([0-9.]+),)");
  int train_lines = 0, eval_lines = 0;
  std::istringstream lines(log.str());
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, train)) {
      const int64_t step = std::stoll(m[1]) + 1;
      SCOPED_TRACE(line);
      ASSERT_EQ(curves["train/loss"].count(step), 1u);
      EXPECT_NEAR(curves["train/loss"][step], std::stod(m[2]), 1e-6 * std::stod(m[2]));
      EXPECT_NEAR(curves["train/learning_rate"][step], std::stod(m[4]), 1e-5 * std::stod(m[4]));
      // Rounded to whole tokens in the line.
      EXPECT_NEAR(curves["train/tokens_per_sec"][step], std::stod(m[3]),
                  0.5 + 1e-3 * std::stod(m[3]));
      EXPECT_GT(curves["train/samples_per_sec"][step], 0);
      EXPECT_GT(curves["train/grad_norm"][step], 0);  // clipping is on (clip_norm 1.0)
      ++train_lines;
    } else if (std::regex_search(line, m, eval)) {
      const int64_t step = std::stoll(m[1]);
      SCOPED_TRACE(line);
      ASSERT_EQ(curves["eval/eval_loss"].count(step), 1u);
      EXPECT_NEAR(curves["eval/eval_loss"][step], std::stod(m[2]), 1e-6);
      EXPECT_NEAR(curves["eval/ppl"][step], std::stod(m[3]), 1e-4 * std::stod(m[3]));
      ++eval_lines;
    }
  }
  EXPECT_EQ(train_lines, 4) << log.str();
  EXPECT_EQ(eval_lines, 2) << log.str();
  EXPECT_EQ(curves["train/loss"].size(), 4u);
  EXPECT_EQ(curves.count("train/loss_scale"), 0u);  // fp32: the scale is 1
}

TEST(TensorBoardCurvesTest, MnistMlpEventFilesHoldTheLoggedValues) {
  const std::string missing = fleet::testing::TbDecoderMissing();
  if (!missing.empty()) GTEST_SKIP() << "skipped: " << missing;
  const fs::path dir = FreshDir("tb_mnist");
  Result<std::unique_ptr<tensorboard::EventWriter>> events =
      tensorboard::EventWriter::Create((dir / "tb").string());
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  examples::MnistOptions options;
  options.batch_size = 32;
  options.max_steps = 20;
  options.epochs = 100;
  options.log_every_steps = 5;
  options.evaluate = false;
  options.eval_every_steps = 10;
  options.scalars = events->get();
  const data::MnistData data = fleet::testing::SyntheticMnist(32 * 40, 200);
  CpuBackend backend;
  std::ostringstream log;
  Result<examples::MnistReport> report =
      examples::TrainMnist(options, data, nullptr, &backend, &log);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  events->reset();  // closes the file

  std::map<std::string, std::map<int64_t, double>> curves;
  ASSERT_NO_FATAL_FAILURE(ReadCurves(dir / "tb", &curves));

  // The loop's default lines: progress every 5 steps, and the evaluation
  // (every 10 steps) after the progress line of its step.
  const std::regex train(R"(epoch: \d+, step: (\d+), train_loss: ([0-9.]+),)");
  const std::regex eval(R"(epoch: \d+, test_accuracy: ([0-9.]+))");
  int train_lines = 0, eval_lines = 0;
  int64_t last_step = 0;
  std::istringstream lines(log.str());
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    SCOPED_TRACE(line);
    if (std::regex_search(line, m, train)) {
      last_step = std::stoll(m[1]);
      ASSERT_EQ(curves["train/loss"].count(last_step), 1u);
      // Printed with 6 decimals.
      EXPECT_NEAR(curves["train/loss"][last_step], std::stod(m[2]), 5e-7 + 1e-6 * std::stod(m[2]));
      EXPECT_GT(curves["train/samples_per_sec"][last_step], 0);
      EXPECT_EQ(curves["train/learning_rate"].count(last_step), 1u);
      ++train_lines;
    } else if (std::regex_search(line, m, eval)) {
      ASSERT_EQ(curves["eval/test_accuracy"].count(last_step), 1u);
      EXPECT_NEAR(curves["eval/test_accuracy"][last_step], std::stod(m[1]), 5e-5);  // 4 decimals
      ++eval_lines;
    }
  }
  EXPECT_EQ(train_lines, 4) << log.str();
  EXPECT_EQ(eval_lines, 2) << log.str();
  EXPECT_EQ(curves["train/loss"].size(), 4u);
  EXPECT_EQ(curves["eval/test_accuracy"].size(), 2u);
}

}  // namespace
}  // namespace fleet::trainer::collective
