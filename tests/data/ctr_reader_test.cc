#include "data/ctr_reader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tests/data/test_util.h"

namespace fleet::data {
namespace {

using testing::CriteoLine;
using testing::JoinLines;
using testing::TempDir;

// Splits a line into its 40 fields so a test can change one.
std::vector<std::string> Fields(const std::string& line) {
  std::vector<std::string> f;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    f.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return f;
    start = tab + 1;
  }
}

std::string Join(const std::vector<std::string>& f) {
  std::string s;
  for (size_t i = 0; i < f.size(); ++i) s += (i ? "\t" : "") + f[i];
  return s;
}

// CriteoLine(i) with field `index` replaced.
std::string WithField(int i, int index, const std::string& value) {
  auto f = Fields(CriteoLine(i));
  f[index] = value;
  return Join(f);
}

TEST(CriteoKeyTest, SlotsSeparateEqualValuesAndValuesNeverClashWithinSlot) {
  std::set<uint64_t> keys;
  for (int slot = 0; slot < kCriteoSlots; ++slot) {
    for (uint64_t v = 0; v < 1000; ++v) keys.insert(CriteoKey(slot, v));
    keys.insert(CriteoMissingKey(slot));
  }
  EXPECT_EQ(keys.size(), static_cast<size_t>(kCriteoSlots * 1001));
  // Pinned values: the key function is part of the data format (saved
  // sparse tables depend on it), so a change must be deliberate.
  EXPECT_EQ(CriteoKey(0, 0), 0x6393d51c06c618dcULL);
  EXPECT_EQ(CriteoKey(25, 0xdeadbeef), 0x3767025052c10c0dULL);
  EXPECT_EQ(CriteoMissingKey(3), 0xf9ea68266d99260dULL);
}

TEST(ParseCriteoLineTest, ParsesValuesAndTransformsDense) {
  auto f = Fields(CriteoLine(3));
  f[1] = "0";          // I1 = 0 -> 0
  f[2] = "-5";         // negative -> 0
  f[3] = "";           // missing -> 0
  f[4] = "99";         // log(100)
  f[14] = "DEADbeef";  // C1, mixed case
  f[15] = "";          // C2 missing
  CtrSample s;
  ASSERT_TRUE(ParseCriteoLine(Join(f), &s).ok());
  EXPECT_EQ(s.label, 1.0f);
  EXPECT_EQ(s.dense[0], 0.0f);
  EXPECT_EQ(s.dense[1], 0.0f);
  EXPECT_EQ(s.dense[2], 0.0f);
  EXPECT_FLOAT_EQ(s.dense[3], std::log(100.0f));
  EXPECT_EQ(s.keys[0], CriteoKey(0, 0xdeadbeef));
  EXPECT_EQ(s.keys[1], CriteoMissingKey(1));
  EXPECT_EQ(s.keys[2], CriteoKey(2, 0x1002));
}

TEST(ParseCriteoLineTest, AllFieldsMissingButLabel) {
  CtrSample s;
  ASSERT_TRUE(ParseCriteoLine("0" + std::string(kCriteoFields - 1, '\t'), &s).ok());
  EXPECT_EQ(s.label, 0.0f);
  for (float d : s.dense) EXPECT_EQ(d, 0.0f);
  for (int slot = 0; slot < kCriteoSlots; ++slot) EXPECT_EQ(s.keys[slot], CriteoMissingKey(slot));
}

struct BadLine {
  const char* name;
  std::string line;
  const char* message;
};

TEST(ParseCriteoLineTest, MalformedLinesSayWhatIsWrong) {
  const std::string good = CriteoLine(1);
  const std::vector<BadLine> cases = {
      {"empty", "", "empty line"},
      {"39 fields", good.substr(0, good.rfind('\t')), "found 39"},
      {"41 fields", good + "\tab", "found 41"},
      {"label 2", WithField(1, 0, "2"), "label '2'"},
      {"label empty", WithField(1, 0, ""), "label ''"},
      {"label float", WithField(1, 0, "1.0"), "label '1.0'"},
      {"bad integer", WithField(1, 5, "12x"), "integer feature I5 '12x'"},
      {"float integer", WithField(1, 13, "1.5"), "integer feature I13"},
      {"integer overflow", WithField(1, 1, "99999999999999999999"), "integer feature I1"},
      {"bad hex", WithField(1, 14, "xyz"), "categorical feature C1 'xyz'"},
      {"hex with prefix", WithField(1, 20, "0x1f"), "categorical feature C7"},
      {"negative hex", WithField(1, 39, "-1f"), "categorical feature C26"},
      {"17 hex digits", WithField(1, 14, "1ffffffffffffffff"), "categorical feature C1"},
      {"space in hex", WithField(1, 14, "ab cd"), "categorical feature C1"},
  };
  for (const BadLine& c : cases) {
    SCOPED_TRACE(c.name);
    CtrSample s;
    const Status st = ParseCriteoLine(c.line, &s);
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st.ToString();
  }
}

// Reads a whole file set with one reader; returns every batch's labels' I1
// values (which CriteoLine sets to the line's i) in order.
struct ReadResult {
  std::vector<int> ids;
  std::vector<size_t> batch_sizes;
  CtrReaderStats stats;
};

ReadResult ReadAll(const std::vector<std::string>& files, int batch_size) {
  CtrReaderOptions o;
  o.batch_size = batch_size;
  auto reader = CtrReader::Open(files, o);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  ReadResult r;
  CtrBatch b;
  for (;;) {
    auto n = (*reader)->Next(&b);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok() || *n == 0) break;
    r.batch_sizes.push_back(*n);
    EXPECT_EQ(b.dense.size(), *n * kCriteoDense);
    for (const SlotKeys& slot : b.slots) {
      EXPECT_EQ(slot.offsets.size(), *n + 1);
      if (slot.offsets.size() != *n + 1) return r;
      for (size_t i = 0; i <= *n; ++i) EXPECT_EQ(slot.offsets[i], i);
      EXPECT_EQ(slot.keys.size(), *n);
    }
    for (size_t i = 0; i < *n; ++i) {
      const int id = static_cast<int>(std::lround(std::expm1(b.dense[i * kCriteoDense])));
      r.ids.push_back(id);
      EXPECT_EQ(b.labels[i], static_cast<float>(id % 2));
      EXPECT_EQ(b.slots[0].keys[i], CriteoKey(0, id));
    }
  }
  r.stats = (*reader)->stats();
  return r;
}

