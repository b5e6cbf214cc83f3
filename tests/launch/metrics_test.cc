// JobMetrics: what Prometheus scrapes from fleetrun (counters as counters,
// the servers' traffic, the training figures, names promtool accepts) and
// metrics.jsonl's lines, each with the job id.
#include "launch/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ps/ps.pb.h"
#include "tests/child_process.h"

namespace fleet::launch {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

ProgressValue Report(int64_t step, int64_t unix_ms) {
  return ProgressValue{.step = step,
                       .total_steps = 100,
                       .samples_per_s = 2000,
                       .unix_ms = unix_ms,
                       .figures = {{"loss", 0.45}, {"auc", 0.79}, {"tokens_per_sec", 1234}}};
}

pb::PsStatsReply ServerReport(uint64_t pulls) {
  pb::PsStatsReply stats;
  pb::PsCommandStats* c = stats.add_commands();
  c->set_command("pull_sparse");
  c->set_requests(pulls);
  c->set_bytes_in(pulls * 10);
  c->set_bytes_out(pulls * 100);
  c->set_handling_ns(pulls * 1000);
  pb::PsTableStats* t = stats.add_tables();
  t->set_table_id(0);
  t->set_rows(500);
  stats.set_resident_bytes(1 << 20);
  return stats;
}

class JobMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fleet_metrics_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(JobMetricsTest, CountersFiguresAndServersInPrometheusNames) {
  JobMetrics metrics("job-7", "");
  metrics.Started("worker", 0);
  metrics.Progress("worker", 0, Report(40, 1000));
  metrics.ServerStats(0, ServerReport(30));
  const std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("# TYPE fleet_process_steps_total counter"));
  EXPECT_THAT(text, HasSubstr(R"(fleet_process_steps_total{rank="0",role="worker"} 40)"));
  EXPECT_THAT(text, HasSubstr(R"(fleet_training_loss{rank="0",role="worker"} 0.45)"));
  EXPECT_THAT(text, HasSubstr(R"(fleet_training_auc{rank="0",role="worker"} 0.79)"));
  // Units spelled out, as promtool wants.
  EXPECT_THAT(text, HasSubstr("fleet_training_tokens_per_second{"));
  EXPECT_THAT(text, Not(HasSubstr("_per_sec{")));
  EXPECT_THAT(text, HasSubstr("# TYPE fleet_server_requests_total counter"));
  EXPECT_THAT(text, HasSubstr(R"(fleet_server_requests_total{command="pull_sparse",rank="0"} 30)"));
  EXPECT_THAT(text,
              HasSubstr(R"(fleet_server_sent_bytes_total{command="pull_sparse",rank="0"} 3000)"));
  EXPECT_THAT(text, HasSubstr(R"(fleet_server_table_rows{rank="0",table="0"} 500)"));

  // promtool (Debian's prometheus, scripts/setup.sh) lints the names.
  const fs::path file = dir_ / "metrics.txt";
  std::ofstream(file) << text;
  const testing::CommandResult lint =
      testing::RunCommand("promtool check metrics < " + file.string());
  EXPECT_EQ(lint.exit_code, 0) << lint.output << "\n" << text;
}

TEST_F(JobMetricsTest, CountersGoOnAcrossARestartOfTheProcess) {
  JobMetrics metrics("job-7", "");
  metrics.Progress("worker", 1, Report(40, 1000));
  metrics.ServerStats(0, ServerReport(30));
  // Restarted: its own counts start again from 0.
  metrics.Restarted("worker", 1);
  metrics.Progress("worker", 1, Report(5, 2000));
  metrics.ServerStats(0, ServerReport(30));
  metrics.ServerStats(0, ServerReport(10));
  const std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr(R"(fleet_process_steps_total{rank="1",role="worker"} 45)"));
  EXPECT_THAT(text, HasSubstr(R"(fleet_process_restarts_total{rank="1",role="worker"} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(fleet_server_requests_total{command="pull_sparse",rank="0"} 40)"));
}

TEST_F(JobMetricsTest, JsonLinesCarryTheJobIdAndTheFigures) {
  const fs::path jsonl = dir_ / "metrics.jsonl";
  {
    JobMetrics metrics("job-7", jsonl.string());
    metrics.Started("worker", 0);
    EXPECT_TRUE(metrics.Progress("worker", 0, Report(40, 1000)));
    EXPECT_FALSE(metrics.Progress("worker", 0, Report(40, 1000)));  // seen
    metrics.Exited("worker", 0, 0);
  }
  std::ifstream in(jsonl);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    EXPECT_THAT(line, HasSubstr(R"("job": "job-7")")) << line;
    if (line.find("\"step\"") != std::string::npos) {
      EXPECT_THAT(line, HasSubstr(R"("loss": 0.45)"));
      EXPECT_THAT(line, HasSubstr(R"("tokens_per_sec": 1234)"));
    }
  }
  EXPECT_EQ(lines, 3);
}

TEST_F(JobMetricsTest, ThroughputIsUnknownUntilAProcessReports) {
  JobMetrics metrics("job-7", "");
  EXPECT_FALSE(metrics.Throughput("worker").has_value());
  metrics.Progress("worker", 0, Report(40, 1000));
  metrics.Progress("worker", 1, Report(40, 1001));
  EXPECT_DOUBLE_EQ(metrics.Throughput("worker").value_or(-1), 4000);
}

}  // namespace
}  // namespace fleet::launch
