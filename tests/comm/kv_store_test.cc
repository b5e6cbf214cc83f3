#include "comm/kv_store.h"

#include <chrono>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/child_process.h"
#include "tests/comm/collective_test_util.h"
#include "tests/raw_connection.h"
#include "tests/tcp_relay.h"

namespace fleet {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using fleet::testing::LocalKvServer;
using fleet::testing::UniqueJob;

milliseconds Since(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t);
}

// Many ranks (or strangers) connecting at once are queued by the kernel
// instead of dropped into SYN retries of 1, 3, 7 s: the listen backlog is
// the system's, not httplib's 5. ss shows a listener's backlog as Send-Q.
TEST(KvStoreTest, TheListenBacklogHoldsARendezvousOfManyRanks) {
  if (fleet::testing::RunCommand("command -v ss").exit_code != 0) {
    GTEST_SKIP() << "skipped: ss (iproute2) is missing";
  }
  KvStoreServer server(KvStoreServerOptions{});
  ASSERT_TRUE(server.Start().ok());
  const auto ss =
      fleet::testing::RunCommand("ss -ltnH 'sport = :" + std::to_string(server.port()) + "'");
  ASSERT_EQ(ss.exit_code, 0) << ss.output;
  std::istringstream fields(ss.output);
  std::string state;
  int queued = -1, backlog = -1;
  fields >> state >> queued >> backlog;
  EXPECT_EQ(state, "LISTEN") << ss.output;
  EXPECT_GE(backlog, 128) << ss.output;
}

TEST(KvStoreTest, SetGetOverwriteDelete) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  // Keys with '/', spaces and URL metacharacters; values with NUL bytes.
  for (std::string key : {"plain", "a/b/c", "with space", "q?x=1&y=%2F#frag", "/lead"}) {
    std::string value = std::string("v\0", 2) + key;
    ASSERT_TRUE(client->Set(key, value).ok()) << key;
    auto got = client->Get(key);
    ASSERT_TRUE(got.ok()) << key << " " << got.status().ToString();
    EXPECT_EQ(*got, value) << key;
    ASSERT_TRUE(client->Set(key, "second").ok());
    EXPECT_EQ(*client->Get(key), "second");
    EXPECT_TRUE(client->Delete(key).ok()) << key;
    EXPECT_TRUE(client->Get(key).status().IsNotFound()) << key;
    EXPECT_TRUE(client->Delete(key).IsNotFound()) << key;
  }
}

TEST(KvStoreTest, LongPollIsWokenBySetFromAnotherThread) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  auto waiter = kv.Client(job);
  auto setter = kv.Client(job);
  std::thread t([&] {
    std::this_thread::sleep_for(milliseconds(150));
    EXPECT_TRUE(setter->Set("late/key", "here").ok());
  });
  auto start = Clock::now();
  auto got = waiter->WaitGet("late/key", std::chrono::seconds(20));
  t.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "here");
  // Woken by the set, not by re-polling at the end of a slice.
  EXPECT_LT(Since(start).count(), 1500);
}

TEST(KvStoreTest, WaitTimeoutNamesTheMissingKeysAndTheTime) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  ASSERT_TRUE(client->Set("present", "1").ok());
  auto start = Clock::now();
  Status st = client->Wait({"present", "missing/one", "missing/two"}, milliseconds(200));
  auto took = Since(start);
  ASSERT_TRUE(st.IsTimeout()) << st.ToString();
  EXPECT_NE(st.message().find("missing/one"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("missing/two"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("present"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("200 ms"), std::string::npos) << st.message();
  EXPECT_GE(took.count(), 190);
  EXPECT_LT(took.count(), 1500);
}

TEST(KvStoreTest, WaitWithZeroTimeoutIsAProbe) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  ASSERT_TRUE(client->Set("k", "v").ok());
  EXPECT_TRUE(client->Wait({"k"}, milliseconds(0)).ok());
  EXPECT_TRUE(client->Wait({"absent"}, milliseconds(0)).IsTimeout());
}

TEST(KvStoreTest, ListByPrefixIsSortedAndScoped) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  for (std::string key : {"x/2", "x/1", "xy", "y/1"}) ASSERT_TRUE(client->Set(key, "").ok());
  auto xs = client->List("x/");
  ASSERT_TRUE(xs.ok()) << xs.status().ToString();
  EXPECT_EQ(*xs, (std::vector<std::string>{"x/1", "x/2"}));
  EXPECT_EQ(*client->List(""), (std::vector<std::string>{"x/1", "x/2", "xy", "y/1"}));
  EXPECT_TRUE(client->List("zzz")->empty());
}

