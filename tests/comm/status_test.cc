#include "comm/status.h"

#include <gtest/gtest.h>

namespace fleet {
namespace {

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FactoryJoinsWhatAndWhich) {
  Status s = Status::Timeout("pull_sparse after 5000 ms", "tcp://10.0.0.2:7000");
  EXPECT_TRUE(s.IsTimeout());
  EXPECT_EQ(s.message(), "pull_sparse after 5000 ms: tcp://10.0.0.2:7000");
  EXPECT_EQ(s.ToString(), "Timeout: pull_sparse after 5000 ms: tcp://10.0.0.2:7000");
  EXPECT_EQ(Status::NotFound("table").message(), "table");
}

TEST(StatusTest, WireRoundTripAndUnknownCodes) {
  Status s = Status::Corruption("bad crc", "shard_0007");
  Status back = Status::FromWire(static_cast<int>(s.code()), s.message());
  EXPECT_TRUE(back.IsCorruption());
  EXPECT_EQ(back.message(), s.message());
  EXPECT_TRUE(Status::FromWire(0, "ignored").ok());
  EXPECT_EQ(Status::FromWire(999, "from the future").code(), StatusCode::kInternal);
  EXPECT_EQ(Status::FromWire(-3, "negative").code(), StatusCode::kInternal);
}

TEST(StatusTest, WithContextKeepsCode) {
  Status s = Status::IOError("rename failed", "/ckpt/MANIFEST").WithContext("save table 2");
  EXPECT_TRUE(s.IsIOError());
  EXPECT_EQ(s.message(), "save table 2: rename failed: /ckpt/MANIFEST");
  EXPECT_TRUE(Status::OK().WithContext("x").ok());
}

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd number", std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  FLEET_ASSIGN_OR_RETURN(int h, Half(x));
  FLEET_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::OK();
}

TEST(ResultTest, ValueOrStatusPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_EQ(s.message(), "odd number: 3");
}

}  // namespace
}  // namespace fleet
