#include "comm/van.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace fleet {
namespace {

using namespace std::chrono_literals;

// Sends every message straight back.
class EchoReceiver final : public VanReceiver {
 public:
  Van* van = nullptr;  // set before any message arrives
  void OnMessage(const Route& from, Message message) override {
    EXPECT_TRUE(van->Send(from, std::move(message)).ok());
  }
  void OnMalformed(const Route&, const pb::Header&, const Status&) override {}
  void OnConnectionUp(int) override {}
  void OnConnectionDown(int, const std::string&, const Status&) override {}
  void OnTick(std::chrono::steady_clock::time_point) override {}
};

// The first reply is delivered on the I/O thread, which then holds it until
// a caller has started waiting for it (ReceiveWhile) and has seen it not
// yet delivered.
class HeldReplyReceiver final : public VanReceiver {
 public:
  std::promise<void> delivering;
  std::promise<void> caller_saw_it_missing;
  std::atomic<bool> delivered{false};
  std::atomic<bool> held_for_caller{false};

  void OnMessage(const Route&, Message) override {
    delivering.set_value();
    held_for_caller = caller_saw_it_missing.get_future().wait_for(5s) == std::future_status::ready;
    delivered = true;
  }
  void OnMalformed(const Route&, const pb::Header&, const Status&) override {}
  void OnConnectionUp(int) override {}
  void OnConnectionDown(int, const std::string&, const Status&) override {}
  void OnTick(std::chrono::steady_clock::time_point) override {}
};

TEST(VanTest, ReceivingCallerWakesWhenTheIoThreadDeliversItsReply) {
  // A caller that starts waiting (ReceiveWhile) while the I/O thread is
  // delivering the very reply it waits for finds the socket empty and sleeps
  // on it; nothing arrives there any more, so the I/O thread must wake it
  // once it has delivered. A missed wake-up shows as a wait of a tick.
  VanOptions options;
  options.tick = 10s;
  EchoReceiver echo;
  auto server = Van::Create(options, &echo).value();
  echo.van = server.get();
  const std::string endpoint = server->Bind("127.0.0.1:0").value();

  HeldReplyReceiver held;
  auto client = Van::Create(options, &held).value();
  const int connection = client->Connect(endpoint).value();
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

}  // namespace
}  // namespace fleet
