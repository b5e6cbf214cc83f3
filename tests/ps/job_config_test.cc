#include "ps/job_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fleet::ps {
namespace {

using ::testing::HasSubstr;

TEST(JobConfigTest, MaxRequestBytesDefaultsToOneMebibyteAndIsChecked) {
  auto plain = ParseJobConfig(YAML::Load("Distributed: {mode: async}"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->distributed.max_request_bytes, 1 << 20);

  auto set = ParseJobConfig(YAML::Load("Distributed: {mode: async, max_request_bytes: 0}"));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->distributed.max_request_bytes, 0);

  auto negative = ParseJobConfig(YAML::Load("Distributed: {max_request_bytes: -5}"));
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.status().ToString(), HasSubstr("Distributed.max_request_bytes"));
  EXPECT_THAT(negative.status().ToString(), HasSubstr("must be in [0, "));
}

// The message limit is derived from the job (64 MiB at least, four
// requests, the largest dense table) unless set, and a set value is checked.
TEST(JobConfigTest, MessageLimitIsDerivedFromTheJobOrSetAndChecked) {
  auto plain = ParseJobConfig(YAML::Load("Distributed: {mode: async}"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->distributed.max_message_bytes, 0);
  EXPECT_EQ(MessageLimit(*plain), int64_t{64} << 20);
  EXPECT_EQ(JobVanOptions(*plain, nullptr).max_message_bytes, int64_t{64} << 20);

  auto big = ParseJobConfig(YAML::Load(
      "Distributed: {max_request_bytes: 33554432}\n"
      "tables: [{id: 0, kind: dense, dim: 100000000}]"));
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(MessageLimit(*big), int64_t{400000000} + (1 << 20));
  big->tables.clear();
  EXPECT_EQ(MessageLimit(*big), int64_t{128} << 20);

  auto set = ParseJobConfig(YAML::Load("Distributed: {max_message_bytes: 2097152}"));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(MessageLimit(*set), 2 << 20);
  for (const char* bad : {"Distributed: {max_message_bytes: 1000}",
                          "Distributed: {max_message_bytes: 100000000000}"}) {
    auto refused = ParseJobConfig(YAML::Load(bad));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().ToString(), HasSubstr("Distributed.max_message_bytes"));
  }
}

// The sections of configs/ctr_dnn.yaml, each present: all of them are
// known, and a typo of any section or key is refused naming it.
constexpr char kFullJob[] =
    "Distributed: {mode: sync}\n"
    "server: {threads: 1}\n"
    "tables: [{id: 0, kind: sparse, dim: 9}, {id: 1, kind: dense, dim: 10}]\n"
    "model: {kind: ctr_dnn}\n"
    "data: {train: x}\n"
    "train: {epochs: 1}\n";

Status ParseWith(const std::string& override_text) {
  YAML::Node root = YAML::Load(kFullJob);
  Status s = ApplyOverride(root, override_text);
  if (!s.ok()) return s;
  return ParseJobConfig(root).status();
}

TEST(JobConfigTest, UnknownSectionsAndKeysAnywhereAreRefusedNamingThem) {
  ASSERT_TRUE(ParseWith("train.epochs=2").ok());
  for (const char* typo : {"Distribued.mode=async", "trian.epochs=5", "Server.threads=2",
                           "Distributed.mdoe=async", "server.thread=2", "tables.0.dimm=3",
                           "tables.0.optimizer.lr=1"}) {
    Status s = ParseWith(typo);
    ASSERT_FALSE(s.ok()) << typo;
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    const std::string key(typo, std::string(typo).find('='));
    const std::string last = key.substr(key.rfind('.') + 1);
    const std::string first = key.substr(0, key.find('.'));
    EXPECT_THAT(s.ToString(), ::testing::AnyOf(HasSubstr(last), HasSubstr(first))) << typo;
  }
  Status top = ParseWith("trian.epochs=5");
  EXPECT_THAT(top.ToString(), HasSubstr("unknown top-level section"));
  EXPECT_THAT(top.ToString(), HasSubstr("trian"));
}

