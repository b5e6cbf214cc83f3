#include "comm/van.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace fleet {
namespace {

using namespace std::chrono_literals;

// A receiver that only handles messages (connections, ticks and malformed
// messages are of no interest to these tests).
class MessageReceiver : public VanReceiver {
 public:
  void OnMalformed(const Route&, const pb::Header&, const Status&) override {}
  void OnConnectionUp(int) override {}
  void OnConnectionDown(int, const std::string&, const Status&) override {}
  void OnTick(std::chrono::steady_clock::time_point) override {}
};

// Sends every message straight back; says when it has sent the first.
class EchoReceiver final : public MessageReceiver {
 public:
  Van* van = nullptr;  // set before any message arrives
  std::promise<void> replied;
  bool told = false;  // I/O thread only

  void OnMessage(const Route& from, Message&& message) override {
    EXPECT_TRUE(van->Send(from, message).ok());
    if (!told) replied.set_value();
    told = true;
  }
};

// A server bound on a free loopback port and a client connected to it.
struct ConnectedVans {
  std::unique_ptr<Van> server;
  std::unique_ptr<Van> client;  // after server: destroyed first
  int connection = -1;          // the client's connection to the server
};

ConnectedVans Connect(const VanOptions& options, VanReceiver* server_side,
                      VanReceiver* client_side) {
  ConnectedVans v;
  v.server = Van::Create(options, server_side).value();
  const std::string endpoint = v.server->Bind("127.0.0.1:0").value();
  v.client = Van::Create(options, client_side).value();
  v.connection = v.client->Connect(endpoint).value();
  return v;
}

// The first reply is delivered on the I/O thread, which then holds it until
// a caller has started waiting for it (ReceiveWhile) and has seen it not
// yet delivered.
class HeldReplyReceiver final : public MessageReceiver {
 public:
  std::promise<void> delivering;
  std::promise<void> caller_saw_it_missing;
  std::atomic<bool> delivered{false};
  std::atomic<bool> held_for_caller{false};

  void OnMessage(const Route&, Message&&) override {
    delivering.set_value();
    held_for_caller = caller_saw_it_missing.get_future().wait_for(5s) == std::future_status::ready;
    delivered = true;
  }
};

TEST(VanTest, ReceivingCallerWakesWhenTheIoThreadDeliversItsReply) {
  // A caller that starts waiting (ReceiveWhile) while the I/O thread is
  // delivering the very reply it waits for finds the socket empty and sleeps
  // on it; nothing arrives there any more, so the I/O thread must wake it
  // once it has delivered. A missed wake-up shows as a wait of a tick.
  VanOptions options;
  options.tick = 10s;
  EchoReceiver echo;
  HeldReplyReceiver held;
  auto [server, client, connection] = Connect(options, &echo, &held);
  echo.van = server.get();
  Message request;
  request.header.set_command(1);
  ASSERT_TRUE(client->Send(Route::Outgoing(connection), request).ok());
  // No caller receives yet, so the I/O thread takes the reply.
  ASSERT_EQ(held.delivering.get_future().wait_for(5s), std::future_status::ready);

  bool told = false;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client->ReceiveWhile(
      nullptr,
      [&] {
        const bool missing = !held.delivered;
        if (!told) {
          told = true;
          held.caller_saw_it_missing.set_value();
        }
        return missing;
      },
      start + 60s));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(held.held_for_caller);
  EXPECT_TRUE(held.delivered);
  EXPECT_LT(waited, options.tick / 2) << "the caller slept until its tick";
}

// Answers command 1 after a pause (so that command 2 is queued behind it and
// arrives in the same receive pass), and answers command 2 only once the
// caller has had the first reply (or after 5 s).
class PipelinedReceiver final : public MessageReceiver {
 public:
  Van* van = nullptr;  // set before any message arrives
  std::promise<void> first_reply_arrived;
  std::atomic<bool> second_saw_first_arrive{false};

  void OnMessage(const Route& from, Message&& message) override {
    if (message.header.command() == 1) {
      std::this_thread::sleep_for(100ms);
    } else {
      second_saw_first_arrive =
          first_reply_arrived.get_future().wait_for(5s) == std::future_status::ready;
    }
    EXPECT_TRUE(van->Send(from, message).ok());
  }
};

// Collects replies on the client's I/O thread.
class ReplyReceiver final : public MessageReceiver {
 public:
  PipelinedReceiver* server = nullptr;
  std::promise<void> both;
  int replies = 0;  // I/O thread only

  void OnMessage(const Route&, Message&& message) override {
    if (message.header.command() == 1) server->first_reply_arrived.set_value();
    if (++replies == 2) both.set_value();
  }
};

