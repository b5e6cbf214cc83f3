#include "comm/rpc.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "tests/child_process.h"
#include "tests/raw_connection.h"

namespace fleet {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kEcho = 1;
constexpr uint32_t kFail = 2;
constexpr uint32_t kSlow = 3;
constexpr uint32_t kDrop = 4;
constexpr uint32_t kDeferred = 5;
constexpr uint32_t kInlineEcho = 6;  // Echo on the I/O thread, after 30 us of work

RpcNodeOptions FastOptions(const std::string& name) {
  RpcNodeOptions o;
  o.name = name;
  o.default_timeout = 5s;
  o.van.heartbeat_interval = 200ms;
  o.van.heartbeat_timeout = 1000ms;
  return o;
}

// Echoes every frame back and adds the sum of float frame 0 as a second frame.
Status Echo(const Message& request, Message* response) {
  for (int i = 0; i < request.header.frames_size(); ++i) {
    response->header.add_frames()->CopyFrom(request.header.frames(i));
    response->frames.push_back(request.frames[i]);
  }
  response->header.set_meta(request.header.meta());
  return Status::OK();
}

class RpcTest : public ::testing::Test {
 protected:
  std::unique_ptr<RpcNode> StartServer(const std::string& name, std::string* endpoint) {
    return StartServer(FastOptions(name), endpoint);
  }
  std::unique_ptr<RpcNode> StartServer(const RpcNodeOptions& options, std::string* endpoint) {
    auto server = RpcNode::Create(options);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    auto node = std::move(server).value();
    node->RegisterSync(kEcho, Echo);
    RpcHandlerOptions inline_handler;
    inline_handler.run_on_io_thread = true;
    node->RegisterSync(
        kInlineEcho,
        [](const Message& request, Message* response) {
          // The work of a small table request (busy, not asleep: ZeroMQ's
          // I/O thread must deliver the next requests meanwhile).
          const auto until = std::chrono::steady_clock::now() + 30us;
          while (std::chrono::steady_clock::now() < until) {
          }
          return Echo(request, response);
        },
        inline_handler);
    node->RegisterSync(kFail, [](const Message& req, Message*) {
      return Status::NotFound("no such table", std::to_string(req.header.table_id()));
    });
    node->Register(kSlow, [](Message, Responder r) {
      std::this_thread::sleep_for(1500ms);
      r.Reply(Message());
    });
    node->Register(kDrop, [](Message, Responder) {});
    node->Register(kDeferred, [this](Message, Responder r) {
      std::lock_guard<std::mutex> lock(deferred_mu_);
      deferred_.push_back(r);
    });
    auto bound = node->Listen("127.0.0.1:0");
    EXPECT_TRUE(bound.ok()) << bound.status().ToString();
    *endpoint = bound.value();
    return node;
  }

  std::unique_ptr<RpcNode> Client() {
    auto c = RpcNode::Create(FastOptions("test-client"));
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }

  std::mutex deferred_mu_;
  std::vector<Responder> deferred_;
};

Message FloatRequest(uint32_t command, size_t n, float base) {
  Message m;
  m.header.set_command(command);
  SArray<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  m.AddFrame(v);
  SArray<uint64_t> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = (static_cast<uint64_t>(base) << 32) | i;
  m.AddFrame(k);
  return m;
}

TEST_F(RpcTest, ListenOnPortZeroReportsRealPort) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  EXPECT_TRUE(endpoint.starts_with("127.0.0.1:")) << endpoint;
  EXPECT_NE(endpoint, "127.0.0.1:0");
}

TEST_F(RpcTest, EchoRoundTripPreservesFramesForSizes) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  for (size_t n : {0u, 1u, 63u, 64u, 1000u, 1u << 20}) {
    auto reply = client->Call(peer, FloatRequest(kEcho, n, 7.0f)).get();
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    auto values = reply->Frame<float>(0);
    auto keys = reply->Frame<uint64_t>(1);
    ASSERT_TRUE(values.ok() && keys.ok());
    ASSERT_EQ(values->size(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ((*values)[i], 7.0f + static_cast<float>(i)) << "n=" << n << " i=" << i;
      ASSERT_EQ((*keys)[i], (7ull << 32) | i);
    }
    EXPECT_EQ(reply->header.sender(), "s");
  }
}