TEST(KvStoreTest, AddFromManyThreadsIsExactAndHandsOutDistinctRanks) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  constexpr int kThreads = 8, kPerThread = 40;
  std::mutex mu;
  std::set<int64_t> seen;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto client = kv.Client(job);
      for (int i = 0; i < kPerThread; ++i) {
        auto v = client->Add("rank_counter", 1);
        ASSERT_TRUE(v.ok()) << v.status().ToString();
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(seen.insert(*v).second) << "value handed out twice: " << *v;
      }
    });
  }
  for (auto& t : threads) t.join();
  auto client = kv.Client(job);
  EXPECT_EQ(*client->Add("rank_counter", 0), kThreads * kPerThread);
  EXPECT_EQ(seen.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(*seen.begin(), 1);
  EXPECT_EQ(*client->Add("rank_counter", -5), kThreads * kPerThread - 5);
}

TEST(KvStoreTest, AddOnANonIntegerValueFails) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  ASSERT_TRUE(client->Set("text", "hello").ok());
  auto v = client->Add("text", 1);
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition) << v.status().ToString();
  EXPECT_EQ(*client->Get("text"), "hello");
}

TEST(KvStoreTest, JobsDoNotShareKeys) {
  LocalKvServer kv;
  auto a = kv.Client(UniqueJob());
  auto b = kv.Client(UniqueJob());
  ASSERT_TRUE(a->Set("shared/name", "from a").ok());
  EXPECT_TRUE(b->Get("shared/name").status().IsNotFound());
  EXPECT_TRUE(b->List("")->empty());
  EXPECT_TRUE(b->Wait({"shared/name"}, milliseconds(50)).IsTimeout());
  ASSERT_TRUE(b->Set("shared/name", "from b").ok());
  EXPECT_EQ(*a->Get("shared/name"), "from a");
}

TEST(KvStoreTest, PortInUseGivesUnavailableNamingTheAddress) {
  LocalKvServer kv;
  const std::string taken = kv.endpoint();
  KvStoreServer second(KvStoreServerOptions{.listen = taken});
  Status st = second.Start();
  EXPECT_TRUE(st.IsUnavailable()) << st.ToString();
  EXPECT_NE(st.message().find(taken), std::string::npos) << st.message();
}

TEST(KvStoreTest, MalformedAddressesAndKeysAreInvalidArgument) {
  KvStoreServer bad(KvStoreServerOptions{.listen = "127.0.0.1:99999"});
  EXPECT_TRUE(bad.Start().IsInvalidArgument());
  KvStoreClient client("no-port", "job");
  EXPECT_TRUE(client.Set("k", "v").IsInvalidArgument());
  LocalKvServer kv;
  auto ok_client = kv.Client(UniqueJob());
  EXPECT_TRUE(ok_client->Set("", "v").IsInvalidArgument());
  EXPECT_TRUE(ok_client->Set("a\nb", "v").IsInvalidArgument());
  KvStoreClient slash_job(kv.endpoint(), "a/b");
  EXPECT_TRUE(slash_job.Set("k", "v").IsInvalidArgument());
}

