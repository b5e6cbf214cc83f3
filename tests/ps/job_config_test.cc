#include "ps/job_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

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
  EXPECT_THAT(negative.status().ToString(), HasSubstr(">= 0"));
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

}  // namespace
}  // namespace fleet::ps