TEST_F(RpcTest, ManyConcurrentCallsToManyServers) {
  constexpr int kServers = 3;
  constexpr int kCalls = 300;
  std::vector<std::unique_ptr<RpcNode>> servers;
  std::vector<std::string> endpoints(kServers);
  for (int s = 0; s < kServers; ++s) servers.push_back(StartServer("s" + std::to_string(s), &endpoints[s]));
  auto client = Client();
  std::vector<int> peers;
  for (auto& e : endpoints) peers.push_back(client->Connect(e).value());
  std::vector<std::future<Result<Message>>> futures;
  for (int i = 0; i < kCalls; ++i) {
    futures.push_back(client->Call(peers[i % kServers], FloatRequest(kEcho, 16, float(i))));
  }
  for (int i = 0; i < kCalls; ++i) {
    auto r = futures[i].get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r->Frame<float>(0))[0], float(i));
    EXPECT_EQ(r->header.sender(), "s" + std::to_string(i % kServers));
  }
}

TEST_F(RpcTest, ConcurrentCallersFromManyThreads) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto r = client->Call(peer, FloatRequest(kEcho, 4, float(t * 1000 + i))).get();
        if (r.ok() && (*r->Frame<float>(0))[0] == float(t * 1000 + i)) ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST_F(RpcTest, BlockingCallersReceiveForEachOtherAndForAsyncCalls) {
  // Several threads in CallSync (one of them receives for all, the others
  // wait) while async calls complete through callbacks: every call must
  // complete with its own reply, whoever received it.
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  std::atomic<int> sync_ok{0}, async_ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        const float tag = float(t * 1000 + i);
        auto r = client->CallSync(peer, FloatRequest(kEcho, 2, tag));
        if (r.ok() && (*r->Frame<float>(0))[0] == tag) sync_ok.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 300; ++i) {
    const float tag = float(100000 + i);
    client->CallAsync(peer, FloatRequest(kEcho, 2, tag), {}, [&, tag](Result<Message> r) {
      if (r.ok() && (*r->Frame<float>(0))[0] == tag) async_ok.fetch_add(1);
    });
    if (i % 50 == 0) std::this_thread::sleep_for(1ms);
  }
  for (auto& t : threads) t.join();
  for (int spin = 0; spin < 500 && async_ok.load() < 300; ++spin) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(sync_ok.load(), 300);
  EXPECT_EQ(async_ok.load(), 300);
}

TEST_F(RpcTest, AsyncCallAfterBlockingCallsIsNotLeftForTheNextTick) {
  // After a blocking call the I/O thread may sleep without watching the
  // outgoing connections (nothing was pending). A later async call, whose
  // reply only the I/O thread will receive, must wake it. With a 2 s tick a
  // missed wake-up shows as a 2 s delay.
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  RpcNodeOptions o = FastOptions("test-client");
  o.van.tick = 2s;
  auto client = RpcNode::Create(o).value();
  int peer = client->Connect(endpoint).value();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(client->CallSync(peer, FloatRequest(kEcho, 2, float(i))).ok());
    const auto start = std::chrono::steady_clock::now();
    std::future<Result<Message>> f = client->Call(peer, FloatRequest(kEcho, 2, float(i)));
    ASSERT_EQ(f.wait_for(1s), std::future_status::ready) << "async reply " << i << " waited for a tick";
    EXPECT_TRUE(f.get().ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  }
  // Blocking calls issued from inside the wait and awaited futures mix.
  for (int i = 0; i < 20; ++i) {
    auto pending = client->Call(peer, FloatRequest(kEcho, 2, 1.0f));
    auto r = client->IssueAndAwait<Result<Message>>(
        [&] { return client->Call(peer, FloatRequest(kEcho, 2, float(i))); }, 5s);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r->Frame<float>(0))[0], float(i));
    ASSERT_EQ(pending.wait_for(1s), std::future_status::ready);
  }
}

// Options of a node in the tests of lost wake-ups under load: a message
// that no thread was woken for waits for the 10 s tick. On a machine whose
// 2 cores are shared by a dozen busy processes a woken thread may wait
// over 2 s for a CPU (measured: polls ending 650 ms after their timeout,
// chains of hand-offs over 1 s), so a tick of 2 s would not tell the two
// apart. Calls and heartbeats are lenient for the same reason: a starved
// process must not lose its calls or connections instead.
constexpr auto kLongTick = 10s;
RpcNodeOptions LongTickOptions(const std::string& name) {
  RpcNodeOptions o = FastOptions(name);
  o.default_timeout = 60s;
  o.van.tick = kLongTick;
  o.van.heartbeat_interval = 1s;
  o.van.heartbeat_timeout = 20s;
  return o;
}

