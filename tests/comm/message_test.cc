#include "comm/message.h"

#include <gtest/gtest.h>

namespace fleet {
namespace {

Message KeysAndValues(size_t n, int dim) {
  Message m;
  m.header.set_command(7);
  SArray<uint64_t> keys(n);
  SArray<float> vals(n * dim);
  for (size_t i = 0; i < n; ++i) keys[i] = i * 31 + 1;
  for (size_t i = 0; i < n * dim; ++i) vals[i] = 0.5f * i;
  m.AddFrame(keys);
  m.AddFrame(vals);
  return m;
}

TEST(MessageTest, FramesShareMemoryAndValidate) {
  SArray<float> vals(16);
  Message m;
  m.AddFrame(vals);
  ASSERT_TRUE(m.Validate().ok());
  auto back = m.Frame<float>(0);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data(), vals.data());  // no copy
  EXPECT_EQ(back->size(), 16u);
}

TEST(MessageTest, EmptyFramesAreValid) {
  Message m = KeysAndValues(0, 4);
  EXPECT_TRUE(m.Validate().ok());
  EXPECT_EQ(m.Frame<uint64_t>(0)->size(), 0u);
}

TEST(MessageTest, TruncatedFrameIsRejectedWithReason) {
  Message m = KeysAndValues(10, 4);
  m.frames[1] = m.frames[1].Segment(0, m.frames[1].size() - 3);
  Status s = m.Validate();
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("frame size disagrees"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("frame 1"), std::string::npos) << s.ToString();
}

TEST(MessageTest, ChangedDeclaredLengthIsRejected) {
  Message m = KeysAndValues(10, 4);
  m.header.mutable_frames(0)->set_count(11);
  EXPECT_TRUE(m.Validate().IsInvalidArgument());
  // A count so large that count * size overflows must not pass.
  m.header.mutable_frames(0)->set_count((~0ull) / 4);
  EXPECT_TRUE(m.Validate().IsInvalidArgument());
}

TEST(MessageTest, MissingFrameIsRejected) {
  Message m = KeysAndValues(10, 4);
  m.frames.pop_back();  // keys without values
  Status s = m.Validate();
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("declares 2 payload frames but 1 arrived"), std::string::npos)
      << s.ToString();
  EXPECT_TRUE(m.Frame<float>(1).status().IsInvalidArgument());
}

TEST(MessageTest, WrongTypeTagIsRejected) {
  Message m = KeysAndValues(10, 4);
  auto as_float = m.Frame<float>(0);  // frame 0 holds uint64 keys
  EXPECT_TRUE(as_float.status().IsInvalidArgument());
  EXPECT_NE(as_float.status().message().find("expected DT_FLOAT"), std::string::npos);
  m.header.mutable_frames(0)->set_dtype(static_cast<pb::DataType>(42));
  EXPECT_NE(m.Validate().message().find("unknown data type tag 42"), std::string::npos);
}

TEST(MessageTest, MisalignedFrameIsCopiedNotCrashed) {
  Bytes raw(8 * 3 + 1);
  Message m;
  auto* info = m.header.add_frames();
  info->set_dtype(pb::DT_UINT64);
  info->set_count(3);
  m.frames.push_back(raw.Segment(1, raw.size()));
  ASSERT_TRUE(m.Validate().ok());
  auto keys = m.Frame<uint64_t>(0);
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(keys->data()) % alignof(uint64_t), 0u);
}

TEST(MessageTest, StatusTravelsInHeader) {
  Message m;
  m.set_status(Status::NotFound("unknown table", "7"));
  EXPECT_TRUE(m.status().IsNotFound());
  EXPECT_EQ(m.status().message(), "unknown table: 7");
}

}  // namespace
}  // namespace fleet
