// RpcNode: request/response over a Van. A node can serve (Listen + handlers
// registered by command) and call (Connect + Call) at once, so servers,
// workers and heter workers all use the same class.
//
// Calls: each has a request id and a deadline. A response completes the
// call; a deadline, a lost connection or Stop() completes it with an error
// that names the call and the peer's endpoint. No call ever waits forever.
//
// Handlers: run on the node's handler thread pool, never on the I/O thread.
// A handler answers through a Responder, immediately or later (a barrier
// keeps Responders until every worker arrived).
//
// Thread safety: all public methods are thread-safe except Register, which
// must happen before Listen.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "comm/message.h"
#include "comm/status.h"
#include "comm/thread_pool.h"
#include "comm/van.h"

namespace fleet {

struct RpcNodeOptions {
  // Sent as header.sender and used in logs ("worker:3"). Helps a server
  // say who sent a bad request.
  std::string name = "node";
  // Threads running request handlers. Handlers of one node run in parallel;
  // 2-4 keeps a 2-core machine busy while the I/O thread moves bytes.
  int handler_threads = 2;
  // Deadline for calls whose RpcOptions leave timeout at 0.
  std::chrono::milliseconds default_timeout{std::chrono::seconds(60)};
  // A call to a peer this node has never reached (no TCP connection since
  // Connect) fails with Unavailable this long after it was made, instead of
  // waiting for its deadline: a wrong address or a peer that is not running
  // shows up in seconds. A peer reached once is never cut short by it
  // (connected but slow waits for the deadline; a lost connection fails at
  // once). Raise it when peers may start well after their callers.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
  VanOptions van;
};

// Per call. Adding a field here never changes a signature.
struct RpcOptions {
  // 0 = the node's default_timeout.
  std::chrono::milliseconds timeout{0};
  // Names the call in error messages, e.g. "pull_sparse table 3". Empty =
  // "command <N>".
  std::string what;
};

// Answers one request. Copyable: copies share one reply slot and only the
// first Reply/ReplyError is sent. If every copy is destroyed without a
// reply, the caller gets an Internal error instead of waiting for its
// deadline.
class Responder {
 public:
  Responder() = default;
  // `response` keeps its frames; header command/request id/routing are filled
  // in here. Its status is OK unless set_status was called on it.
  void Reply(Message response) const;
  void ReplyError(const Status& status) const;
  // The request's sender name, for error messages.
  const std::string& sender() const;
  bool valid() const { return state_ != nullptr; }