// The file every PS process reads (LoadJobConfig) refuses a repeated key
// instead of silently keeping the first one.
TEST(JobConfigTest, DuplicateKeysInTheJobFileAreRefused) {
  const std::string path = ::testing::TempDir() + "/dup_job.yaml";
  {
    std::ofstream out(path);
    out << kFullJob << "Distributed: {mode: async}\n";
  }
  auto job = LoadJobConfig(path, {});
  ASSERT_FALSE(job.ok());
  EXPECT_TRUE(job.status().IsInvalidArgument());
  EXPECT_THAT(job.status().ToString(), HasSubstr("duplicate key Distributed at line 7"));
  EXPECT_THAT(job.status().ToString(), HasSubstr(path));
  std::remove(path.c_str());
}

// A PS job config may name a `_base_` (comm/yaml_config.h): the child's keys
// merge over the base's, and an error names the file (or -o) that set the
// key, whether in the base, the child or an override.
TEST(JobConfigTest, BaseFilesMergeAndErrorsNameTheFileOrOverrideOfTheKey) {
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) / "job_base").lexically_normal().string();
  std::filesystem::create_directories(dir);
  const std::string base = dir + "/base.yaml", child = dir + "/child.yaml";
  std::ofstream(base) << kFullJob;
  std::ofstream(child) << "_base_: base.yaml\nDistributed: {mode: geo}\nserver: {threads: 3}\n";
  auto job = LoadJobConfig(child, {"Distributed.k_steps=7"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->distributed.mode, SyncMode::kGeo);
  EXPECT_EQ(job->distributed.k_steps, 7);
  EXPECT_EQ(job->server.threads, 3);
  ASSERT_EQ(job->tables.size(), 2u);  // from the base
  EXPECT_EQ(job->tables[1].dim, 10u);
  EXPECT_EQ(job->root["train"]["epochs"].as<int>(), 1);

  // An unknown key in the base is named with the base file.
  std::ofstream(base) << kFullJob << "Distribued: {mode: async}\n";
  auto in_base = LoadJobConfig(child, {});
  ASSERT_FALSE(in_base.ok());
  EXPECT_TRUE(in_base.status().IsInvalidArgument());
  EXPECT_THAT(in_base.status().message(),
              HasSubstr("Distribued: unknown top-level section (from " + base + ")"));
  std::ofstream(base) << "Distributed: {mode: sync}\ntables: [{id: 0, kind: sparse, dim: 9, dimm: 1}]\n";
  auto table_in_base = LoadJobConfig(child, {});
  ASSERT_FALSE(table_in_base.ok());
  EXPECT_THAT(table_in_base.status().message(),
              HasSubstr("tables.0.dimm: unknown key (from " + base + ")"));

  // One in the child file is named with the child.
  std::ofstream(base) << kFullJob;
  std::ofstream(child) << "_base_: base.yaml\nserver: {thread: 3}\n";
  auto in_child = LoadJobConfig(child, {});
  ASSERT_FALSE(in_child.ok());
  EXPECT_THAT(in_child.status().message(), HasSubstr("server.thread: unknown key (from " + child + ")"));

  // One from an override is named as that override, not as a file.
  std::ofstream(child) << "_base_: base.yaml\n";
  auto from_override = LoadJobConfig(child, {"train.epochs=2", "Distributed.mdoe=async"});
  ASSERT_FALSE(from_override.ok());
  EXPECT_THAT(from_override.status().message(),
              HasSubstr("Distributed.mdoe: unknown key (from -o Distributed.mdoe=async)"));
  EXPECT_EQ(from_override.status().message().find(".yaml"), std::string::npos)
      << from_override.status().ToString();
  auto range = LoadJobConfig(child, {"server.threads=0"});
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(range.status().message(),
              HasSubstr("server.threads: must be in [1, 256], got 0 (from -o server.threads=0)"));

  // A missing base is named with the file that names it.
  std::ofstream(child) << "_base_: gone.yaml\n";
  auto missing = LoadJobConfig(child, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
  EXPECT_THAT(missing.status().message(), HasSubstr("gone.yaml"));
  EXPECT_THAT(missing.status().message(), HasSubstr(child));
  std::filesystem::remove_all(dir);
}

TEST(JobConfigTest, HugeCountsAndSizesAreRefusedNamingTheKeyAndBound) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"server.threads=100000", "server.threads"},
      {"tables.1.dim=100000000000", "1073741824"},
      {"tables.1.dim=1e11", "dim"},
      {"tables.0.dim=100000000", "1048576"},
      {"tables.0.shard_num=4000000000", "shard_num"},
      {"tables.0.local_shard_num=100000", "local_shard_num"},
      {"Distributed.timeout_ms=100000000000", "Distributed.timeout_ms"},
      {"Distributed.k_steps=1000000000000", "Distributed.k_steps"},
      {"Distributed.heter.micro_batches=1000000", "Distributed.heter.micro_batches"},
      {"Distributed.max_request_bytes=10000000000000", "Distributed.max_request_bytes"},
  };
  for (const auto& [override_text, named] : cases) {
    Status s = ParseWith(override_text);
    ASSERT_FALSE(s.ok()) << override_text;
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_THAT(s.ToString(), HasSubstr(named)) << override_text;
  }
  // The maxima themselves are accepted.
  EXPECT_TRUE(ParseWith("server.threads=256").ok());
  EXPECT_TRUE(ParseWith("tables.1.dim=1073741824").ok());
}

