// fleetrun's job secret: where it comes from (file, environment, made fresh
// for a job on one machine, refused for a multi-machine job without one),
// how it reaches the processes (environment only, never a flag), --auth=off,
// and the real fleetrun refusing a secret file others can read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "launch/job_secret.h"
#include "launch/launcher.h"
#include "tests/child_process.h"
#include "tests/test_paths.h"


namespace fleet::launch {
namespace {

namespace fs = std::filesystem;

const std::string kSecret = "0123456789abcdef0123456789abcdef-launch-test";

class JobSecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fleet_job_secret_" + std::to_string(getpid()));
    fs::create_directories(dir_ / "bin");
    for (const char* name : {"ps_server", "ps_worker", "heter_worker"}) {
      const fs::path p = dir_ / "bin" / name;
      std::ofstream(p) << "#!/bin/sh\n";
      fs::permissions(p, fs::perms::owner_all);
    }
    config_ = (dir_ / "job.yaml").string();
    std::ofstream(config_) << "tables: []\n";
    secret_file_ = (dir_ / "secret").string();
    std::ofstream(secret_file_) << kSecret << "\n";
    machine_.local_addresses = {"127.0.0.1", "10.0.0.1"};
    machine_.self_dir = (dir_ / "bin").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Lays the job out and loads its secret; the error's message otherwise.
  Result<JobLayout> Load(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.push_back("--config=" + config_);
    auto options = ParseLaunchArgs(args);
    if (!options.ok()) return options.status();
    FLEET_ASSIGN_OR_RETURN(JobLayout job, ResolveLayout(*options, machine_));
    auto source = LoadJobSecret(*options, EnvFromMap(env), job);
    if (!source.ok()) return source.status();
    return job;
  }

  static std::string EnvOf(const ProcessSpec& spec, const std::string& name) {
    for (const auto& [k, v] : spec.env) {
      if (k == name) return v;
    }
    return "(absent)";
  }
  // No argument carries the secret (flags show in `ps`).
  static bool ArgvHolds(const ProcessSpec& spec, const std::string& text) {
    for (const std::string& a : spec.argv) {
      if (a.find(text) != std::string::npos) return true;
    }
    return false;
  }

  fs::path dir_;
  std::string config_, secret_file_;
  MachineInfo machine_;
};

TEST_F(JobSecretTest, SimulationGetsAFreshSecretInTheEnvironmentOnly) {
  auto a = Load({"--server_num=1", "--worker_num=2"});
  auto b = Load({"--server_num=1", "--worker_num=2"});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->job_secret.size(), 64u);
  EXPECT_NE(a->job_secret, b->job_secret);
  ASSERT_NE(a->credentials, nullptr);
  for (Role role : {Role::kServer, Role::kWorker}) {
    ProcessSpec spec = RenderProcess(*a, role, 0);
    EXPECT_EQ(EnvOf(spec, "FLEET_JOB_SECRET"), a->job_secret);
    EXPECT_EQ(EnvOf(spec, "FLEET_AUTH"), "on");
    EXPECT_FALSE(ArgvHolds(spec, a->job_secret));
    EXPECT_FALSE(ArgvHolds(spec, "--job_secret"));
  }
}

TEST_F(JobSecretTest, FileThenEnvironmentAreUsedAsGiven) {
  ASSERT_EQ(chmod(secret_file_.c_str(), 0600), 0);
  auto from_file = Load({"--server_num=1", "--worker_num=1", "--job_secret_file=" + secret_file_},
                        {{"FLEET_JOB_SECRET", "ignored-because-a-file-was-given-xxxxxxxx"}});
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(EnvOf(RenderProcess(*from_file, Role::kServer, 0), "FLEET_JOB_SECRET"), kSecret + "\n");
  auto from_env = Load({"--server_num=1", "--worker_num=1"}, {{"FLEET_JOB_SECRET", kSecret}});
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->job_secret, kSecret);
  EXPECT_EQ(from_env->credentials->kv_key(), from_file->credentials->kv_key());
}

