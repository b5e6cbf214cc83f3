#include "comm/cluster.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

namespace fleet {
namespace {

// Each test restores every flag it sets (gflags::FlagSaver) and passes its
// environment as a map, so nothing leaks between tests.
class ClusterSpecTest : public ::testing::Test {
 protected:
  gflags::FlagSaver saver_;

  static void SetFlag(const char* name, const char* value) {
    ASSERT_FALSE(gflags::SetCommandLineOption(name, value).empty()) << name;
  }
};

TEST_F(ClusterSpecTest, ReadsEverythingFromTheEnvironment) {
  auto spec = ClusterSpecFromFlagsAndEnv(EnvFromMap({
      {"FLEET_ROLE", "worker"},
      {"FLEET_RANK", "1"},
      {"FLEET_SERVERS", "10.0.0.1:7000,10.0.0.2:7000"},
      {"FLEET_WORKERS", "node-a:8000,node-b.cluster:8000,127.0.0.1:8001"},
      {"FLEET_HETER_WORKERS", ""},
      {"FLEET_KV_ENDPOINT", "127.0.0.1:6000"},
      {"FLEET_JOB_ID", "ctr_run.7"},
      {"FLEET_DEVICE", "gpu:1"},
      {"FLEET_LOG_DIR", "/tmp/logs"},
      {"FLEET_RESTART_GENERATION", "2"},
  }));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->role, Role::kWorker);
  EXPECT_EQ(spec->rank, 1);
  EXPECT_EQ(spec->world_size, 3);  // derived from FLEET_WORKERS
  ASSERT_EQ(spec->servers.size(), 2u);
  EXPECT_EQ(spec->servers[1], (Endpoint{"10.0.0.2", 7000}));
  EXPECT_EQ(spec->workers[1], (Endpoint{"node-b.cluster", 8000}));
  EXPECT_TRUE(spec->heter_workers.empty());
  ASSERT_TRUE(spec->kv_endpoint.has_value());
  EXPECT_EQ(spec->kv_endpoint->port, 6000);
  EXPECT_EQ(spec->job_id, "ctr_run.7");
  EXPECT_EQ(spec->device, "gpu:1");
  EXPECT_EQ(spec->log_dir, "/tmp/logs");
  EXPECT_EQ(spec->restart_generation, 2);
  EXPECT_EQ(&spec->RoleEndpoints(), &spec->workers);
}

TEST_F(ClusterSpecTest, CommandLineFlagWinsOverEnvironment) {
  SetFlag("role", "server");
  SetFlag("rank", "0");
  SetFlag("servers", "127.0.0.1:7100");
  auto spec = ClusterSpecFromFlagsAndEnv(EnvFromMap({
      {"FLEET_ROLE", "worker"},
      {"FLEET_RANK", "5"},
      {"FLEET_SERVERS", "127.0.0.1:1,127.0.0.1:2"},
  }));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->role, Role::kServer);
  EXPECT_EQ(spec->rank, 0);
  EXPECT_EQ(spec->world_size, 1);
  EXPECT_EQ(JoinEndpoints(spec->servers), "127.0.0.1:7100");
  EXPECT_EQ(spec->job_id, "default");
  EXPECT_EQ(spec->device, "cpu");
}

TEST_F(ClusterSpecTest, MissingRoleIsInvalidArgument) {
  auto spec = ClusterSpecFromFlagsAndEnv(EnvFromMap({}));
  EXPECT_TRUE(spec.status().IsInvalidArgument());
  EXPECT_NE(spec.status().message().find("FLEET_ROLE"), std::string::npos);
}

