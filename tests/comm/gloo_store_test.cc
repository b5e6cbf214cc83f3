#include "comm/gloo_store.h"

#include <chrono>

#include <gtest/gtest.h>

#include "tests/comm/collective_test_util.h"

namespace fleet {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using fleet::testing::LocalKvServer;
using fleet::testing::UniqueJob;

TEST(GlooStoreTest, TimedWaitIsHonouredAndThrowsGlooIoException) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  GlooStore store(*client, "group_a", std::chrono::seconds(30));
  // Through the base class, as gloo calls it.
  gloo::rendezvous::Store& base = store;
  auto start = Clock::now();
  try {
    base.wait({"missing"}, milliseconds(200));
    FAIL() << "wait for a missing key returned";
  } catch (const StoreException& e) {
    EXPECT_TRUE(e.status().IsTimeout()) << e.status().ToString();
    EXPECT_NE(std::string(e.what()).find("group_a/missing"), std::string::npos) << e.what();
  }
  auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  EXPECT_LT(took.count(), 1000);
  // What gloo itself catches.
  EXPECT_THROW(base.wait({"missing"}, milliseconds(50)), gloo::IoException);
}

TEST(GlooStoreTest, PrefixesKeysAndKeepsGroupsApart) {
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  GlooStore a(*client, "gloo/a", milliseconds(200));
  GlooStore b(*client, "gloo/b", milliseconds(200));
  const std::vector<char> bytes = {'x', '\0', 'y'};
  a.set("0", bytes);
  EXPECT_EQ(a.get("0"), bytes);
  EXPECT_EQ(*client->Get("gloo/a/0"), std::string("x\0y", 3));
  EXPECT_THROW(b.get("0"), gloo::IoException);
  EXPECT_THROW(b.wait({"0"}), gloo::IoException);
  a.wait({"0"});
}

TEST(GlooStoreTest, UnreachableServerThrowsUnavailable) {
  auto kv = std::make_unique<LocalKvServer>();
  auto client = kv->Client(UniqueJob());
  kv.reset();
  GlooStore store(*client, "p", milliseconds(200));
  try {
    store.set("k", {'1'});
    FAIL() << "set on a stopped server returned";
  } catch (const StoreException& e) {
    EXPECT_TRUE(e.status().IsUnavailable()) << e.status().ToString();
  }
}

}  // namespace
}  // namespace fleet