// Keeps 8 calls of 12 KB each to the inline echo in flight and waits for
// each as PsClient::Wait does (the caller receives, when no other thread
// of the node does). Counts the calls that succeeded and those that waited
// half a tick or more.
void CallThroughAWindow(RpcNode& client, int peer, int c, std::atomic<int>& ok,
                        std::atomic<int>& late) {
  constexpr int kWindow = 8, kCalls = 1000;
  std::vector<std::future<Result<Message>>> window(kWindow);
  for (int i = 0; i < kCalls + kWindow; ++i) {
    auto& slot = window[i % kWindow];
    if (slot.valid()) {
      const auto start = std::chrono::steady_clock::now();
      Result<Message> r = client.Await(std::move(slot), 6 * kLongTick);
      if (std::chrono::steady_clock::now() - start >= kLongTick / 2) late.fetch_add(1);
      if (r.ok()) ok.fetch_add(1);
    }
    if (i < kCalls) slot = client.Call(peer, FloatRequest(kInlineEcho, 1000, float(c * 10000 + i)));
  }
}

TEST_F(RpcTest, RepliesOfInlineHandlersNeverWaitForTheTick) {
  // Replies made on the server's I/O thread go out at the end of its receive
  // pass; sending them may consume the signal of a request that arrived
  // meanwhile, which the I/O thread must not then sleep through. Two
  // clients call through a window each; a missed request or reply waits
  // for a tick.
  std::string endpoint;
  auto server = StartServer(LongTickOptions("s"), &endpoint);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0}, late{0};
  for (int c = 0; c < 2; ++c) {
    clients.emplace_back([&, c] {
      auto client = RpcNode::Create(LongTickOptions("test-client")).value();
      const int peer = client->Connect(endpoint).value();
      CallThroughAWindow(*client, peer, c, ok, late);
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 2000);
  EXPECT_EQ(late.load(), 0) << "calls that waited for a tick";
}

TEST_F(RpcTest, CallsOfThreadsSharingANodeNeverWaitForTheTick) {
  // Two threads call through one node: while one receives (Await), the
  // other's requests and replies pass it, the I/O thread or both, and a
  // send may take the signal of a reply the receiving thread sleeps on.
  // A missed wake-up waits for a tick.
  std::string endpoint;
  auto server = StartServer(LongTickOptions("s"), &endpoint);
  auto client = RpcNode::Create(LongTickOptions("test-client")).value();
  const int peer = client->Connect(endpoint).value();
  std::vector<std::thread> callers;
  std::atomic<int> ok{0}, late{0};
  for (int c = 0; c < 2; ++c) {
    callers.emplace_back([&, c] { CallThroughAWindow(*client, peer, c, ok, late); });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), 2000);
  EXPECT_EQ(late.load(), 0) << "calls that waited for a tick";
}

// How long a thread has been runnable (on a CPU, or on the run queue
// waiting for one) since it started, from its schedstat (nanoseconds on a
// CPU, then waiting). A thread that busy-polls is runnable for its whole
// window however loaded the machine is, and a sleeping one is not, so this
// tells spinning from sleeping where CPU time (what a loaded machine hands
// out) cannot. 0 for a thread that is gone.
std::chrono::microseconds RunnableTime(const std::filesystem::path& schedstat) {
  std::ifstream in(schedstat);
  int64_t on_cpu_ns = 0, waiting_ns = 0;
  if (!(in >> on_cpu_ns >> waiting_ns)) return std::chrono::microseconds(0);
  return std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::nanoseconds(on_cpu_ns + waiting_ns));
}

std::chrono::microseconds ThreadRunnableTime() {
  return RunnableTime("/proc/thread-self/schedstat");
}

// Every thread of this process, by thread id.
std::map<std::string, std::chrono::microseconds> ProcessRunnableTimes() {
  std::map<std::string, std::chrono::microseconds> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    out[task.path().filename()] = RunnableTime(task.path() / "schedstat");
  }
  return out;
}

// The runnable time the threads alive at both looks gained between them.
std::chrono::microseconds RunnableSince(
    const std::map<std::string, std::chrono::microseconds>& before) {
  std::chrono::microseconds gained(0);
  for (const auto& [tid, now] : ProcessRunnableTimes()) {
    if (auto it = before.find(tid); it != before.end()) gained += now - it->second;
  }
  return gained;
}