TEST(CtrReaderTest, SkipsAndCountsMalformedLinesAcrossFormats) {
  TempDir dir;
  // Lines 1..6 good, with three malformed lines and CRLF endings mixed in;
  // the last line has no newline.
  const std::string text = CriteoLine(1) + "\r\n" + CriteoLine(2) + "\n" + "garbage\n" +
                           WithField(9, 14, "zz") + "\r\n" + CriteoLine(3) + "\n\n" +
                           CriteoLine(4) + "\r\n" + CriteoLine(5) + "\n" + CriteoLine(6);
  testing::WritePlain(dir.File("a.txt"), text);
  testing::WriteGzip(dir.File("a.gz"), text);
  testing::WritePlain(dir.File("empty.txt"), "");
  for (const char* name : {"a.txt", "a.gz"}) {
    SCOPED_TRACE(name);
    const ReadResult r = ReadAll({dir.File("empty.txt"), dir.File(name), dir.File("empty.txt")}, 4);
    EXPECT_EQ(r.ids, (std::vector<int>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(r.batch_sizes, (std::vector<size_t>{4, 2}));
    EXPECT_EQ(r.stats.lines, 9);
    EXPECT_EQ(r.stats.samples, 6);
    EXPECT_EQ(r.stats.malformed, 3);
  }
}

// Missing fields and a wrong field count, read into one key space and into
// a table per field: the same samples, keys in each field's own range in
// the second, missing values on each field's last row.
TEST(CtrReaderTest, MissingFieldsIntoOneTableOrATablePerField) {
  TempDir dir;
  std::vector<std::string> sparse = Fields(CriteoLine(7));
  sparse[14] = "";  // C1 missing
  sparse[39] = "";  // C26 missing
  sparse[1] = "";   // I1 missing
  std::vector<std::string> short_line = Fields(CriteoLine(8));
  short_line.pop_back();  // 39 fields
  testing::WritePlain(dir.File("a.txt"), JoinLines({CriteoLine(5), Join(sparse), Join(short_line),
                                                    "0" + std::string(kCriteoFields - 1, '\t')}));
  for (uint64_t buckets : {uint64_t{0}, uint64_t{1000}}) {
    SCOPED_TRACE(buckets == 0 ? "one key space" : "a table per field");
    CtrReaderOptions o;
    o.batch_size = 10;
    o.field_buckets = buckets;
    auto reader = CtrReader::Open({dir.File("a.txt")}, o);
    ASSERT_TRUE(reader.ok());
    CtrBatch b;
    ASSERT_EQ((*reader)->Next(&b).value(), 3u);  // the short line is skipped
    EXPECT_EQ((*reader)->stats().malformed, 1);
    EXPECT_EQ(b.dense[1 * kCriteoDense + 0], 0.0f);  // a missing integer is 0
    for (int slot = 0; slot < kCriteoSlots; ++slot) {
      const uint64_t missing = buckets == 0 ? CriteoMissingKey(slot) : FieldTableKey(slot, buckets);
      EXPECT_EQ(b.slots[slot].keys[2], missing) << "all missing, slot " << slot;
      EXPECT_EQ(b.slots[slot].keys[1] == missing, slot == 0 || slot == 25) << "slot " << slot;
      if (buckets == 0) continue;
      for (uint64_t key : b.slots[slot].keys) {
        EXPECT_GE(key, FieldTableKey(slot, 0));
        EXPECT_LE(key, FieldTableKey(slot, buckets));
      }
    }
  }
  CtrReaderOptions too_many;
  too_many.field_buckets = kMaxFieldBuckets + 1;
  EXPECT_FALSE(CtrReader::Open({dir.File("a.txt")}, too_many).ok());
}

TEST(CtrReaderTest, RewindStartsANewEpochAndStatsAccumulate) {
  TempDir dir;
  testing::WritePlain(dir.File("a.txt"), JoinLines({CriteoLine(1), "bad", CriteoLine(2)}));
  auto reader = CtrReader::Open({dir.File("a.txt")}, CtrReaderOptions{});
  ASSERT_TRUE(reader.ok());
  CtrBatch b;
  for (int epoch = 0; epoch < 2; ++epoch) {
    auto n = (*reader)->Next(&b);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 2u);
    n = (*reader)->Next(&b);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 0u);
    EXPECT_EQ(b.size(), 0u);
    (*reader)->Rewind();
  }
  EXPECT_EQ((*reader)->stats().samples, 4);
  EXPECT_EQ((*reader)->stats().malformed, 2);
}

TEST(CtrReaderTest, FileErrorsStopWithStatus) {
  TempDir dir;
  testing::WritePlain(dir.File("a.txt"), JoinLines({CriteoLine(1)}));
  auto reader = CtrReader::Open({dir.File("a.txt"), dir.File("missing.txt")}, CtrReaderOptions{});
  ASSERT_TRUE(reader.ok());
  CtrBatch b;
  auto n = (*reader)->Next(&b);
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(n.status().IsNotFound()) << n.status().ToString();
  EXPECT_EQ(b.size(), 1u);

  CtrReaderOptions bad;
  bad.batch_size = 0;
  EXPECT_TRUE(CtrReader::Open({}, bad).status().IsInvalidArgument());
}

}  // namespace
}  // namespace fleet::data
