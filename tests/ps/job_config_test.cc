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

}  // namespace
}  // namespace fleet::ps
