#include "data/idx_reader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/data/test_util.h"

namespace fleet::data {
namespace {

using testing::TempDir;

// IDX bytes: magic 00 00 08 <ndims>, big-endian dims, then data.
std::string IdxBytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string b = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<char>(d >> shift));
  }
  b.append(data.begin(), data.end());
  return b;
}

const std::vector<uint8_t> kPixels = {0, 255, 51, 102, 153, 204, 1, 2, 3, 4, 5, 6};  // 2 x 3x2

TEST(IdxReaderTest, ReadsPlainAndGzipImagesAndLabels) {
  TempDir dir;
  const std::string images = IdxBytes({2, 3, 2}, kPixels);
  const std::string labels = IdxBytes({2}, {7, 3});
  testing::WritePlain(dir.File("img"), images);
  testing::WriteGzip(dir.File("img.gz"), images);
  testing::WritePlain(dir.File("lbl"), labels);
  testing::WriteGzip(dir.File("lbl.gz"), labels);
  for (const char* suffix : {"", ".gz"}) {
    SCOPED_TRACE(suffix);
    auto ds = ReadIdxDataset(dir.File(std::string("img") + suffix),
                             dir.File(std::string("lbl") + suffix), 10);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->images.count, 2);
    EXPECT_EQ(ds->images.rows, 3);
    EXPECT_EQ(ds->images.cols, 2);
    ASSERT_EQ(ds->images.pixels.size(), kPixels.size());
    for (size_t i = 0; i < kPixels.size(); ++i) {
      EXPECT_FLOAT_EQ(ds->images.pixels[i], kPixels[i] / 255.0f) << i;
    }
    EXPECT_EQ(ds->labels, (std::vector<int32_t>{7, 3}));
  }
}

TEST(IdxReaderTest, EmptyDataSetIsValid) {
  TempDir dir;
  testing::WritePlain(dir.File("img"), IdxBytes({0, 28, 28}, {}));
  auto img = ReadIdxImages(dir.File("img"));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->count, 0);
  EXPECT_TRUE(img->pixels.empty());
}

struct BadIdx {
  const char* name;
  std::string bytes;
  bool gzip;
  const char* message;  // expected in the Corruption message
};

TEST(IdxReaderTest, MalformedImagesAreCorruptionNamingTheProblem) {
  const std::string good = IdxBytes({2, 3, 2}, kPixels);
  std::string wrong_type = good;
  wrong_type[2] = 0x0D;  // float
  const std::vector<BadIdx> cases = {
      {"truncated data", good.substr(0, good.size() - 5), false, "expected 28 bytes, found 23"},
      {"truncated data gzip", good.substr(0, good.size() - 5), true, "expected 28 bytes, found 23"},
      {"truncated header", good.substr(0, 9), false, "truncated IDX header"},
      {"shorter than magic", good.substr(0, 2), false, "found 2 bytes"},
      {"empty file", "", false, "found 0 bytes"},
      {"bad magic", std::string("\x1f\x00\x08\x03", 4) + good.substr(4), false,
       "bad IDX magic 1f 00 08 03"},
      {"label file as images", IdxBytes({2}, {1, 2}), false, "bad IDX magic 00 00 08 01"},
      {"wrong element type", wrong_type, false, "bad IDX magic 00 00 0d 03"},
      {"extra bytes", good + "zz", false, "longer than declared"},
      {"zero columns", IdxBytes({2, 3, 0}, {}), false, "zero rows or columns"},
      {"huge declared size", IdxBytes({0xFFFFFFFF, 0xFFFF, 0xFFFF}, {}), false, "implausible"},
  };
  TempDir dir;
  for (const BadIdx& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.File(c.gzip ? "bad.gz" : "bad");
    if (c.gzip) {
      testing::WriteGzip(path, c.bytes);
    } else {
      testing::WritePlain(path, c.bytes);
    }
    auto r = ReadIdxImages(path);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  }
}

TEST(IdxReaderTest, DatasetChecksCountsAndLabelRange) {
  TempDir dir;
  testing::WritePlain(dir.File("img"), IdxBytes({2, 3, 2}, kPixels));
  testing::WritePlain(dir.File("three"), IdxBytes({3}, {1, 2, 3}));
  testing::WritePlain(dir.File("big"), IdxBytes({2}, {1, 10}));
  auto count = ReadIdxDataset(dir.File("img"), dir.File("three"), 10);
  ASSERT_FALSE(count.ok());
  EXPECT_TRUE(count.status().IsCorruption());
  EXPECT_NE(count.status().message().find("3 labels"), std::string::npos);
  auto range = ReadIdxDataset(dir.File("img"), dir.File("big"), 10);
  ASSERT_FALSE(range.ok());
  EXPECT_TRUE(range.status().IsCorruption());
  EXPECT_NE(range.status().message().find("label 10 at index 1"), std::string::npos)
      << range.status().ToString();
  auto missing = ReadIdxDataset(dir.File("img"), dir.File("absent"), 10);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
  auto classes = ReadIdxDataset(dir.File("img"), dir.File("big"), 0);
  EXPECT_TRUE(classes.status().IsInvalidArgument());
}

TEST(IdxReaderTest, RealFashionMnistWhenInstalled) {
  const std::string root = "/usr/share/datasets/fashion-mnist/";
  struct Split {
    const char* prefix;
    int64_t count;
  };
  for (const Split& s : {Split{"train", 60000}, Split{"t10k", 10000}}) {
    const std::string images = root + s.prefix + "-images-idx3-ubyte.gz";
    const std::string labels = root + s.prefix + "-labels-idx1-ubyte.gz";
    if (!std::filesystem::exists(images) || !std::filesystem::exists(labels)) {
      GTEST_SKIP() << "Fashion-MNIST not installed at " << root
                   << " (Debian package dataset-fashion-mnist)";
    }
    auto ds = ReadIdxDataset(images, labels, 10);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ(ds->images.count, s.count);
    EXPECT_EQ(ds->images.rows, 28);
    EXPECT_EQ(ds->images.cols, 28);
    ASSERT_EQ(ds->labels.size(), static_cast<size_t>(s.count));
    std::vector<int> per_class(10);
    for (int32_t l : ds->labels) ++per_class.at(l);
    for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], s.count / 10) << "class " << c;
    float lo = 1, hi = 0;
    for (float p : ds->images.pixels) {
      lo = std::min(lo, p);
      hi = std::max(hi, p);
    }
    EXPECT_EQ(lo, 0.0f);
    EXPECT_EQ(hi, 1.0f);
  }
}

}  // namespace
}  // namespace fleet::data
