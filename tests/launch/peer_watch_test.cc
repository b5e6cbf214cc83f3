// PeerWatch in-process: watches over a KV store on loopback, with beats
// every 20 ms and a peer timeout of 1 s so each case takes about a
// second. (tests/cluster runs it across network namespaces through fleetrun.)
#include "launch/peer_watch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/tcp_relay.h"

namespace fleet::launch {
namespace {

using std::chrono::milliseconds;

class PeerWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvStoreServerOptions server;
    server.listen = "127.0.0.1:0";
    server_ = std::make_unique<KvStoreServer>(server);
    ASSERT_TRUE(server_->Start().ok());
    KvStoreClientOptions client;
    client.request_timeout = milliseconds(500);
    kv_ = std::make_unique<KvStoreClient>(server_->endpoint(), "job", client);
  }

  // A watch for host `self` whose peers are `peers` (ids = names = the
  // letters).
  std::unique_ptr<PeerWatch> Watch(const std::string& self, const std::vector<std::string>& peers,
                                   PeerWatchOptions options = {}) {
    options.self_id = self;
    options.self_name = "host " + self;
    for (const std::string& p : peers) options.peers.push_back({p, "host " + p, "10.0.0." + p});
    options.beat_every = milliseconds(20);
    options.peer_timeout = milliseconds(1000);
    if (options.join_timeout == PeerWatchOptions{}.join_timeout)
      options.join_timeout = milliseconds(5000);
    return std::make_unique<PeerWatch>(kv_.get(), std::move(options));
  }

  // The watch's failure once it has one, "" when none came within 5 s.
  static std::string FailureOf(const PeerWatch& watch) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (std::optional<std::string> why = watch.failure()) return *why;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return "";
  }

  // Waits until `watch` has seen peer `id` beat (its failure would
  // otherwise be "never joined").
  void AwaitJoined(const std::string& id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!kv_->Get("hosts/" + id).ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }

  // A watch's notes (PeerWatchOptions::note, called on its thread), for
  // the test to look for.
  class Notes {
   public:
    std::function<void(const std::string&)> Sink() {
      return [this](const std::string& line) {
        std::lock_guard<std::mutex> lock(mu_);
        lines_.push_back(line);
      };
    }
    bool Seen(const std::string& text) const {
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::string& line : lines_) {
        if (line.find(text) != std::string::npos) return true;
      }
      return false;
    }

   private:
    mutable std::mutex mu_;
    std::vector<std::string> lines_;
  };

  // The value at `key`, "" when absent.
  std::string ValueOf(const std::string& key) {
    Result<std::string> v = kv_->Get(key);
    return v.ok() ? *v : "";
  }

  std::unique_ptr<KvStoreServer> server_;
  std::unique_ptr<KvStoreClient> kv_;
};

TEST_F(PeerWatchTest, APeerThatStopsBeatingIsNamedWithItsProcesses) {
  auto a = Watch("1", {"2"});
  auto b = Watch("2", {"1"});
  b->SetProcesses("worker 1");
  AwaitJoined("2");
  // Give a's watch a round that sees b's processes, then b goes silent
  // (as a fleetrun killed with SIGKILL: no end marked).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (ValueOf("hosts/2").find("worker 1") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  std::this_thread::sleep_for(milliseconds(100));  // a few of a's rounds read it
  b.reset();
  const std::string why = FailureOf(*a);
  EXPECT_NE(why.find("host 2 (worker 1) stopped: no heartbeat for"), std::string::npos) << why;
  // The others learn it from the marker.
  EXPECT_NE(ValueOf("job/failed").find("host 2 (worker 1) stopped"), std::string::npos);
}

TEST_F(PeerWatchTest, AFailedHostsMarkerReachesThePeers) {
  auto a = Watch("1", {"2"});
  auto b = Watch("2", {"1"});
  b->SetProcesses("worker 1");
  b->MarkFailed("worker 1 (pid 7) exited with status 3");
  EXPECT_EQ(FailureOf(*a), "job failed: host 2 (worker 1): worker 1 (pid 7) exited with status 3");
  EXPECT_EQ(b->failure(), std::nullopt);  // its own failure is no news to it
}

TEST_F(PeerWatchTest, AHostThatEndedIsNotWatched) {
  auto a = Watch("1", {"2", "3"});
  auto b = Watch("2", {"1", "3"});
  b->MarkEnded("done");
  b.reset();
  // Host 3 fails later: that, not host 2's silence, is what a reports.
  auto c = Watch("3", {"1", "2"});
  std::this_thread::sleep_for(milliseconds(1200));  // longer than the peer timeout
  c->MarkFailed("worker 2 exited with status 1");
  EXPECT_EQ(FailureOf(*a), "job failed: host 3: worker 2 exited with status 1");
}

