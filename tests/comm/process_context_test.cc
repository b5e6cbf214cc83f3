// ProcessContext (comm/process_context.h): how every program learns its
// role, endpoint, device, restart generation and stop requests from flags
// and FLEET_* variables, and what it says about bad input.
#include "comm/process_context.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace fleet {
namespace {

using Env = std::map<std::string, std::string>;

// Each test restores every flag it sets and passes its environment as a map.
class ProcessContextTest : public ::testing::Test {
 protected:
  gflags::FlagSaver saver_;

  static Result<std::unique_ptr<ProcessContext>> Build(Role role, Env env,
                                                       std::string endpoint_flag = "") {
    ProcessContextOptions o{.program = "test_program", .role = role};
    o.endpoint_flag = std::move(endpoint_flag);
    o.env = EnvFromMap(std::move(env));
    return ProcessContext::Create(std::move(o));
  }
  static void ExpectInvalid(const Result<std::unique_ptr<ProcessContext>>& ctx,
                            const std::string& names) {
    ASSERT_FALSE(ctx.ok());
    EXPECT_TRUE(ctx.status().IsInvalidArgument()) << ctx.status().ToString();
    EXPECT_NE(ctx.status().message().find(names), std::string::npos) << ctx.status().ToString();
  }
};

TEST_F(ProcessContextTest, TheProgramsRoleIsTheDefaultAndTheOnlyOneAccepted) {
  auto server = Build(Role::kServer, {});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->role(), Role::kServer);
  EXPECT_EQ((*server)->env()("FLEET_ROLE"), "server");
  EXPECT_EQ((*server)->program(), "test_program");

  auto collective = Build(Role::kCollective, {{"FLEET_ROLE", "collective"}});
  ASSERT_TRUE(collective.ok()) << collective.status().ToString();
  EXPECT_EQ((*collective)->role(), Role::kCollective);

  auto other = Build(Role::kServer, {{"FLEET_ROLE", "worker"}});
  ExpectInvalid(other, "test_program runs as role server only; --role / FLEET_ROLE says: worker");
  {
    gflags::FlagSaver inner;
    ASSERT_FALSE(gflags::SetCommandLineOption("role", "heter_worker").empty());
    ExpectInvalid(Build(Role::kCollective, {}), "says: heter_worker");
  }
  // A bad role is the spec's error, naming where it came from.
  ExpectInvalid(Build(Role::kWorker, {{"FLEET_ROLE", "boss"}}), "bad role in FLEET_ROLE");
}

TEST_F(ProcessContextTest, ListenEndpointIsTheFlagElseThisRanksEntryElseAFreePort) {
  const Env servers = {{"FLEET_SERVERS", "10.0.0.1:7000,10.0.0.2:7001"}, {"FLEET_RANK", "1"}};
  auto listed = Build(Role::kServer, servers);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ((*listed)->rank(), 1);
  EXPECT_EQ((*listed)->listen_endpoint(), "10.0.0.2:7001");

  auto flag = Build(Role::kServer, servers, "0.0.0.0:9000");
  ASSERT_TRUE(flag.ok()) << flag.status().ToString();
  EXPECT_EQ((*flag)->listen_endpoint(), "0.0.0.0:9000");

  auto heter = Build(Role::kHeterWorker, {{"FLEET_SERVERS", "10.0.0.1:7000"},
                                          {"FLEET_HETER_WORKERS", "10.0.0.3:7100"}});
  ASSERT_TRUE(heter.ok()) << heter.status().ToString();
  EXPECT_EQ((*heter)->listen_endpoint(), "10.0.0.3:7100");

  auto alone = Build(Role::kServer, {});
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ((*alone)->listen_endpoint(), "127.0.0.1:0");

  // A rank is found from --endpoint's place in the list when not given.
  auto by_place = Build(Role::kServer, {{"FLEET_SERVERS", "10.0.0.1:7000,10.0.0.2:7001"},
                                        {"FLEET_ENDPOINT", "10.0.0.2:7001"}});
  ASSERT_TRUE(by_place.ok()) << by_place.status().ToString();
  EXPECT_EQ((*by_place)->rank(), 1);
  EXPECT_EQ((*by_place)->listen_endpoint(), "10.0.0.2:7001");

  ExpectInvalid(Build(Role::kServer, {{"FLEET_SERVERS", "10.0.0.1:7000"}, {"FLEET_RANK", "1"}}),
                "rank out of range");
  ExpectInvalid(Build(Role::kServer, {{"FLEET_SERVERS", "10.0.0.1"}}), "FLEET_SERVERS");
}