TEST_F(JobSecretTest, ReadableByOthersOrShortSecretIsRefused) {
  ASSERT_EQ(chmod(secret_file_.c_str(), 0644), 0);
  auto job = Load({"--server_num=1", "--worker_num=1", "--job_secret_file=" + secret_file_});
  ASSERT_TRUE(job.status().IsInvalidArgument());
  EXPECT_TRUE(job.status().message().starts_with("--job_secret_file")) << job.status().message();
  EXPECT_NE(job.status().message().find("chmod 600"), std::string::npos);
  auto short_env = Load({"--server_num=1", "--worker_num=1"}, {{"FLEET_JOB_SECRET", "short"}});
  EXPECT_TRUE(short_env.status().IsInvalidArgument());
}

TEST_F(JobSecretTest, MultiMachineJobNeedsAGivenSecret) {
  const std::vector<std::string> cluster = {"--servers=10.0.0.1:7000,10.0.0.2:7000",
                                            "--workers=10.0.0.1,10.0.0.2"};
  auto none = Load(cluster);
  ASSERT_TRUE(none.status().IsInvalidArgument());
  EXPECT_TRUE(none.status().message().starts_with("--job_secret_file")) << none.status().message();
  EXPECT_NE(none.status().message().find("chmod 600"), std::string::npos);
  auto given = Load(cluster, {{"FLEET_JOB_SECRET", kSecret}});
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  // All on loopback is one machine: a fresh secret is fine.
  EXPECT_TRUE(Load({"--servers=127.0.0.1:7000", "--workers=127.0.0.1"}).ok());
}

TEST_F(JobSecretTest, AuthOffPassesFleetAuthOffAndNoSecret) {
  auto job = Load({"--server_num=1", "--worker_num=1", "--auth=off"}, {{"FLEET_JOB_SECRET", kSecret}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->credentials, nullptr);
  ProcessSpec spec = RenderProcess(*job, Role::kServer, 0);
  EXPECT_EQ(EnvOf(spec, "FLEET_AUTH"), "off");
  EXPECT_EQ(EnvOf(spec, "FLEET_JOB_SECRET"), "(absent)");
  EXPECT_TRUE(ArgvHolds(spec, "--auth=off"));
  EXPECT_TRUE(Load({"--server_num=1", "--worker_num=1", "--auth=maybe"}).status().IsInvalidArgument());
  EXPECT_TRUE(Load({"--server_num=1", "--worker_num=1", "--auth=off", "--job_secret_file=" + secret_file_})
                  .status()
                  .IsInvalidArgument());
}

TEST_F(JobSecretTest, RealFleetrunRefusesAWorldReadableSecretFile) {
  ASSERT_EQ(chmod(secret_file_.c_str(), 0604), 0);
  const std::string err = (dir_ / "err").string();
  std::vector<std::string> args = {fleet::testing::BinPath("fleetrun"), "--server_num=1",
                                   "--worker_num=1", "--http_port=0", "--config=" + config_,
                                   "--bin_dir=" + (dir_ / "bin").string(),
                                   "--log_dir=" + (dir_ / "log").string(),
                                   "--job_secret_file=" + secret_file_};
  fleet::testing::Child fleetrun(
      args, fleet::testing::ChildOptions{.stdout_file = "/dev/null", .stderr_file = err, .file_mode = 0600});
  const fleet::testing::Exit exit = fleetrun.Wait(std::chrono::seconds(60));
  ASSERT_TRUE(exit.exited);
  EXPECT_EQ(exit.code, kExitBadFlags);
  std::stringstream text;
  text << std::ifstream(err).rdbuf();
  EXPECT_NE(text.str().find("--job_secret_file"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("chmod 600"), std::string::npos) << text.str();
  EXPECT_EQ(text.str().find(kSecret), std::string::npos);
}

}  // namespace
}  // namespace fleet::launch
