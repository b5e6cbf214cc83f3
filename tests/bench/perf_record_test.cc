// bench/perf_record.h: perf samples the machine only between Enable and
// Disable, so ps_bench --perf_dir profiles exactly a system's timed rounds.
#include "bench/perf_record.h"

#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/child_process.h"

namespace fleet::bench {
namespace {

using std::chrono::milliseconds;

// This thread's CPU time: the loops below run for CPU time, not wall time,
// so a loaded machine changes how long they take, not how many samples.
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9;
}

// Busy loops a profile tells apart by name: arithmetic, with the clock read
// once per million steps so that the samples land in the loop itself. Their
// bodies differ (and noipa) so that the compiler cannot fold one into the
// other, which would give both one name.
[[gnu::noipa]] uint64_t SpinWhileSampled(double cpu_seconds) {
  volatile uint64_t x = 0;
  for (const double end = ThreadCpuSeconds() + cpu_seconds; ThreadCpuSeconds() < end;) {
    for (int i = 0; i < 1000000; ++i) x = x + 1;
  }
  return x;
}
[[gnu::noipa]] uint64_t SpinWhileNotSampled(double cpu_seconds) {
  volatile uint64_t x = 1;
  for (const double end = ThreadCpuSeconds() + cpu_seconds; ThreadCpuSeconds() < end;) {
    for (int i = 0; i < 1000000; ++i) x = x * 3;
  }
  return x;
}

TEST(PerfRecordTest, SamplesOnlyWhileEnabled) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("fleet_perf_record_", getpid());
  std::filesystem::create_directories(dir);
  const std::string data = (dir / "perf.data").string();
  // Sampling every CPU needs root or kernel.perf_event_paranoid <= 0.
  const std::string paranoid = testing::ReadAll("/proc/sys/kernel/perf_event_paranoid");
  if (geteuid() != 0 && !paranoid.empty() && std::stoi(paranoid) > 0) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP()
        << "skipped: system-wide perf needs root or kernel.perf_event_paranoid <= 0 (it is "
        << std::stoi(paranoid) << ")";
  }
  auto perf = PerfRecord::Start(data, std::chrono::microseconds(100));
  if (!perf.ok() && perf.status().code() == StatusCode::kNotFound) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "skipped: " << perf.status().ToString();
  }
  ASSERT_TRUE(perf.ok()) << perf.status().ToString();
  SpinWhileNotSampled(0.3);
  ASSERT_TRUE((*perf)->Enable().ok());
  SpinWhileSampled(0.3);
  ASSERT_TRUE((*perf)->Disable().ok());
  SpinWhileNotSampled(0.3);
  ASSERT_TRUE((*perf)->Finish().ok());

  const testing::CommandResult script = testing::RunCommand(
      absl::StrCat("perf script -i ", data, " -F pid,period,ip,sym"), milliseconds(60000));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(script.exit_code, 0) << script.output;
  // 300 ms of this thread's CPU at one sample per 100 us of CPU: ~3,000
  // samples in the sampled loop (perf in a VM loses some), none in the other.
  int sampled = 0, not_sampled = 0;
  const std::string pid = std::to_string(getpid());
  const std::vector<std::string> lines = absl::StrSplit(script.output, '\n');
  for (const std::string& line : lines) {
    const std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.empty() || fields[0] != pid) continue;
    sampled += line.find("SpinWhileSampled") != std::string::npos;
    not_sampled += line.find("SpinWhileNotSampled") != std::string::npos;
  }
  EXPECT_GT(sampled, 100) << script.output.substr(0, 2000);
  EXPECT_EQ(not_sampled, 0);
}

}  // namespace
}  // namespace fleet::bench
