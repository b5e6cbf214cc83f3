// TensorBoard event files (data/tensorboard/event_writer.h): CRC-32C
// against the RFC 3720 vectors, and a file of scalars decoded by
// tests/read_tb_events.py (python3-protobuf, its own CRC check) as
// TensorBoard reads it. The decoding case skips, saying why, without
// /usr/bin/python3 or python3-protobuf.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/tensorboard_events.h"
#include "data/tensorboard/event_writer.h"

namespace fleet::tensorboard {
namespace {

namespace fs = std::filesystem;

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  EXPECT_EQ(Crc32c(ascending), 0x46dd794eu);
  // Continuing a CRC over a split input gives the whole input's.
  EXPECT_EQ(Crc32c("6789", Crc32c("12345")), 0xe3069283u);
  EXPECT_EQ(MaskCrc(0), 0xa282ead8u);
}

TEST(EventWriterTest, ScalarsDecodeAsTensorBoardReadsThem) {
  const std::string missing = fleet::testing::TbDecoderMissing();
  if (!missing.empty()) GTEST_SKIP() << "skipped: " << missing;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("tensorboard_test." + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    auto writer = std::move(EventWriter::Create((dir / "tb").string()).value());
    EXPECT_EQ(fs::path(writer->path()).parent_path(), dir / "tb");
    ASSERT_TRUE(writer->Scalar("train/loss", 10, 4.5).ok());
    ASSERT_TRUE(writer->Scalar("train/learning_rate", 10, 6e-4).ok());
    ASSERT_TRUE(writer->Scalar("eval/loss", 20, 3.25).ok());
  }
  std::string error, version;
  const std::vector<fleet::testing::TbScalar> got = fleet::testing::ReadTbScalars(
      FLEET_PROTOC, FLEET_TEST_SOURCE_DIR, dir / "tb", &error, &version);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_EQ(version, "brain.Event:2");
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].tag, "train/loss");
  EXPECT_EQ(got[0].step, 10);
  EXPECT_EQ(got[0].value, 4.5);
  EXPECT_EQ(got[1].value, static_cast<double>(6e-4f));
  EXPECT_EQ(got[2].tag, "eval/loss");
  EXPECT_EQ(got[2].step, 20);

  // One flipped byte in the last record's data: the decoder's CRC check
  // catches it (the test's decoder is not the writer's).
  fs::path file;
  for (const auto& e : fs::directory_iterator(dir / "tb")) {
    if (e.is_regular_file()) file = e.path();
  }
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 6] ^= 0x20;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  fleet::testing::ReadTbScalars(FLEET_PROTOC, FLEET_TEST_SOURCE_DIR, dir / "tb", &error);
  EXPECT_NE(error.find("bad data CRC"), std::string::npos) << error;
  fs::remove_all(dir);
}

TEST(EventWriterTest, UnwritableDirectoryIsIOErrorNamingIt) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("tensorboard_test_file." + std::to_string(::getpid()));
  std::ofstream(dir) << "a file, not a directory";
  const Status st = EventWriter::Create((dir / "tb").string()).status();
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_NE(st.ToString().find((dir / "tb").string()), std::string::npos) << st.ToString();
  fs::remove(dir);
}

}  // namespace
}  // namespace fleet::tensorboard