 private:
  friend class RpcNode;
  struct State;
  explicit Responder(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// Runs on a handler thread. Takes ownership of the request.
using RpcHandler = std::function<void(Message request, Responder responder)>;
// For handlers that answer at once: fill `response` and return its status.
// A non-OK status is sent as the reply's status (frames are dropped).
using RpcSyncHandler = std::function<Status(const Message& request, Message* response)>;

struct RpcHandlerOptions {
  // Run the handler on the I/O thread instead of the handler pool. Saves two
  // thread hand-offs per request (about half the round trip of a small
  // message), but while it runs no other message moves: only for handlers
  // that take microseconds and never block (echo, stats, a small lookup).
  bool run_on_io_thread = false;
  // With run_on_io_thread: when set, only requests it returns true for run
  // there and the others go to the pool. For handlers whose cost grows with
  // the request (a lookup of n keys). Runs on the I/O thread; must be quick.
  std::function<bool(const Message& request)> io_thread_if;
};

class RpcNode final : private VanReceiver {
 public:
  static Result<std::unique_ptr<RpcNode>> Create(RpcNodeOptions options);
  ~RpcNode() override;  // Stop()s.
  RpcNode(const RpcNode&) = delete;
  RpcNode& operator=(const RpcNode&) = delete;

  // REQUIRES: called before Listen; command not registered yet.
  void Register(uint32_t command, RpcHandler handler, RpcHandlerOptions options = {});
  void RegisterSync(uint32_t command, RpcSyncHandler handler, RpcHandlerOptions options = {});

  // Starts serving on "ip:port" (port 0 picks a free one) and returns the
  // bound "ip:port". Errors as Van::Bind.
  Result<std::string> Listen(const std::string& endpoint);

  // Adds a peer to call and returns its id. Never waits for the peer.
  Result<int> Connect(const std::string& endpoint);

  // Sends `request` to `peer`; `done` runs exactly once, on the node's I/O
  // thread, with the response or with:
  //   Timeout      the deadline passed (message: call, endpoint, ms, whether
  //                the peer was ever reached);
  //   Unavailable  the peer was never reached within connect_timeout of the
  //                call (message: call, endpoint, ms), or
  //                the connection was lost or the node stopped (a call
  //                made while the connection is down, before ZeroMQ
  //                reconnects, fails at once, `done` then running on the
  //                calling thread);
  //   the status the handler replied with, otherwise.
  // `done` must be quick and must not call Stop(). `options` is read before
  // the request is handed over (never once `done` may run), so it may live
  // in what `done` owns.
  // REQUIRES: peer was returned by Connect().
  void CallAsync(int peer, Message request, const RpcOptions& options,
                 std::function<void(Result<Message>)> done);
  // The same, as a future. The future is always completed by the deadline.
  std::future<Result<Message>> Call(int peer, Message request, const RpcOptions& options = {});

  // Blocking call: Call() and Await() in one.
  Result<Message> CallSync(int peer, Message request, const RpcOptions& options = {});

  // Waits for a future completed by this node's calls (Call, or CallAsync
  // callbacks that set a promise), receiving replies on this thread while
  // it waits when no other thread does (Van::ReceiveWhile), which saves a
  // thread hand-off per round trip. `budget` bounds the helping; the wait
  // itself ends when the calls behind `f` complete, which their deadlines
  // guarantee.
  template <typename T>
  T Await(std::future<T> f, std::chrono::milliseconds budget) {
    return IssueAndAwait<T>([&f] { return std::move(f); }, budget);
  }

  // Await(issue()), with issue() (which makes calls through this node and
  // returns the future of their outcome) run from inside the wait: then
  // neither the requests nor their replies wake the I/O thread, one thread
  // hand-off less again. What blocking calls should use.
  template <typename T>
  T IssueAndAwait(const std::function<std::future<T>()>& issue, std::chrono::milliseconds budget) {
    std::future<T> f;
    const bool received = van_->ReceiveWhile(
        [&] { f = issue(); },
        [&f] { return f.wait_for(std::chrono::seconds(0)) != std::future_status::ready; },
        std::chrono::steady_clock::now() + budget);
    // Another thread was receiving: it (or the I/O thread) delivers.
    if (!received) f = issue();
    return f.get();
  }

  // Graceful first half of a shutdown: new requests are answered with
  // Unavailable ("shutting down"); requests already handed to handlers run
  // to completion and their replies are sent. Waits at most `grace` for
  // them; Timeout naming how many were still running otherwise. Calls this
  // node makes are not affected. A request is counted from the moment it is
  // let in (on the pool or the I/O thread) until its handler returns.
  // REQUIRES: not called from a handler (it would wait for itself).
  Status StopServing(std::chrono::milliseconds grace);

  // Stops the transport, fails pending calls with Unavailable, waits for
  // running handlers. Idempotent.
  void Stop();

  const std::string& name() const { return options_.name; }
  std::string peer_endpoint(int peer) const { return van_->endpoint(peer); }
  // Whether a connection to `peer` was ever up (it may be down now): a
  // caller retrying a lost peer tells "was there and crashed" from "never
  // reached". REQUIRES: peer was returned by Connect().
  bool PeerEverReached(int peer) const;

 private:
  struct PendingCall {
    std::function<void(Result<Message>)> done;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::steady_clock::time_point start;
    int peer;
    std::string what;
  };

  explicit RpcNode(RpcNodeOptions options);

  // VanReceiver, on the I/O thread.
  void OnMessage(const Route& from, Message&& message) override;
  void OnMalformed(const Route& from, const pb::Header& header, const Status& why) override;
  void OnConnectionUp(int connection) override;
  void OnConnectionDown(int connection, const std::string& endpoint, const Status& why) override;
  void OnTick(std::chrono::steady_clock::time_point now) override;

  void Dispatch(const Route& from, Message&& request);
  // Ends a request Dispatch let in (its handler returned).
  void FinishRequest();
  // Removes and returns the pending call, if still there.
  bool TakePending(uint64_t request_id, PendingCall* out);
  Status TimeoutStatus(const PendingCall& call) const;

  // Fixed after construction (handlers_: after Listen).
  const RpcNodeOptions options_;
  struct Registered {
    RpcHandler handler;
    RpcHandlerOptions options;
  };
  absl::flat_hash_map<uint32_t, Registered> handlers_;
  std::shared_ptr<Van> van_;
  std::unique_ptr<ThreadPool> pool_;

  std::atomic<uint64_t> next_request_id_{1};
  std::atomic<bool> listening_{false};
  // Requests let in and not yet returned from their handler (on the pool or
  // the I/O thread), and whether StopServing has closed the door.
  std::mutex in_flight_mu_;
  std::condition_variable in_flight_cv_;
  int in_flight_ = 0;      // guarded by in_flight_mu_
  bool draining_ = false;  // guarded by in_flight_mu_

  // Guarded by mu_.
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, PendingCall> pending_;
  // B-trees: a call adds and removes an entry, which a node-per-entry set
  // allocates and frees.
  absl::btree_set<std::pair<std::chrono::steady_clock::time_point, uint64_t>> deadlines_;
  // When calls made to a never-reached peer give up on it (connect_timeout);
  // entries of calls completed meanwhile are dropped as they come due.
  absl::btree_set<std::pair<std::chrono::steady_clock::time_point, uint64_t>> connect_deadlines_;
  std::vector<bool> peer_ever_up_;
  // Why each connection is down since it was lost (OK: up or never lost).
  // Calls to a lost peer fail at once until ZeroMQ reconnects.
  std::vector<Status> peer_lost_;
  bool stopped_ = false;
};

}  // namespace fleet