TEST_F(PeerWatchTest, APeerThatNeverJoinsOrIsRefusedIsNamed) {
  PeerWatchOptions short_join;
  short_join.join_timeout = milliseconds(300);
  auto a = Watch("1", {"2"}, short_join);
  EXPECT_NE(FailureOf(*a).find("host 2 never joined through the KV store at"), std::string::npos);

  ASSERT_TRUE(kv_->Delete("job/failed").ok());
  PeerWatchOptions refusing;
  refusing.refused = [](const std::string& address) -> std::optional<std::string> {
    if (address == "10.0.0.3") return std::string("credential refused (403): bad signature");
    return std::nullopt;
  };
  auto b = Watch("2", {"3"}, refusing);
  EXPECT_EQ(
      FailureOf(*b),
      "host 3 was refused by the KV store: credential refused (403): bad signature; every host "
      "needs the same --job_secret_file");
}

TEST_F(PeerWatchTest, LosingTheStoreIsNamed) {
  auto a = Watch("1", {"2"});
  auto b = Watch("2", {"1"});
  AwaitJoined("1");
  AwaitJoined("2");
  const std::string endpoint = server_->endpoint();
  server_->Stop();
  const std::string why = FailureOf(*a);
  EXPECT_NE(why.find("lost the KV store at " + endpoint), std::string::npos) << why;
}

// A store that goes silent (a cut that drops packets: every request waits
// out its timeout) is named within the bar of 10 s, with fleetrun's own
// timings (beats every 1 s, requests of 2 s, peers dead after 5 s) and two
// peers: a round stops at its first failed request. (It took 20.7-23.8 s
// when every round waited out each of its requests.)
TEST_F(PeerWatchTest, ASilentlyCutStoreIsNamedWithinTenSeconds) {
  fleet::testing::TcpRelay relay(server_->port());
  KvStoreClient through(relay.endpoint(), "job",
                        KvStoreClientOptions{.request_timeout = milliseconds(2000)});
  PeerWatchOptions o;
  o.self_id = "1";
  o.self_name = "host 1";
  o.peers = {{"2", "host 2", ""}, {"3", "host 3", ""}};
  o.peer_timeout = milliseconds(5000);
  auto watch = std::make_unique<PeerWatch>(&through, o);
  for (const std::string id : {"2", "3"}) ASSERT_TRUE(kv_->Set("hosts/" + id, "1|host " + id).ok());
  AwaitJoined("1");
  const auto cut = std::chrono::steady_clock::now();
  relay.set_silent(true);
  // Peers 2 and 3 keep beating in the store meanwhile; only host 1 is cut.
  std::optional<std::string> why;
  for (int beat = 2; !(why = watch->failure()) &&
                     std::chrono::steady_clock::now() - cut < std::chrono::seconds(30);
       ++beat) {
    for (const std::string id : {"2", "3"}) (void)kv_->Set("hosts/" + id, std::to_string(beat) + "|host " + id);
    std::this_thread::sleep_for(milliseconds(100));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("lost the KV store at " + relay.endpoint()), std::string::npos) << *why;
  EXPECT_LT(seconds, 10.0);
  EXPECT_GE(seconds, 5.0) << "before the peer timeout";
  std::printf("a silently cut store was named after %.1f s\n", seconds);
  watch.reset();
}

// A peer that marks itself stopped without a failure marker (it lost the
// store in a short network cut and its last write got through after it):
// the job fails at once naming it; under --max_restart a fleetrun started
// there again may rejoin first, else the job fails after the wait. (The
// others used to stop watching it and hang.)
TEST_F(PeerWatchTest, APeerThatStoppedWithoutAMarkerFailsOrIsAwaited) {
  for (const bool rejoin : {false, true}) {
    SCOPED_TRACE(rejoin);
    ASSERT_TRUE(kv_->Set("hosts/2", "1|host 2").ok());
    PeerWatchOptions o;
    if (rejoin) o.rejoin_timeout = milliseconds(800);
    auto a = Watch("1", {"2"}, o);
    AwaitJoined("1");
    std::this_thread::sleep_for(milliseconds(100));  // a has seen 2 beat
    const auto stopped = std::chrono::steady_clock::now();
    ASSERT_TRUE(kv_->Set("hosts/2", "stopped|host 2 (worker 1)").ok());
    const std::string why = FailureOf(*a);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    EXPECT_NE(why.find("host 2 (worker 1) stopped without the job finishing"), std::string::npos)
        << why;
    if (rejoin) {
      EXPECT_NE(why.find("no fleetrun rejoined for it within 0.8 s"), std::string::npos) << why;
      EXPECT_GE(seconds, 0.75);
    } else {
      EXPECT_LT(seconds, 0.9) << "not at once";
    }
    a.reset();
    ASSERT_TRUE(kv_->Delete("hosts/1").ok());
    ASSERT_TRUE(kv_->Delete("job/failed").ok());
  }
}