TEST_F(RpcTest, BusyPollingMissesNoMessageAndSpinsOnlyForItsWindow) {
  // Both sides busy-poll. A 2 s tick makes a message that spinning threads
  // overlooked show as a 2 s delay, as in the test above.
  RpcNodeOptions server_options = FastOptions("s");
  server_options.van.busy_poll = 100ms;
  server_options.van.tick = 2s;
  std::string endpoint;
  auto server = StartServer(server_options, &endpoint);
  RpcNodeOptions client_options = FastOptions("test-client");
  client_options.van.busy_poll = 60ms;
  client_options.van.tick = 2s;
  auto client = RpcNode::Create(client_options).value();
  int peer = client->Connect(endpoint).value();
  // A message seen late, only once the spinning ends, shows as a median
  // round trip near the 100 ms window (here it is well under 1 ms).
  std::vector<std::chrono::steady_clock::duration> round_trips;
  for (int i = 0; i < 30; ++i) {
    // Every third round after the spinning stopped, so sleeping threads are
    // woken too.
    if (i % 3 == 0) std::this_thread::sleep_for(150ms);
    auto start = std::chrono::steady_clock::now();
    auto sync = client->CallSync(peer, FloatRequest(kEcho, 2, float(i)));
    ASSERT_TRUE(sync.ok()) << sync.status().ToString();
    EXPECT_EQ((*sync->Frame<float>(0))[0], float(i));
    round_trips.push_back(std::chrono::steady_clock::now() - start);
    ASSERT_LT(round_trips.back(), 1s) << "blocking call " << i << " waited for a tick";
    start = std::chrono::steady_clock::now();
    std::future<Result<Message>> f = client->Call(peer, FloatRequest(kEcho, 2, float(i)));
    ASSERT_EQ(f.wait_for(1s), std::future_status::ready)
        << "async reply " << i << " waited for a tick";
    EXPECT_TRUE(f.get().ok());
    round_trips.push_back(std::chrono::steady_clock::now() - start);
  }
  std::nth_element(round_trips.begin(), round_trips.begin() + round_trips.size() / 2,
                   round_trips.end());
  EXPECT_LT(round_trips[round_trips.size() / 2], 30ms) << "messages wait for the spinning to end";

  // The server's I/O thread spins for its 100 ms after the request, then
  // sleeps: the process's runnable time over the next 400 ms is well above
  // idle and well below 400 ms.
  std::this_thread::sleep_for(200ms);
  ASSERT_TRUE(client->CallSync(peer, FloatRequest(kEcho, 2, 1.0f)).ok());
  const auto process_before = ProcessRunnableTimes();
  std::this_thread::sleep_for(400ms);
  const auto process_spin = RunnableSince(process_before);
  EXPECT_GE(process_spin, 5ms) << "the server did not busy-poll";
  EXPECT_LE(process_spin, 250ms) << "busy polling did not stop after its window";

  // A caller waiting 1.5 s for a slow handler spins for its 60 ms, then
  // sleeps.
  const auto thread_before = ThreadRunnableTime();
  Message slow;
  slow.header.set_command(kSlow);
  ASSERT_TRUE(client->CallSync(peer, std::move(slow)).ok());
  const auto caller_spin = ThreadRunnableTime() - thread_before;
  EXPECT_GE(caller_spin, 5ms) << "the waiting caller did not busy-poll";
  EXPECT_LE(caller_spin, 400ms) << "the waiting caller spun past its window";
}

TEST_F(RpcTest, HandlerErrorTravelsBack) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  Message m;
  m.header.set_command(kFail);
  m.header.set_table_id(17);
  auto r = client->Call(client->Connect(endpoint).value(), std::move(m)).get();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound());
  EXPECT_EQ(r.status().message(), "no such table: 17");
}

TEST_F(RpcTest, UnknownCommandGetsErrorAndServerKeepsServing) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  Message m;
  m.header.set_command(999);
  auto r = client->Call(peer, std::move(m)).get();
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_NE(r.status().message().find("unknown command 999"), std::string::npos);
  EXPECT_TRUE(client->Call(peer, FloatRequest(kEcho, 3, 1)).get().ok());
}

TEST_F(RpcTest, DroppedResponderAnswersInternal) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  Message m;
  m.header.set_command(kDrop);
  auto r = client->Call(client->Connect(endpoint).value(), std::move(m)).get();
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("without replying"), std::string::npos);
}

