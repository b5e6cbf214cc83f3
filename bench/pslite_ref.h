// A ps-lite-shaped parameter server, the reference ps_bench holds FleetPS
// against (ps-lite itself is not a Debian package). It is built the way
// ps-lite (dmlc) is, from its public design, not its code:
//
//  * every node binds a ROUTER it only receives on and connects a DEALER to
//    each peer it sends to (ps-lite's ZMQVan); a worker introduces itself
//    to each server with its node id and receive endpoint, and the server
//    connects back;
//  * a receive thread per node (the van) hands every message through a
//    locked queue to a customer thread, which runs the handler (server) or
//    the response bookkeeping (worker); a waiting caller is woken by a
//    condition variable (ps-lite's Customer and Wait(timestamp));
//  * the server keeps an unordered_map from key to row and a float arena of
//    rows (value, then adagrad's squared-gradient sum), and applies sgd or
//    adagrad in place;
//  * the worker's ZPull / ZPush split a request over the servers by key
//    range (ps-lite's default slicer), send the slices without copying
//    (one server: the caller's arrays themselves), and copy a pull's values
//    into the caller's array as each slice's reply arrives;
//  * no authentication.
// Unlike ps-lite, keys need not be sorted: with several servers the slices
// are gathered in one pass (ps-lite needs sorted keys and makes the caller
// sort them).
//
// Thread safety: PsLiteServer is thread-safe (its threads do all the work).
// A PsLiteWorker's ZPull / ZPush / Wait are called by one thread at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>
#include <zmq.hpp>

namespace fleet::bench {

struct PsLiteRule {
  enum Kind { kSgd, kAdagrad } kind = kSgd;
  float learning_rate = 0.01f;
  float initial_g2sum = 0.0f;  // adagrad
  float epsilon = 1e-8f;       // adagrad
};

// A locked FIFO of multipart messages with a blocking Pop (ps-lite's
// ThreadsafeQueue). An empty message is the stop sentinel.
class MessageQueue {
 public:
  void Push(std::vector<zmq::message_t> message);
  std::vector<zmq::message_t> Pop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<zmq::message_t>> queue_;  // guarded by mu_
};

class PsLiteServer {
 public:
  // Binds tcp://<ip>:* and starts its van and customer threads.
  PsLiteServer(size_t dim, PsLiteRule rule, const std::string& ip = "127.0.0.1");
  ~PsLiteServer();  // stops and joins both threads
  PsLiteServer(const PsLiteServer&) = delete;
  PsLiteServer& operator=(const PsLiteServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }

 private:
  void Process();  // customer thread
  void Handle(std::vector<zmq::message_t>& request);
  // The row of `key` (value then optimizer state), created as zeros.
  float* Row(uint64_t key);

  const size_t dim_;
  const PsLiteRule rule_;
  const size_t row_floats_;  // dim, twice that for adagrad
  zmq::context_t context_{1};
  zmq::socket_t receiver_{context_, zmq::socket_type::router};
  std::string endpoint_;
  MessageQueue queue_;
  // Customer thread only.
  std::unordered_map<uint64_t, size_t> index_;  // key -> row offset in arena_
  std::vector<float> arena_;
  std::unordered_map<uint32_t, zmq::socket_t> senders_;  // by worker node id
  std::thread van_, customer_;
};

class PsLiteWorker {
 public:
  explicit PsLiteWorker(const std::vector<std::string>& servers, size_t dim);
  ~PsLiteWorker();
  PsLiteWorker(const PsLiteWorker&) = delete;
  PsLiteWorker& operator=(const PsLiteWorker&) = delete;

  // Starts a pull of keys into vals (keys.size() * dim floats) or a push of
  // vals; returns the request's timestamp for Wait. keys and vals must stay
  // unchanged (pull: untouched) until Wait(timestamp) returned.
  int ZPull(std::span<const uint64_t> keys, std::span<float> vals);
  int ZPush(std::span<const uint64_t> keys, std::span<const float> vals);
  // Blocks until every server answered the request.
  void Wait(int timestamp);

 private:
  struct Request;
  int Send(bool push, std::span<const uint64_t> keys, std::span<const float> vals, float* out);
  void Process();  // customer thread

  const size_t dim_;
  const uint32_t node_id_;
  zmq::context_t context_{1};
  zmq::socket_t receiver_{context_, zmq::socket_type::router};
  std::vector<zmq::socket_t> senders_;  // caller thread only
  MessageQueue queue_;
  int next_timestamp_ = 0;  // caller thread only
  std::mutex mu_;
  std::condition_variable done_;
  std::unordered_map<int, std::unique_ptr<Request>> requests_;  // guarded by mu_
  std::thread van_, customer_;
};

}  // namespace fleet::bench