// Under fleetrun --max_restart: a peer that stops beating is waited for up
// to rejoin_timeout (saying so), a fleetrun that beats for it again takes
// its place, and one that never comes fails the job naming the wait.
TEST_F(PeerWatchTest, APeerMayRejoinWithinTheRejoinTimeout) {
  Notes notes;
  PeerWatchOptions rejoin;
  rejoin.rejoin_timeout = milliseconds(1500);
  rejoin.note = notes.Sink();
  auto seen = [&notes](const std::string& text) { return notes.Seen(text); };
  auto a = Watch("1", {"2"}, rejoin);
  auto b = Watch("2", {"1"});
  b->SetProcesses("worker 1");
  AwaitJoined("2");
  std::this_thread::sleep_for(milliseconds(100));
  b.reset();  // killed: no end marked
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!seen("waiting up to 1.5 s for a fleetrun started there again to rejoin") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(seen("host 2 (worker 1) stopped: no heartbeat for"));
  EXPECT_EQ(a->failure(), std::nullopt);
  auto b2 = Watch("2", {"1"});
  b2->SetProcesses("worker 1");
  while (!seen("host 2 (worker 1) rejoined the job after") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_TRUE(seen("host 2 (worker 1) rejoined the job after"));
  std::this_thread::sleep_for(milliseconds(1500));  // past the first wait's end
  EXPECT_EQ(a->failure(), std::nullopt);
  // Gone for good: the job fails after peer_timeout + rejoin_timeout.
  b2.reset();
  const std::string why = FailureOf(*a);
  EXPECT_NE(why.find("host 2 (worker 1) stopped: no heartbeat for"), std::string::npos) << why;
  EXPECT_NE(why.find("no fleetrun rejoined for it within 1.5 s"), std::string::npos) << why;
}

// Under --max_restart, beats of the old fleetrun after it was judged gone
// make a rejoin only when its sender had the store's answer lately: beats
// it wrote while cut off (their quiet time grows), which TCP delivered after
// the cut, perhaps after that fleetrun gave up and exited, do not. (They
// did: two of them counted as a rejoin, and the job failed a whole wait
// later.)
class OldFleetrunTest : public PeerWatchTest, public ::testing::WithParamInterface<bool> {};

TEST_P(OldFleetrunTest, RejoinsOnlyByBeatsWrittenWithTheStoresAnswer) {
  {
    const bool back = GetParam();
    Notes notes;
    PeerWatchOptions rejoin;
    rejoin.rejoin_timeout = milliseconds(1500);
    rejoin.note = notes.Sink();
    auto seen = [&notes](const std::string& text) { return notes.Seen(text); };
    const std::string peer = "2";
    const std::string key = "hosts/" + peer;
    auto a = Watch("1", {peer}, rejoin);
    // The peer's fleetrun (incarnation "cafe", beats every 20 ms) beats,
    // then goes silent.
    ASSERT_TRUE(kv_->Set(key, "cafe.1.20|host " + peer).ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!seen("waiting up to 1.5 s") && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    ASSERT_TRUE(seen("waiting up to 1.5 s")) << a->failure().value_or("");
    // Its beats of the cut arrive, older ones too, their quiet time grown.
    for (const char* late : {"cafe.3.1060", "cafe.2.40", "cafe.4.2080", "cafe.5.3100"}) {
      ASSERT_TRUE(kv_->Set(key, std::string(late) + "|host " + peer).ok());
      std::this_thread::sleep_for(milliseconds(100));  // each seen by a round
    }
    if (!back) {
      const std::string why = FailureOf(*a);
      EXPECT_FALSE(seen("rejoined the job")) << "late beats counted as a rejoin";
      EXPECT_NE(why.find("no fleetrun rejoined for it within 1.5 s"), std::string::npos) << why;
      return;
    }
    // The store answered its last beat: the next one says so.
    ASSERT_TRUE(kv_->Set(key, "cafe.6.25|host " + peer).ok());
    while (!seen("host 2 rejoined the job after") && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    EXPECT_TRUE(seen("host 2 rejoined the job after"));
    EXPECT_EQ(a->failure(), std::nullopt);
    ASSERT_TRUE(kv_->Set(key, "done|host " + peer).ok());
  }
}
INSTANTIATE_TEST_SUITE_P(CutOff, OldFleetrunTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "BackFromTheCut" : "ItsBeatsDeliveredLate";
                         });

// A machine named under two addresses in the job beats under both, so the
// others never wait for the second one to join.
TEST_F(PeerWatchTest, AHostUnderTwoIdsBeatsUnderBoth) {
  PeerWatchOptions short_join;
  short_join.join_timeout = milliseconds(300);
  auto a = Watch("1", {"2", "3"}, short_join);
  PeerWatchOptions two;
  two.also_ids = {"3"};
  auto b = Watch("2", {"1"}, two);
  std::this_thread::sleep_for(milliseconds(600));  // twice the join timeout
  EXPECT_EQ(a->failure(), std::nullopt);
  EXPECT_NE(ValueOf("hosts/3"), "");
}

}  // namespace
}  // namespace fleet::launch