TEST_F(RpcTest, DeferredReplyFromAnotherThread) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  std::vector<std::future<Result<Message>>> futures;
  for (int i = 0; i < 3; ++i) {
    Message m;
    m.header.set_command(kDeferred);
    futures.push_back(client->Call(peer, std::move(m)));
  }
  for (int spin = 0; spin < 500; ++spin) {
    {
      std::lock_guard<std::mutex> lock(deferred_mu_);
      if (deferred_.size() == 3) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  for (auto& f : futures) EXPECT_EQ(f.wait_for(50ms), std::future_status::timeout);
  std::thread releaser([&] {
    std::lock_guard<std::mutex> lock(deferred_mu_);
    ASSERT_EQ(deferred_.size(), 3u);
    for (auto& r : deferred_) r.Reply(Message());
    deferred_.clear();
  });
  releaser.join();
  for (auto& f : futures) EXPECT_TRUE(f.get().ok());
}

TEST_F(RpcTest, AbsentPeerFailsAtDeadlineNamingEndpoint) {
  // A port nobody listens on: bind a server, note its port, stop it.
  std::string endpoint;
  { auto gone = StartServer("gone", &endpoint); }
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  RpcOptions opts;
  opts.timeout = 300ms;
  opts.what = "pull_sparse table 3";
  const auto start = std::chrono::steady_clock::now();
  auto r = client->Call(peer, FloatRequest(kEcho, 1, 0), opts).get();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.status().IsTimeout()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("pull_sparse table 3"), std::string::npos);
  EXPECT_NE(r.status().message().find("tcp://" + endpoint), std::string::npos);
  EXPECT_NE(r.status().message().find("never reached"), std::string::npos);
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2s);
}

// `ps_worker --servers=<nothing>` used to wait its whole 60 s deadline:
// a peer never reached fails the call after connect_timeout.
TEST_F(RpcTest, NeverReachedPeerFailsAfterConnectTimeoutNotAtDeadline) {
  std::string endpoint;
  { auto gone = StartServer("gone", &endpoint); }
  RpcNodeOptions o = FastOptions("test-client");
  o.default_timeout = 30s;
  o.connect_timeout = 400ms;
  auto client = RpcNode::Create(o).value();
  int peer = client->Connect(endpoint).value();
  RpcOptions opts;
  opts.what = "pull_dense table 1";
  const auto start = std::chrono::steady_clock::now();
  auto r = client->CallSync(peer, FloatRequest(kEcho, 1, 0), opts);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  for (const std::string& part : {std::string("pull_dense table 1"), "tcp://" + endpoint,
                                  std::string("never reached within 400 ms")}) {
    EXPECT_NE(r.status().message().find(part), std::string::npos) << r.status().ToString();
  }
  EXPECT_GE(took, 400ms);
  EXPECT_LT(took, 2s);
  RpcNodeOptions zero = FastOptions("bad");
  zero.connect_timeout = 0ms;
  EXPECT_TRUE(RpcNode::Create(zero).status().IsInvalidArgument());
}

// A peer that was reached but answers slowly is not cut short by
// connect_timeout: its call runs to the deadline.
TEST_F(RpcTest, ReachedButSlowPeerWaitsForTheDeadline) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  RpcNodeOptions o = FastOptions("test-client");
  o.connect_timeout = 100ms;
  auto client = RpcNode::Create(o).value();
  int peer = client->Connect(endpoint).value();
  ASSERT_TRUE(client->CallSync(peer, FloatRequest(kEcho, 1, 0)).ok());  // reached
  Message m;
  m.header.set_command(kSlow);
  RpcOptions opts;
  opts.timeout = 700ms;
  const auto start = std::chrono::steady_clock::now();
  auto r = client->CallSync(peer, std::move(m), opts);
  EXPECT_TRUE(r.status().IsTimeout()) << r.status().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 700ms);
}

TEST_F(RpcTest, SlowHandlerPastDeadlineTimesOutAndLateReplyIsIgnored) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  Message m;
  m.header.set_command(kSlow);
  RpcOptions opts;
  opts.timeout = 200ms;
  auto r = client->Call(peer, std::move(m), opts).get();
  ASSERT_TRUE(r.status().IsTimeout());
  EXPECT_EQ(r.status().message().find("never reached"), std::string::npos) << r.status().ToString();
  // The late reply arrives while this call runs and must not disturb it.
  auto ok = client->Call(peer, FloatRequest(kEcho, 2, 5)).get();
  EXPECT_TRUE(ok.ok());
}

