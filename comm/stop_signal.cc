#include "comm/stop_signal.h"

#include <signal.h>

#include <cerrno>
#include <ctime>

#include <glog/logging.h>

namespace fleet {

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
}

StopSignalWatcher::~StopSignalWatcher() {
  done_.store(true);
  thread_.join();
}

}  // namespace fleet