TEST_F(ProcessContextTest, PeerEndpointsAreResolvedPerRole) {
  auto ctx = Build(Role::kWorker, {{"FLEET_SERVERS", "10.0.0.1:7000,10.0.0.2:7001"},
                                   {"FLEET_HETER_WORKERS", "10.0.0.3:7100"}});
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  auto servers = (*ctx)->PeerEndpoints(Role::kServer, std::chrono::milliseconds(100));
  ASSERT_TRUE(servers.ok()) << servers.status().ToString();
  EXPECT_EQ(*servers, (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.2:7001"}));
  auto heters = (*ctx)->PeerEndpoints(Role::kHeterWorker, std::chrono::milliseconds(100));
  ASSERT_TRUE(heters.ok()) << heters.status().ToString();
  EXPECT_EQ(*heters, (std::vector<std::string>{"10.0.0.3:7100"}));

  // Port 0 is published by its process through a KV store; there is none.
  auto unbound = Build(Role::kWorker, {{"FLEET_SERVERS", "10.0.0.1:0"}});
  ASSERT_TRUE(unbound.ok()) << unbound.status().ToString();
  auto resolved = (*unbound)->PeerEndpoints(Role::kServer, std::chrono::milliseconds(100));
  ASSERT_FALSE(resolved.ok());
  EXPECT_TRUE(resolved.status().IsInvalidArgument()) << resolved.status().ToString();
  // Without a KV store there is nothing to claim or publish.
  EXPECT_TRUE((*unbound)->Announce("10.0.0.9:7000").ok());
}

TEST_F(ProcessContextTest, DeviceIsNormalisedOnce) {
  const std::map<std::string, std::string> spellings = {
      {"cpu", "cpu"},      {"cuda", "cuda:0"},   {"gpu", "cuda:0"},
      {"gpu:3", "cuda:3"}, {"cuda:2", "cuda:2"}, {"cuda:15", "cuda:15"}};
  for (const auto& [given, canonical] : spellings) {
    SCOPED_TRACE(given);
    auto ctx = Build(Role::kCollective, {{"FLEET_DEVICE", given}});
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    EXPECT_EQ((*ctx)->device(), canonical);
    EXPECT_EQ((*ctx)->assigned_device(), canonical);
    EXPECT_EQ((*ctx)->spec().device, given);  // the spec keeps what was written
    auto direct = CanonicalDevice(given, "--device");
    ASSERT_TRUE(direct.ok()) << direct.status().ToString();
    EXPECT_EQ(*direct, canonical);
  }
  // The default is cpu, and not an assignment.
  auto unset = Build(Role::kCollective, {});
  ASSERT_TRUE(unset.ok()) << unset.status().ToString();
  EXPECT_EQ((*unset)->device(), "cpu");
  EXPECT_FALSE((*unset)->assigned_device().has_value());
  {
    gflags::FlagSaver inner;  // the flag wins over FLEET_DEVICE
    ASSERT_FALSE(gflags::SetCommandLineOption("device", "gpu").empty());
    auto flag = Build(Role::kCollective, {{"FLEET_DEVICE", "cuda:1"}});
    ASSERT_TRUE(flag.ok()) << flag.status().ToString();
    EXPECT_EQ((*flag)->assigned_device(), "cuda:0");
  }

  for (const char* bad : {"tpu", "gpu:", "cuda:1x", "cuda:1234", "CPU", "cuda:-1", ""}) {
    SCOPED_TRACE(bad);
    auto ctx = Build(Role::kCollective, {{"FLEET_DEVICE", bad}});
    ExpectInvalid(ctx, "bad FLEET_DEVICE: want cpu, cuda or cuda:N: '" + std::string(bad) + "'");
    auto direct = CanonicalDevice(bad, "--device");
    ASSERT_FALSE(direct.ok());
    EXPECT_EQ(direct.status().message(),
              "bad --device: want cpu, cuda or cuda:N: '" + std::string(bad) + "'");
  }
}

TEST_F(ProcessContextTest, RestartGenerationAndRestartComeFromFleetrunsVariables) {
  auto first = Build(Role::kWorker, {});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ((*first)->restart_generation(), 0);
  EXPECT_FALSE((*first)->restarted());

  // What fleetrun sets on a first start and on its second restart.
  auto zero = Build(Role::kWorker, {{"FLEET_RESTART_GENERATION", "0"}});
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ((*zero)->restart_generation(), 0);
  EXPECT_FALSE((*zero)->restarted());
  auto again = Build(Role::kServer, {{"FLEET_RESTART_GENERATION", "2"}, {"FLEET_RESTART", "2"}});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->restart_generation(), 2);
  EXPECT_TRUE((*again)->restarted());
  // A server restarted by hand with FLEET_RESTART alone recovers.
  auto by_hand = Build(Role::kServer, {{"FLEET_RESTART", "1"}});
  ASSERT_TRUE(by_hand.ok()) << by_hand.status().ToString();
  EXPECT_TRUE((*by_hand)->restarted());
  EXPECT_EQ((*by_hand)->restart_generation(), 0);

  for (const char* bad : {"x", "-1", "1x", ""}) {
    SCOPED_TRACE(bad);
    ExpectInvalid(Build(Role::kWorker, {{"FLEET_RESTART_GENERATION", bad}}),
                  "bad FLEET_RESTART_GENERATION: want a non-negative integer");
    ExpectInvalid(Build(Role::kServer, {{"FLEET_RESTART", bad}}),
                  "bad FLEET_RESTART: want a non-negative integer: '" + std::string(bad) + "'");
  }
}

TEST_F(ProcessContextTest, CredentialsComeFromTheSpecAndTheJobConfig) {
  auto none = Build(Role::kServer, {});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ((*none)->kv_auth(), nullptr);
  auto refused = (*none)->TransportAuthFor(/*config_auth=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no job secret"), std::string::npos);
  auto off = (*none)->TransportAuthFor(/*config_auth=*/false);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(*off, nullptr);

  auto secret = Build(Role::kServer, {{"FLEET_JOB_SECRET", std::string(40, 'k')}});
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  ASSERT_NE((*secret)->kv_auth(), nullptr);
  auto on = (*secret)->TransportAuthFor(true);
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_EQ(*on, (*secret)->kv_auth());
}

TEST_F(ProcessContextTest, StopSignalsBecomeAStopRequest) {
  std::atomic<int> seen{0};
  ProcessContextOptions o{.program = "test_program", .role = Role::kServer};
  o.env = EnvFromMap({});
  o.watch_stop_signals = true;
  o.on_stop = [&](int sig) { seen.store(sig); };
  auto ctx = ProcessContext::Create(std::move(o));
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  EXPECT_FALSE((*ctx)->WaitForStop(std::chrono::milliseconds(10)));
  EXPECT_FALSE((*ctx)->stop_requested().load());

  ASSERT_EQ(kill(getpid(), SIGINT), 0);
  ASSERT_TRUE((*ctx)->WaitForStop(std::chrono::seconds(5))) << "no stop within 5 s of SIGINT";
  EXPECT_TRUE((*ctx)->stop_requested().load());
  EXPECT_TRUE((*ctx)->ReceivedSignal(SIGINT));
  EXPECT_FALSE((*ctx)->ReceivedSignal(SIGTERM));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (seen.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(seen.load(), SIGINT);

  // Without the watcher nothing asks to stop.
  auto quiet = Build(Role::kServer, {});
  ASSERT_TRUE(quiet.ok());
  EXPECT_FALSE((*quiet)->WaitForStop(std::chrono::milliseconds(10)));
}

}  // namespace
}  // namespace fleet