TEST_F(RpcTest, StopFailsPendingCalls) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto client = Client();
  int peer = client->Connect(endpoint).value();
  Message m;
  m.header.set_command(kSlow);
  auto f = client->Call(peer, std::move(m));
  std::this_thread::sleep_for(50ms);
  client->Stop();
  auto r = f.get();
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  auto after = client->Call(peer, Message()).get();
  EXPECT_TRUE(after.status().IsUnavailable());
}

// StopServing waits for a request it let in, also one whose handler runs
// on the I/O thread, and refuses the ones after: what a server saves after
// StopServing holds every request it answered OK. (Before, a handler on the
// I/O thread was not waited for at all, and a pool request could slip in
// between the draining check and its count.)
TEST_F(RpcTest, StopServingWaitsForEveryRequestItLetIn) {
  constexpr uint32_t kSlowInline = 6;
  std::atomic<bool> started{false};
  std::atomic<int> applied{0};
  auto node = RpcNode::Create(FastOptions("s"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  std::unique_ptr<RpcNode> server = std::move(node).value();
  server->RegisterSync(
      kSlowInline,
      [&](const Message&, Message*) {
        started = true;
        std::this_thread::sleep_for(300ms);
        ++applied;
        return Status::OK();
      },
      RpcHandlerOptions{.run_on_io_thread = true, .io_thread_if = nullptr});
  auto bound = server->Listen("127.0.0.1:0");
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  auto client = Client();
  const int peer = client->Connect(*bound).value();
  Message m;
  m.header.set_command(kSlowInline);
  auto reply = client->Call(peer, std::move(m));
  while (!started) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(server->StopServing(5s).ok());
  EXPECT_EQ(applied.load(), 1) << "StopServing returned while a handler it let in was running";
  EXPECT_TRUE(reply.get().ok());

  Message late;
  late.header.set_command(kSlowInline);
  auto refused = client->Call(peer, std::move(late)).get();
  EXPECT_TRUE(refused.status().IsUnavailable()) << refused.status().ToString();
  EXPECT_EQ(applied.load(), 1);
}

TEST_F(RpcTest, BindToTakenPortIsUnavailable) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  auto other = RpcNode::Create(FastOptions("other")).value();
  auto r = other->Listen(endpoint);
  ASSERT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(endpoint), std::string::npos);
}

TEST_F(RpcTest, MalformedEndpointsAreInvalidArgument) {
  auto node = Client();
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":80", "127.0.0.1:70000", "h:abc",
                          "127.0.0.1:-1"}) {
    EXPECT_TRUE(node->Connect(bad).status().IsInvalidArgument()) << bad;
  }
  EXPECT_TRUE(node->Connect("127.0.0.1:0").status().IsInvalidArgument());
}

// Raw ZeroMQ peer that speaks the wire format by hand, to send what a
// correct client never would.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint)
      : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, 3000);
    socket_.connect("tcp://" + endpoint);
  }
  void SendParts(const std::vector<std::string>& parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      socket_.send(zmq::buffer(parts[i]),
                   i + 1 == parts.size() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    }
  }
  // Returns the header of the reply, or nullopt on timeout.
  std::optional<pb::Header> Receive() {
    zmq::message_t part;
    if (!socket_.recv(part)) return std::nullopt;
    pb::Header h;
    EXPECT_TRUE(h.ParseFromArray(part.data(), static_cast<int>(part.size())));
    while (part.more()) (void)socket_.recv(part);
    return h;
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
};

std::string Header(uint32_t command, uint64_t id, std::vector<std::pair<pb::DataType, uint64_t>> frames) {
  pb::Header h;
  h.set_command(command);
  h.set_request_id(id);
  h.set_sender("raw");
  for (auto [t, n] : frames) {
    auto* f = h.add_frames();
    f->set_dtype(t);
    f->set_count(n);
  }
  return h.SerializeAsString();
}