TEST(VanTest, AnInlineReplyLeavesBeforeTheNextRequestIsHandled) {
  // Requests in flight together (a window of them) reach the server's I/O
  // thread in one receive pass. Each reply must leave when its handler
  // makes it: held back to the end of the pass, a window comes back as one
  // burst and caller and server take turns idling. Here the second request's
  // handler waits for the first reply to reach the caller.
  PipelinedReceiver pipelined;
  ReplyReceiver replies;
  replies.server = &pipelined;
  auto [server, client, connection] = Connect(VanOptions{}, &pipelined, &replies);
  pipelined.van = server.get();
  for (uint32_t command : {1, 2}) {
    Message request;
    request.header.set_command(command);
    ASSERT_TRUE(client->Send(Route::Outgoing(connection), request).ok());
  }
  ASSERT_EQ(replies.both.get_future().wait_for(30s), std::future_status::ready)
      << "the two replies did not arrive";
  EXPECT_TRUE(pipelined.second_saw_first_arrive)
      << "the first reply waited for the second request's handler";
}

// Records, in order, the messages and lost connections it is told of.
class EventOrderReceiver final : public MessageReceiver {
 public:
  std::mutex mu;
  std::vector<std::string> events;  // guarded by mu
  std::promise<void> down;
  bool told_down = false;  // guarded by mu

  void OnMessage(const Route&, Message&&) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back("message");
  }
  void OnConnectionDown(int, const std::string&, const Status&) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back("down");
    if (!told_down) down.set_value();
    told_down = true;
  }
};

TEST(VanTest, AReplySentBeforeThePeerClosedIsDeliveredBeforeTheConnectionIsLost) {
  // A server answers a stop request and exits. Its reply and the close
  // reach the client together while a caller waits (ReceiveWhile, so the I/O
  // thread leaves the connection's messages to it) but has not yet looked:
  // the I/O thread, which reports the close, must deliver the reply first,
  // or the call fails as "connection lost" and its reply is dropped.
  EchoReceiver echo;
  EventOrderReceiver order;
  ConnectedVans vans = Connect(VanOptions{}, &echo, &order);
  echo.van = vans.server.get();
  bool stopped_server = false;
  ASSERT_TRUE(vans.client->ReceiveWhile(
      [&] {
        // Sent once the caller receives: the I/O thread leaves the reply.
        Message request;
        request.header.set_command(1);
        EXPECT_TRUE(vans.client->Send(Route::Outgoing(vans.connection), request).ok());
      },
      [&] {
        if (stopped_server) return false;
        stopped_server = true;
        // The caller looks away while the reply arrives and the server
        // closes (its stop sends what it queued, then closes).
        EXPECT_EQ(echo.replied.get_future().wait_for(10s), std::future_status::ready);
        vans.server->Stop();
        EXPECT_EQ(order.down.get_future().wait_for(10s), std::future_status::ready)
            << "the closed connection was not reported";
        return false;
      },
      std::chrono::steady_clock::now() + 30s));
  std::lock_guard<std::mutex> lock(order.mu);
  EXPECT_EQ(order.events, (std::vector<std::string>{"message", "down"}));
}

// Takes requests and never answers; says when the first one came.
class SilentReceiver final : public MessageReceiver {
 public:
  std::promise<void> got;
  bool told = false;  // I/O thread only

  void OnMessage(const Route&, Message&&) override {
    if (!told) got.set_value();
    told = true;
  }
};

TEST(VanTest, ACallerWaitingWhenItsConnectionIsLostLooksAgainAtOnce) {
  // A caller waits (ReceiveWhile) for a reply that will not come: the
  // server stops. The I/O thread reports the lost connection, which fails
  // the call; the caller must see that at once, not when its poll's slice
  // (a tick, long here) ends.
  VanOptions options;
  options.tick = 10s;
  SilentReceiver silent;
  EventOrderReceiver order;
  ConnectedVans vans = Connect(options, &silent, &order);
  std::thread stopper([&] {
    ASSERT_EQ(silent.got.get_future().wait_for(10s), std::future_status::ready);
    vans.server->Stop();
  });
  auto lost = [&] {
    std::lock_guard<std::mutex> lock(order.mu);
    return order.told_down;
  };
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(vans.client->ReceiveWhile(
      [&] {
        Message request;
        request.header.set_command(1);
        EXPECT_TRUE(vans.client->Send(Route::Outgoing(vans.connection), request).ok());
      },
      [&] { return !lost(); }, start + 60s));
  const auto waited = std::chrono::steady_clock::now() - start;
  stopper.join();
  EXPECT_TRUE(lost());
  EXPECT_LT(waited, options.tick / 2) << "the caller slept until its poll's slice ended";
}

}  // namespace
}  // namespace fleet