TEST(JobConfigTest, HeterSectionDefaultsAndChecks) {
  auto plain = ParseJobConfig(YAML::Load("Distributed: {mode: async}"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->distributed.heter.pipeline_depth, 4);
  EXPECT_EQ(plain->distributed.heter.micro_batches, 1);
  EXPECT_EQ(plain->distributed.heter.down_timeout.count(), 4000);

  auto set = ParseJobConfig(YAML::Load(
      "Distributed: {heter: {pipeline_depth: 16, micro_batches: 4, down_timeout_ms: 9000}}"));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->distributed.heter.pipeline_depth, 16);
  EXPECT_EQ(set->distributed.heter.micro_batches, 4);
  EXPECT_EQ(set->distributed.heter.down_timeout.count(), 9000);

  for (const char* bad : {"{pipeline_depth: 0}", "{micro_batches: -1}", "{down_timeout_ms: 0}",
                          "{pipeline_depth: deep}", "{depth: 3}", "7"}) {
    auto refused = ParseJobConfig(YAML::Load(std::string("Distributed: {heter: ") + bad + "}"));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().ToString(), HasSubstr("Distributed.heter")) << bad;
  }
}

TEST(JobConfigTest, BusyPollIsOffByDefaultAndChecked) {
  auto plain = ParseJobConfig(YAML::Load("Distributed: {mode: async}"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->distributed.busy_poll.count(), 0);

  auto set = ParseJobConfig(YAML::Load("Distributed: {busy_poll_us: 100}"));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->distributed.busy_poll, std::chrono::microseconds(100));

  for (const char* bad : {"-1", "1000001", "fast"}) {
    auto refused =
        ParseJobConfig(YAML::Load(std::string("Distributed: {busy_poll_us: ") + bad + "}"));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().ToString(), HasSubstr("Distributed.busy_poll_us")) << bad;
  }
}

TEST(JobConfigTest, AuthIsOnByDefaultAndTurnsOffWithOffOrFalse) {
  auto plain = ParseJobConfig(YAML::Load("Distributed: {mode: async}"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_TRUE(plain->distributed.auth);
  for (const char* off : {"off", "false"}) {
    auto set = ParseJobConfig(YAML::Load(std::string("Distributed: {auth: ") + off + "}"));
    ASSERT_TRUE(set.ok()) << off << ": " << set.status().ToString();
    EXPECT_FALSE(set->distributed.auth) << off;
  }
  auto bad = ParseJobConfig(YAML::Load("Distributed: {auth: maybe}"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().ToString(), HasSubstr("Distributed.auth"));
}

}  // namespace
}  // namespace fleet::ps
