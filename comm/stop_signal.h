// StopSignalWatcher: turns SIGTERM and SIGINT into a callback on an ordinary
// thread, so a program can stop gracefully (finish requests, save) instead
// of dying inside a signal handler.
//
// Construct it in main() before starting threads: it blocks the two signals
// in the calling thread, and threads started later inherit that mask. A
// thread that existed before (a library's, started before main: OpenBLAS)
// may still receive one; a handler then forwards it to the watcher. At most
// one watcher at a time (the handler reaches it through a global).
#pragma once

#include <atomic>
#include <functional>
#include <thread>

namespace fleet {

class StopSignalWatcher {
 public:
  // on_stop runs on the watcher thread, once per signal received.
  explicit StopSignalWatcher(std::function<void(int signal)> on_stop);
  ~StopSignalWatcher();  // stops the watcher thread (within ~100 ms)
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace fleet