// Each bad value is rejected with a message naming where it came from and
// the offending text.
TEST_F(ClusterSpecTest, BadValuesNameTheirSourceAndText) {
  struct Case {
    std::string var, value, expect_in_message;
  };
  const std::vector<Case> cases = {
      {"FLEET_ROLE", "boss", "'boss'"},
      {"FLEET_RANK", "one", "FLEET_RANK"},
      {"FLEET_RANK", "-1", "FLEET_RANK"},
      {"FLEET_RANK", "7", "rank 7"},
      {"FLEET_WORLD_SIZE", "2x", "FLEET_WORLD_SIZE"},
      {"FLEET_WORLD_SIZE", "5", "5 but 2 endpoints"},
      {"FLEET_WORKERS", "127.0.0.1:1,,127.0.0.1:2", "FLEET_WORKERS"},
      {"FLEET_SERVERS", "127.0.0.1", "missing ':port'"},
      {"FLEET_WORKERS", "127.0.0.1:", "missing port"},
      {"FLEET_WORKERS", "127.0.0.1:70000", "port out of range"},
      {"FLEET_WORKERS", "127.0.0.1:80a", "not a number"},
      {"FLEET_WORKERS", "300.1.1.1:80", "'300.1.1.1:80'"},
      {"FLEET_WORKERS", "1.2.3:80", "4 parts"},
      {"FLEET_WORKERS", "bad_host:80", "not allowed"},
      {"FLEET_WORKERS", "-host:80", "'-host:80'"},
      {"FLEET_WORKERS", "a:1,a:1", "listed twice"},
      {"FLEET_SERVERS", "x:1,", "FLEET_SERVERS"},
      {"FLEET_HETER_WORKERS", ":9", "empty host"},
      {"FLEET_KV_ENDPOINT", "localhost", "FLEET_KV_ENDPOINT"},
      {"FLEET_JOB_ID", "a/b", "FLEET_JOB_ID"},
      {"FLEET_DEVICE", "tpu", "'tpu'"},
      {"FLEET_DEVICE", "gpu:", "FLEET_DEVICE"},
      {"FLEET_RESTART_GENERATION", "-1", "FLEET_RESTART_GENERATION"},
      {"FLEET_RESTART_GENERATION", "x", "'x'"},
  };
  for (const Case& c : cases) {
    std::map<std::string, std::string> env = {{"FLEET_ROLE", "worker"},
                                              {"FLEET_RANK", "0"},
                                              {"FLEET_WORKERS", "127.0.0.1:1,127.0.0.1:2"}};
    env[c.var] = c.value;
    auto spec = ClusterSpecFromFlagsAndEnv(EnvFromMap(env));
    EXPECT_TRUE(spec.status().IsInvalidArgument()) << c.var << "=" << c.value << " gave "
                                                   << spec.status().ToString();
    EXPECT_NE(spec.status().message().find(c.expect_in_message), std::string::npos)
        << c.var << "=" << c.value << ": " << spec.status().message();
  }
}

// By hand, the programs take what fleetrun takes: a bare ip in --workers,
// and a server's rank from the position of its --endpoint in --servers.
TEST_F(ClusterSpecTest, ByHandFlagsMeanWhatFleetrunsMean) {
  auto worker = ClusterSpecFromFlagsAndEnv(EnvFromMap(
      {{"FLEET_ROLE", "worker"}, {"FLEET_RANK", "1"}, {"FLEET_WORKERS", "10.0.0.1,10.0.0.2"}}));
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_EQ(JoinEndpoints(worker->workers), "10.0.0.1:0,10.0.0.2:0");
  EXPECT_EQ(worker->world_size, 2);

  const std::string servers = "10.0.0.1:6170,10.0.0.2:6170,10.0.0.2:6171";
  auto server = ClusterSpecFromFlagsAndEnv(EnvFromMap(
      {{"FLEET_ROLE", "server"}, {"FLEET_SERVERS", servers}, {"FLEET_ENDPOINT", "10.0.0.2:6171"}}));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(server->rank, 2);
  // A given rank wins.
  auto given = ClusterSpecFromFlagsAndEnv(EnvFromMap({{"FLEET_ROLE", "server"},
                                                      {"FLEET_RANK", "0"},
                                                      {"FLEET_SERVERS", servers},
                                                      {"FLEET_ENDPOINT", "10.0.0.2:6171"}}));
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(given->rank, 0);

  auto absent = ClusterSpecFromFlagsAndEnv(EnvFromMap(
      {{"FLEET_ROLE", "server"}, {"FLEET_SERVERS", servers}, {"FLEET_ENDPOINT", "10.0.0.3:6170"}}));
  EXPECT_TRUE(absent.status().IsInvalidArgument());
  EXPECT_NE(absent.status().message().find("FLEET_ENDPOINT is not in the server list: give --rank"),
            std::string::npos)
      << absent.status().message();
  auto no_rank = ClusterSpecFromFlagsAndEnv(
      EnvFromMap({{"FLEET_ROLE", "worker"}, {"FLEET_WORKERS", "10.0.0.1,10.0.0.2"}}));
  EXPECT_TRUE(no_rank.status().IsInvalidArgument());
  EXPECT_NE(no_rank.status().message().find("give each its --rank"), std::string::npos)
      << no_rank.status().message();
}