TEST_F(RpcTest, BadFramesGetErrorRepliesAndServerKeepsServing) {
  std::string endpoint;
  auto server = StartServer("s", &endpoint);
  RawPeer raw(endpoint);

  // Declared 4 floats, sent 15 bytes.
  raw.SendParts({Header(kEcho, 11, {{pb::DT_FLOAT, 4}}), std::string(15, 'x')});
  auto h = raw.Receive();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->request_id(), 11u);
  EXPECT_EQ(h->status_code(), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(h->status_message().find("frame size disagrees"), std::string::npos);

  // Keys without values: header declares two frames, one arrives.
  raw.SendParts({Header(kEcho, 12, {{pb::DT_UINT64, 2}, {pb::DT_FLOAT, 2}}), std::string(16, 'k')});
  h = raw.Receive();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->request_id(), 12u);
  EXPECT_NE(h->status_message().find("declares 2 payload frames but 1 arrived"), std::string::npos);

  // Unknown type tag.
  raw.SendParts({Header(kEcho, 13, {{static_cast<pb::DataType>(77), 1}}), std::string(8, 'z')});
  h = raw.Receive();
  ASSERT_TRUE(h.has_value());
  EXPECT_NE(h->status_message().find("unknown data type tag 77"), std::string::npos);

  // A header that does not parse cannot be answered: dropped.
  raw.SendParts({std::string("\xff\xff\xff\xff garbage", 13), "payload"});
  // An empty header is a valid (all-default) header: command 0, unknown.
  raw.SendParts({std::string()});
  h = raw.Receive();
  ASSERT_TRUE(h.has_value());
  EXPECT_NE(h->status_message().find("unknown command 0"), std::string::npos);

  // The server still answers a good request from the same raw peer.
  raw.SendParts({Header(kEcho, 14, {{pb::DT_FLOAT, 1}}), std::string(4, '\0')});
  h = raw.Receive();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->request_id(), 14u);
  EXPECT_EQ(h->status_code(), 0);

  // And a normal client too.
  auto client = Client();
  EXPECT_TRUE(client->Call(client->Connect(endpoint).value(), FloatRequest(kEcho, 8, 1)).get().ok());
}

// Resident memory of this process, in MiB.
double ResidentMiB() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// A stranger that speaks ZeroMQ's wire protocol (ZMTP 3.0, NULL mechanism)
// by hand announces a 2 GiB frame and streams bytes into it. The server's
// ZeroMQ drops the connection on the announcement (ZMQ_MAXMSGSIZE) instead
// of buffering what follows: the stranger gets only the kernel's socket
// buffers in, and the server does not grow. (Without the limit it read
// every byte into a 2 GiB buffer: +256 MiB here.) A frame over the limit is
// refused on the sending side too.
TEST_F(RpcTest, FramesOverTheMessageLimitAreNeitherBufferedNorSent) {
  RpcNodeOptions options = FastOptions("s");
  options.van.max_message_bytes = 8 << 20;
  std::string endpoint;
  auto server = StartServer(options, &endpoint);
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  const double before = ResidentMiB();
  fleet::testing::RawConnection stranger(port);
  ASSERT_TRUE(stranger.connected());
  std::string greeting(64, '\0');
  greeting[0] = '\xff';
  greeting[9] = '\x7f';
  greeting[10] = 3;  // ZMTP 3.0
  greeting.replace(12, 4, "NULL");
  const std::string ready_body = std::string("\x05READY") + "\x0bSocket-Type" +
                                 std::string("\0\0\0\x06", 4) + "DEALER";
  std::string ready = "\x04";  // a short command frame
  ready.push_back(static_cast<char>(ready_body.size()));
  ready += ready_body;
  std::string frame_head = "\x02";  // a long message frame, the last part
  for (int shift = 56; shift >= 0; shift -= 8) {
    frame_head.push_back(static_cast<char>((uint64_t{1} << 31) >> shift & 0xff));
  }
  ASSERT_TRUE(stranger.Send(greeting + ready + frame_head));
  const std::string chunk(1 << 20, 'S');
  int sent_mib = 0;
  while (sent_mib < 256 && stranger.Send(chunk)) ++sent_mib;
  EXPECT_LT(sent_mib, 64) << "the server kept reading the announced frame";
  EXPECT_LT(ResidentMiB() - before, 32.0);

  RpcNodeOptions small = FastOptions("small-client");
  small.van.max_message_bytes = 1 << 20;
  auto client = RpcNode::Create(small).value();
  auto big = client->CallSync(client->Connect(endpoint).value(), FloatRequest(kEcho, 1 << 19, 1));
  EXPECT_TRUE(big.status().IsInvalidArgument()) << big.status().ToString();
  EXPECT_NE(big.status().message().find("Distributed.max_message_bytes"), std::string::npos);
  // The server goes on serving.
  auto ok = Client();
  EXPECT_TRUE(ok->Call(ok->Connect(endpoint).value(), FloatRequest(kEcho, 8, 1)).get().ok());
}

