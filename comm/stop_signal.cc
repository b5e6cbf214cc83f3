#include "comm/stop_signal.h"

#include <glog/logging.h>
#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <ctime>

namespace fleet {
namespace {

// A thread started before the watcher has the two signals unblocked: the
// kernel may deliver SIGTERM to it, whose default action kills the process.
// Such threads exist whatever main() does: OpenBLAS starts its pool from a
// shared-library constructor, before main. So the watcher also installs a
// handler that forwards a signal landing on such a thread to the watcher
// thread (where it is blocked, so it waits for sigtimedwait). A signal
// handler can only reach a global: these two hold the watcher while one runs.
std::atomic<bool> g_watching{false};
std::atomic<pthread_t> g_watcher{};

void ForwardToWatcher(int sig) {
  // pthread_kill is async-signal-safe (POSIX.1-2008).
  if (g_watching.load()) pthread_kill(g_watcher.load(), sig);
}

}  // namespace

StopSignalWatcher::StopSignalWatcher(std::function<void(int)> on_stop) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  PCHECK(pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0);
  thread_ = std::thread([this, set, on_stop = std::move(on_stop)] {
    // A short timed wait, so the destructor can end this thread.
    const timespec tick{0, 100'000'000};
    while (!done_.load()) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig > 0) on_stop(sig);
    }
  });
  g_watcher.store(thread_.native_handle());
  g_watching.store(true);
  struct sigaction forward = {};
  forward.sa_handler = ForwardToWatcher;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  PCHECK(sigaction(SIGTERM, &forward, nullptr) == 0);
  PCHECK(sigaction(SIGINT, &forward, nullptr) == 0);
}

StopSignalWatcher::~StopSignalWatcher() {
  // Signals from now on get their default action again.
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  g_watching.store(false);
  done_.store(true);
  thread_.join();
}

}  // namespace fleet