TEST_F(ClusterSpecTest, BadFlagIsNamedAsAFlag) {
  SetFlag("servers", "10.0.0.1:7000,10.0.0.1");
  auto spec = ClusterSpecFromFlagsAndEnv(EnvFromMap({{"FLEET_ROLE", "server"}}));
  EXPECT_TRUE(spec.status().IsInvalidArgument());
  EXPECT_NE(spec.status().message().find("--servers"), std::string::npos) << spec.status().message();
  EXPECT_NE(spec.status().message().find("'10.0.0.1'"), std::string::npos) << spec.status().message();
}

// What a program started by hand makes of another launcher's variables:
// ReadLauncherEnv, then the spec with them standing in for FLEET_* ones.
Result<ClusterSpec> SpecUnderLauncher(Role role, std::map<std::string, std::string> vars) {
  const EnvLookup env = EnvFromMap(std::move(vars));
  FLEET_ASSIGN_OR_RETURN(LauncherEnv launcher, ReadLauncherEnv(role, env));
  // The program's role, as ProcessContext gives it (after ReadLauncherEnv,
  // which takes a FLEET_ROLE for fleetrun's).
  const EnvLookup with_role = [&env, role](const std::string& name) -> std::optional<std::string> {
    if (name == "FLEET_ROLE") return std::string(RoleName(role));
    return env(name);
  };
  return ClusterSpecFromFlagsAndEnv(with_role, launcher);
}

TEST_F(ClusterSpecTest, TorchrunsVariablesPlaceACollectiveRank) {
  auto spec = SpecUnderLauncher(Role::kCollective, {{"RANK", "1"},
                                                    {"WORLD_SIZE", "2"},
                                                    {"LOCAL_RANK", "1"},
                                                    {"MASTER_ADDR", "127.0.0.1"},
                                                    {"MASTER_PORT", "29511"}});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->rank, 1);
  EXPECT_EQ(spec->world_size, 2);
  ASSERT_TRUE(spec->kv_endpoint.has_value());
  EXPECT_EQ(spec->kv_endpoint->ToString(), "127.0.0.1:29511");
  // The start-up line says where the place came from.
  EXPECT_NE(spec->ToString().find("(from torchrun's RANK=1 WORLD_SIZE=2"), std::string::npos)
      << spec->ToString();
}

