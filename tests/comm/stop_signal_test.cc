#include "comm/stop_signal.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace fleet {
namespace {

// A thread that existed before the watcher (as OpenBLAS's pool does in
// every program linking BLAS) has SIGTERM unblocked. A SIGTERM delivered to
// it must reach the watcher's callback instead of killing the process.
TEST(StopSignalWatcherTest, ASignalOnAThreadStartedBeforeTheWatcherReachesIt) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::thread early([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  std::atomic<int> received{0};
  {
    StopSignalWatcher watcher([&](int sig) { received.store(sig); });
    ASSERT_EQ(pthread_kill(early.native_handle(), SIGTERM), 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (received.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(received.load(), SIGTERM);
    // And one sent to the process as a whole.
    received.store(0);
    ASSERT_EQ(kill(getpid(), SIGINT), 0);
    while (received.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(received.load(), SIGINT);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  early.join();
}

}  // namespace
}  // namespace fleet
