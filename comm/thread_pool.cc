#include "comm/thread_pool.h"

#include <atomic>
#include <memory>

#include <glog/logging.h>

namespace fleet {

ThreadPool::ThreadPool(int num_threads) {
  CHECK_GE(num_threads, 1);
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  // Indices are claimed from a shared counter, so the caller makes progress
  // even when every pool thread is busy (or is itself the caller).
  struct State {
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto state = std::make_shared<State>();
  auto work = [state, n, &fn] {
    size_t finished = 0;
    for (size_t i; (i = state->next.fetch_add(1)) < n;) {
      fn(i);
      ++finished;
    }
    if (finished && state->done.fetch_add(finished) + finished == n) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->cv.notify_all();
    }
  };
  const size_t helpers = std::min<size_t>(threads_.size(), n - 1);
  for (size_t h = 0; h < helpers; ++h) Submit(work);
  work();
  std::unique_lock<std::mutex> lock(state->mu);
  // No timeout: every index is claimed by a running thread, so this wait
  // ends as soon as the last fn(i) returns.
  state->cv.wait(lock, [&] { return state->done.load() == n; });
}

}  // namespace fleet