// torchrun's agent holds MASTER_PORT with its own store (it says so in
// TORCHELASTIC_USE_AGENT_STORE): the job's store takes the next port.
TEST_F(ClusterSpecTest, UnderTorchrunsAgentStoreTheJobsStoreTakesTheNextPort) {
  auto spec = SpecUnderLauncher(Role::kCollective, {{"RANK", "0"},
                                                    {"WORLD_SIZE", "2"},
                                                    {"MASTER_ADDR", "127.0.0.1"},
                                                    {"MASTER_PORT", "29511"},
                                                    {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(spec->kv_endpoint.has_value());
  EXPECT_EQ(spec->kv_endpoint->ToString(), "127.0.0.1:29512");
  auto launcher =
      ReadLauncherEnv(Role::kCollective, EnvFromMap({{"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", "29511"},
                                                     {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  ASSERT_TRUE(launcher.ok()) << launcher.status().ToString();
  EXPECT_EQ(launcher->host_kv_store, "127.0.0.1:29512");
  EXPECT_EQ(launcher->values.at("FLEET_KV_ENDPOINT").second, "MASTER_ADDR:MASTER_PORT+1");
  auto last_port =
      ReadLauncherEnv(Role::kCollective, EnvFromMap({{"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", "65535"},
                                                     {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  ASSERT_FALSE(last_port.ok());
  EXPECT_NE(last_port.status().ToString().find("MASTER_PORT below 65535"), std::string::npos)
      << last_port.status().ToString();
}

TEST_F(ClusterSpecTest, FleetsOwnVariablesAndFlagsWinOverTorchruns) {
  SetFlag("rank", "0");
  auto spec = SpecUnderLauncher(Role::kCollective,
                                {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"FLEET_WORLD_SIZE", "4"}});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->rank, 0);
  EXPECT_EQ(spec->world_size, 4);
  // Under fleetrun (FLEET_KV_ENDPOINT set) torchrun's names are its own copies: not read.
  auto under_fleetrun = ReadLauncherEnv(
      Role::kCollective, EnvFromMap({{"RANK", "3"}, {"FLEET_KV_ENDPOINT", "127.0.0.1:1"}}));
  ASSERT_TRUE(under_fleetrun.ok());
  EXPECT_TRUE(under_fleetrun->values.empty());
}

TEST_F(ClusterSpecTest, PaddlesVariablesPlaceAServerAndAWorker) {
  const std::map<std::string, std::string> common = {
      {"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:6370,127.0.0.1:6371"},
      {"PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:6380,127.0.0.1:6381"}};
  auto server_env = common;
  server_env.insert(
      {{"TRAINING_ROLE", "PSERVER"}, {"POD_IP", "127.0.0.1"}, {"PADDLE_PORT", "6371"}});
  auto server = SpecUnderLauncher(Role::kServer, server_env);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(server->rank, 1);  // its POD_IP:PADDLE_PORT's place in the list
  EXPECT_EQ(server->world_size, 2);
  EXPECT_NE(server->ToString().find("(from Paddle's TRAINING_ROLE=PSERVER"), std::string::npos);

  auto worker_env = common;
  worker_env.insert({{"TRAINING_ROLE", "TRAINER"}, {"PADDLE_TRAINER_ID", "1"}});
  auto worker = SpecUnderLauncher(Role::kWorker, worker_env);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_EQ(worker->rank, 1);
  EXPECT_EQ(worker->servers.size(), 2u);
}

TEST_F(ClusterSpecTest, AnotherLaunchersContradictionIsRefusedOutLoud) {
  auto wrong_role = ReadLauncherEnv(Role::kServer, EnvFromMap({{"TRAINING_ROLE", "TRAINER"}}));
  ASSERT_FALSE(wrong_role.ok());
  EXPECT_TRUE(wrong_role.status().IsInvalidArgument());
  EXPECT_NE(wrong_role.status().ToString().find("TRAINING_ROLE=TRAINER (Paddle's) starts a worker"),
            std::string::npos)
      << wrong_role.status().ToString();
  auto half_master = ReadLauncherEnv(Role::kCollective, EnvFromMap({{"MASTER_ADDR", "10.0.0.1"}}));
  ASSERT_FALSE(half_master.ok());
  EXPECT_NE(half_master.status().ToString().find("MASTER_PORT"), std::string::npos);
  auto bad_rank = SpecUnderLauncher(Role::kCollective, {{"RANK", "one"}, {"WORLD_SIZE", "2"}});
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.status().ToString().find("RANK (torchrun's)"), std::string::npos)
      << bad_rank.status().ToString();
}

TEST(EndpointTest, ParseAndJoinRoundTrip) {
  auto list = ParseEndpointList("10.1.2.3:1,localhost:65535,a-b.c:80");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(JoinEndpoints(*list), "10.1.2.3:1,localhost:65535,a-b.c:80");
  EXPECT_TRUE(ParseEndpointList("")->empty());
  EXPECT_TRUE(ParseEndpoint("127.0.0.1:0").status().IsInvalidArgument());
  EXPECT_EQ(ParseEndpoint("127.0.0.1:0", "", EndpointParseOptions{.allow_port_zero = true})->port, 0);
  EXPECT_TRUE(ParseEndpoint("[::1]:80").status().IsInvalidArgument());
  EXPECT_TRUE(ParseEndpoint("01.2.3.4:80").status().IsInvalidArgument());
}

}  // namespace
}  // namespace fleet