TEST(KvStoreTest, StopWakesLongPollsAndLaterCallsFailFast) {
  auto kv = std::make_unique<LocalKvServer>();
  auto client = kv->Client(UniqueJob());
  Status wait_status;
  auto start = Clock::now();
  std::thread t([&] { wait_status = client->Wait({"never"}, std::chrono::seconds(30)); });
  std::this_thread::sleep_for(milliseconds(150));
  kv->server().Stop();
  t.join();
  EXPECT_TRUE(wait_status.IsUnavailable()) << wait_status.ToString();
  EXPECT_LT(Since(start).count(), 3000);
  const std::string endpoint = kv->endpoint();
  kv.reset();
  auto after = Clock::now();
  auto got = client->Get("k");
  EXPECT_TRUE(got.status().IsUnavailable()) << got.status().ToString();
  EXPECT_NE(got.status().message().find(endpoint), std::string::npos) << got.status().message();
  EXPECT_TRUE(client->Wait({"k"}, std::chrono::seconds(30)).IsUnavailable());
  EXPECT_LT(Since(after).count(), 1000);
}

// A client given a source address connects from it, so the server sees
// (and reports a refusal under) that address, not the kernel's choice: a
// machine with several addresses is known by the one its job names.
TEST(KvStoreTest, RequestsComeFromTheSourceAddressGiven) {
  auto auth = JobAuth::FromSecret("0123456789abcdef0123456789abcdef-kv-source", "test");
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  std::mutex mu;
  std::vector<std::string> refused;
  KvStoreServer server(KvStoreServerOptions{
      .listen = "127.0.0.1:0",
      .auth = *auth,
      .on_refused = [&](const std::string& address, const std::string&) {
        std::lock_guard<std::mutex> lock(mu);
        refused.push_back(address);
      }});
  ASSERT_TRUE(server.Start().ok());
  // No credential: refused (401), and told under the address it came from.
  for (const std::string source : {"", "127.0.0.2"}) {
    KvStoreClient client(server.endpoint(), UniqueJob(),
                         KvStoreClientOptions{.source_address = source});
    EXPECT_EQ(client.Get("k").status().code(), StatusCode::kFailedPrecondition);
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(refused, (std::vector<std::string>{"127.0.0.1", "127.0.0.2"}));
}

// A request whose connection is reset (a server failing under load) is
// tried again and succeeds; a delete or add retried after its answer was
// lost is done once (the server answers the retry from memory).
TEST(KvStoreTest, TransientFailuresAreRetriedAndChangesAreMadeOnce) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  {
    fleet::testing::TcpRelay relay(kv.server().port(), /*resets=*/2);
    KvStoreClient client(relay.endpoint(), job);
    ASSERT_TRUE(client.Set("k", "v").ok());
    EXPECT_EQ(relay.accepted(), 3) << "two resets, then served";
    EXPECT_EQ(*kv.Client(job)->Get("k"), "v");
  }
  // The same add twice by id (a retry after a lost answer): one change,
  // the same answer.
  for (int i = 0; i < 2; ++i) {
    fleet::testing::RawConnection raw(kv.server().port());
    ASSERT_TRUE(raw.Send("POST /add/" + job + "/n?id=0123abcd HTTP/1.1\r\nHost: x\r\n" +
                         "Content-Length: 5\r\nConnection: close\r\n\r\n" + "12345"));
    const std::string reply = raw.ReadAll();
    EXPECT_EQ(reply.substr(reply.size() - 5), "12345") << reply;
  }
  EXPECT_EQ(*kv.Client(job)->Get("n"), "12345");
  EXPECT_EQ(*kv.Client(job)->Add("n", 1), 12346) << "a new id is a new change";
}

// A request that keeps failing in transit fails once its budget is spent,
// naming the attempts and the time, never sooner.
TEST(KvStoreTest, PersistentFailuresFailAfterTheBudgetNamingTheAttempts) {
  LocalKvServer kv;
  fleet::testing::TcpRelay relay(kv.server().port(), /*resets=*/1000);
  KvStoreClient client(relay.endpoint(), UniqueJob(),
                       KvStoreClientOptions{.request_timeout = milliseconds(600)});
  const auto start = Clock::now();
  Status st = client.Set("k", "v");
  EXPECT_TRUE(st.IsUnavailable()) << st.ToString();
  EXPECT_GE(Since(start).count(), 400);
  EXPECT_LT(Since(start).count(), 1500);
  EXPECT_NE(st.message().find("attempts over"), std::string::npos) << st.message();
  EXPECT_GE(relay.accepted(), 3);
}

}  // namespace
}  // namespace fleet
