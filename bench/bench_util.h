// Shared pieces of every bench/ program: the environment banner, warm-up
// driven iteration counts, per-iteration timing and the result table.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace fleet::bench {

struct Summary {
  double min = 0, p50 = 0, p99 = 0, max = 0;  // microseconds
  size_t count = 0;
};

// Prints date, host cores, CPU model, build type, and warnings for a debug
// build or assertions left on (figures from such builds mean little).
void PrintEnvironment(const std::string& program);

// Runs fn until about `seconds` worth of calls can be estimated from a
// warm-up, and returns that count (at least 5).
int IterationsFor(const std::function<void()>& fn, double seconds);

// Times each of `iterations` calls, in microseconds.
std::vector<double> TimeEach(const std::function<void()>& fn, int iterations);

Summary Summarize(std::vector<double> micros);

// Column header and a row: min/p50/p99/max in us, ops/s at p50, and
// bandwidth at p50 for `bytes_per_op` bytes (omitted when 0).
void PrintHeader();
void PrintRow(const std::string& label, const Summary& s, double bytes_per_op);

}  // namespace fleet::bench
