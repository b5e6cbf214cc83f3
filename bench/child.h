// Child processes of a benchmark: started with pipes on their stdin and
// stdout, talked to in lines with deadlines, their CPU time read from /proc,
// reaped with a timeout. A child dies with its parent (PR_SET_PDEATHSIG).
//
// Thread safety: the functions are; a Child is used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/status.h"

namespace fleet::bench {

struct Child {
  pid_t pid = -1;
  int stdin_fd = -1;    // write end of the child's stdin (-1 once closed)
  int stdout_fd = -1;   // read end of the child's stdout
  std::string pending;  // bytes read past the last line
  std::string name;     // for messages: "ps-lite worker 1"
};

// Starts argv[0] (a path) with argv, the parent's environment plus `env`
// ("NAME=value", overriding), stdin and stdout on pipes, stderr shared.
// IOError when a pipe or fork fails.
Result<Child> SpawnChild(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                         const std::string& name);

// Writes `line` and a newline to the child's stdin. IOError when the child
// is gone.
Status WriteLine(Child& child, const std::string& line);

// The child's next stdout line (without the newline). Blocks until
// `deadline`; Timeout naming `what` and the child then, Unavailable when
// the child closed its stdout (exited) first.
Result<std::string> ReadLine(Child& child, std::chrono::steady_clock::time_point deadline,
                             const std::string& what);

// Closes the pipes, waits up to `timeout` for the child to exit, then kills
// it. Reports an abnormal end on stderr. Idempotent.
void Reap(Child& child, std::chrono::seconds timeout);

// CPU seconds of a live process: the sum over its threads of their time on
// CPU in /proc/<pid>/task/<tid>/schedstat (0 when it is gone).
double ProcessCpuSeconds(pid_t pid);

// One thread's CPU time (schedstat) and context switches (voluntary and
// not: each is a sleep or a preemption, so about one wake-up each), with
// its name.
struct ThreadSample {
  pid_t tid = -1;
  std::string name;
  double cpu_s = 0;
  int64_t switches = 0;
};
// Every thread of a live process (empty when it is gone).
std::vector<ThreadSample> SampleThreads(pid_t pid);

}  // namespace fleet::bench
