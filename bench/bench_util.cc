#include "bench/bench_util.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <thread>

namespace fleet::bench {

using Clock = std::chrono::steady_clock;

void PrintEnvironment(const std::string& program) {
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::printf("%s  date: %s  cores: %u  cpu: %s\n", program.c_str(), date,
              std::thread::hardware_concurrency(), cpu.c_str());
#ifdef NDEBUG
  std::printf("build: optimized, assertions off\n");
#else
  std::printf("WARNING: assertions are on (no NDEBUG): build with -DCMAKE_BUILD_TYPE=Release "
              "or RelWithDebInfo for meaningful figures\n");
#endif
#if !defined(__OPTIMIZE__)
  std::printf("WARNING: compiled without optimization; figures are not representative\n");
#endif
  std::printf("\n");
}

int IterationsFor(const std::function<void()>& fn, double seconds) {
  // Warm up for ~10% of the budget (connections, caches, allocator), then
  // scale the count to the budget.
  const auto warm_budget = std::chrono::duration<double>(seconds * 0.1);
  int n = 0;
  const auto start = Clock::now();
  while (Clock::now() - start < warm_budget || n < 3) {
    fn();
    ++n;
  }
  const double per_call = std::chrono::duration<double>(Clock::now() - start).count() / n;
  return std::max(5, static_cast<int>(seconds / per_call));
}

std::vector<double> TimeEach(const std::function<void()>& fn, int iterations) {
  std::vector<double> micros;
  micros.reserve(iterations);
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    fn();
    micros.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return micros;
}

Summary Summarize(std::vector<double> micros) {
  Summary s;
  if (micros.empty()) return s;
  std::sort(micros.begin(), micros.end());
  auto at = [&](double q) {
    return micros[std::min(micros.size() - 1, static_cast<size_t>(q * (micros.size() - 1)))];
  };
  s.min = micros.front();
  s.p50 = at(0.5);
  s.p99 = at(0.99);
  s.max = micros.back();
  s.count = micros.size();
  return s;
}

void PrintHeader() {
  std::printf("  %-22s %10s %10s %10s %10s %12s %12s\n", "", "min us", "p50 us", "p99 us",
              "max us", "ops/s", "GB/s");
}

void PrintRow(const std::string& label, const Summary& s, double bytes_per_op) {
  const double ops = s.p50 > 0 ? 1e6 / s.p50 : 0;
  if (bytes_per_op > 0) {
    std::printf("  %-22s %10.1f %10.1f %10.1f %10.1f %12.0f %12.3f\n", label.c_str(), s.min, s.p50,
                s.p99, s.max, ops, ops * bytes_per_op / 1e9);
  } else {
    std::printf("  %-22s %10.1f %10.1f %10.1f %10.1f %12.0f %12s\n", label.c_str(), s.min, s.p50,
                s.p99, s.max, ops, "-");
  }
}

}  // namespace fleet::bench
