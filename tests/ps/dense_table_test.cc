#include "ps/table/dense_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "table_test_util.h"

namespace fleet::ps {
namespace {

TEST(DenseTableTest, PullPushDeltaOnOwnRange) {
  TableConfig c = ConfigFromYaml("{id: 9, kind: dense, dim: 10, optimizer: {rule: sgd, learning_rate: 0.5}}");
  auto t = DenseTable::Create(c, SplitDenseRange(10, 3, 1).value()).value();
  ASSERT_EQ(t->range().size(), 3u);
  std::vector<float> v(3);
  ASSERT_TRUE(t->PushGrad(std::vector<float>{1, 2, 3}).ok());
  ASSERT_TRUE(t->PushDelta(std::vector<float>{10, 10, 10}).ok());
  ASSERT_TRUE(t->Pull(v).ok());
  EXPECT_EQ(v, (std::vector<float>{9.5f, 9.0f, 8.5f}));

  Status s = t->PushGrad(std::vector<float>(4, 1.0f));
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_THAT(s.message(), ::testing::HasSubstr("holds 3"));
  ASSERT_TRUE(t->Pull(v).ok());
  EXPECT_EQ(v, (std::vector<float>{9.5f, 9.0f, 8.5f}));  // unchanged
}

TEST(DenseTableTest, InitialValuesDoNotDependOnServerCount) {
  TableConfig c = ConfigFromYaml("{id: 9, kind: dense, dim: 7, initializer: {kind: gaussian, seed: 3}}");
  auto whole = DenseTable::Create(c, {0, 7}).value();
  std::vector<float> all(7);
  ASSERT_TRUE(whole->Pull(all).ok());
  for (int r = 0; r < 2; ++r) {
    auto part = DenseTable::Create(c, SplitDenseRange(7, 2, r).value()).value();
    std::vector<float> v(part->range().size());
    ASSERT_TRUE(part->Pull(v).ok());
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], all[part->range().begin + i]);
  }
  EXPECT_TRUE(DenseTable::Create(c, {5, 9}).status().IsInvalidArgument());
}

}  // namespace
}  // namespace fleet::ps
