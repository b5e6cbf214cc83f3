// ThreadPool: a fixed set of threads running submitted closures in FIFO
// order. Used by the RPC server for handlers and by tables to process shards
// in parallel.
//
// Thread-safe. The destructor finishes every queued task, then joins.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fleet {

class ThreadPool {
 public:
  // REQUIRES: num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task);

  // Runs fn(i) for i in [0, n) on the pool and the calling thread; returns
  // when all are done. Safe to call from inside a pool task (the caller
  // works through the indices itself, so it never waits on a busy pool).
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkerLoop();

  // Fixed after construction.
  std::vector<std::thread> threads_;

  // Guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
};

}  // namespace fleet