// A server in a child process, so that freezing and killing it is real.
// Forked before this test creates any thread or ZeroMQ context.
class ChildServer {
 public:
  ChildServer() {
    int fds[2];
    PCHECK(pipe(fds) == 0);
    child_ = testing::Child::Fork([&fds] {
      close(fds[0]);
      auto node = RpcNode::Create(FastOptions("child")).value();
      node->RegisterSync(kEcho, Echo);
      std::string bound = node->Listen("127.0.0.1:0").value();
      bound.push_back('\n');
      (void)!write(fds[1], bound.data(), bound.size());
      close(fds[1]);
      // Serve until the parent kills us.
      for (;;) pause();
      return 0;
    });
    close(fds[1]);
    char buf[64] = {};
    ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    CHECK_GT(n, 1);
    endpoint_.assign(buf, n - 1);
  }
  pid_t pid() const { return child_.pid(); }
  const std::string& endpoint() const { return endpoint_; }

 private:
  testing::Child child_;  // killed and reaped with this object
  std::string endpoint_;
};

// Kills a child server that answered once, waits `pause`, then calls it
// (20 s deadline). Returns the outcome and how long the call took.
struct CallToKilledPeer {
  Result<Message> result;
  std::chrono::steady_clock::duration took;
  std::string endpoint;
};
CallToKilledPeer CallAfterKillingPeer(std::chrono::milliseconds pause) {
  ChildServer child;
  auto client = RpcNode::Create(FastOptions("client")).value();
  int peer = client->Connect(child.endpoint()).value();
  EXPECT_TRUE(client->Call(peer, FloatRequest(kEcho, 1, 0)).get().ok());
  kill(child.pid(), SIGKILL);
  std::this_thread::sleep_for(pause);
  RpcOptions opts;
  opts.timeout = 20s;
  const auto start = std::chrono::steady_clock::now();
  auto r = client->Call(peer, FloatRequest(kEcho, 1, 0), opts).get();
  return {std::move(r), std::chrono::steady_clock::now() - start, child.endpoint()};
}

TEST(RpcProcessTest, KilledPeerFailsPendingCallsFast) {
  CallToKilledPeer c = CallAfterKillingPeer(0ms);
  EXPECT_FALSE(c.result.ok());
  EXPECT_TRUE(c.result.status().IsUnavailable() || c.result.status().IsTimeout())
      << c.result.status().ToString();
  EXPECT_NE(c.result.status().message().find(c.endpoint), std::string::npos);
  EXPECT_LT(c.took, 5s) << c.result.status().ToString();
}

TEST(RpcProcessTest, CallMadeAfterThePeerWasLostFailsAtOnce) {
  // The loss is noticed before the call is made (the I/O thread handles the
  // disconnect during the pause), so no pending call is there to fail; the
  // call itself must see the connection is down.
  CallToKilledPeer c = CallAfterKillingPeer(1s);
  EXPECT_TRUE(c.result.status().IsUnavailable()) << c.result.status().ToString();
  EXPECT_NE(c.result.status().message().find(c.endpoint), std::string::npos)
      << c.result.status().ToString();
  EXPECT_LT(c.took, 1s);
}

TEST(RpcProcessTest, FrozenPeerIsDetectedByHeartbeat) {
  ChildServer child;
  auto client = RpcNode::Create(FastOptions("client")).value();
  int peer = client->Connect(child.endpoint()).value();
  ASSERT_TRUE(client->Call(peer, FloatRequest(kEcho, 1, 0)).get().ok());
  kill(child.pid(), SIGSTOP);  // alive to TCP, silent to heartbeats
  // kill() returns before the child has stopped; wait until it has.
  int status = 0;
  ASSERT_EQ(waitpid(child.pid(), &status, WUNTRACED), child.pid());
  ASSERT_TRUE(WIFSTOPPED(status));
  RpcOptions opts;
  opts.timeout = 30s;
  const auto start = std::chrono::steady_clock::now();
  auto r = client->Call(peer, FloatRequest(kEcho, 1, 0), opts).get();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("missed heartbeats"), std::string::npos);
  EXPECT_LT(took, 5s);  // heartbeat timeout is 1 s; the deadline is 30 s
  kill(child.pid(), SIGCONT);
}

}  // namespace
}  // namespace fleet
