#include "data/ctr_generator.h"

#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/data/test_util.h"
#include "data/ctr_reader.h"
#include "comm/file_io.h"
#include "data/metrics.h"

namespace fleet::data {
namespace {

using testing::TempDir;

CtrGeneratorOptions SmallOptions(const std::string& out_dir) {
  CtrGeneratorOptions o;
  o.out_dir = out_dir;
  o.train_files = 2;
  o.test_files = 2;
  o.lines_per_file = 3000;
  o.seed = 7;
  return o;
}

std::vector<float> ReadProbs(const std::string& path) {
  auto file = InputFile::Open(path);
  EXPECT_TRUE(file.ok());
  LineReader lines(std::move(file).value());
  std::vector<float> probs;
  std::string_view line;
  while (*lines.Next(&line)) {
    float p = -1;
    const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), p);
    EXPECT_TRUE(ec == std::errc() && end == line.data() + line.size()) << line;
    EXPECT_GT(p, 0.0f);
    EXPECT_LT(p, 1.0f);
    probs.push_back(p);
  }
  return probs;
}

TEST(CtrGeneratorTest, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir a, b, c;
  auto ra = GenerateCtrData(SmallOptions(a.path()));
  auto rb = GenerateCtrData(SmallOptions(b.path()));
  CtrGeneratorOptions other = SmallOptions(c.path());
  other.seed = 8;
  auto rc = GenerateCtrData(other);
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok()) << ra.status().ToString();
  for (const char* rel : {"train/part-00000.txt", "train/part-00001.txt", "test/part-00001.txt",
                          "test_prob/part-00001.prob"}) {
    const std::string bytes = testing::ReadPlain(a.File(rel));
    EXPECT_FALSE(bytes.empty()) << rel;
    EXPECT_EQ(bytes, testing::ReadPlain(b.File(rel))) << rel;
    EXPECT_NE(bytes, testing::ReadPlain(c.File(rel))) << rel;
  }
  EXPECT_EQ(ra->oracle_auc, rb->oracle_auc);
}

TEST(CtrGeneratorTest, OutputParsesAndOracleMatchesWrittenProbabilities) {
  TempDir dir;
  const CtrGeneratorOptions o = SmallOptions(dir.path());
  auto report = GenerateCtrData(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->train_lines, 6000);
  EXPECT_EQ(report->test_lines, 6000);
  EXPECT_NEAR(report->train_ctr, o.target_ctr, 0.03);
  EXPECT_NEAR(report->test_ctr, o.target_ctr, 0.03);
  // The defaults are chosen to give an oracle AUC well inside this band.
  EXPECT_GT(report->oracle_auc, 0.75);
  EXPECT_LT(report->oracle_auc, 0.86);

  // Every line parses; the test labels with the written probabilities give
  // exactly the reported oracle AUC.
  auto train = ExpandFileSpec(dir.File("train"));
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(*train, report->train_paths);
  CtrReaderOptions ro;
  ro.batch_size = 1000;
  auto reader = CtrReader::Open(*train, ro);
  ASSERT_TRUE(reader.ok());
  CtrBatch batch;
  while (*(*reader)->Next(&batch) > 0) {
  }
  EXPECT_EQ((*reader)->stats().samples, 6000);
  EXPECT_EQ((*reader)->stats().malformed, 0);

  std::vector<float> labels, probs;
  for (size_t f = 0; f < report->test_paths.size(); ++f) {
    auto test = CtrReader::Open({report->test_paths[f]}, ro);
    ASSERT_TRUE(test.ok());
    while (*(*test)->Next(&batch) > 0)
      labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
    EXPECT_EQ((*test)->stats().malformed, 0);
    const auto p = ReadProbs(report->prob_paths[f]);
    probs.insert(probs.end(), p.begin(), p.end());
  }
  ASSERT_EQ(labels.size(), probs.size());
  EXPECT_DOUBLE_EQ(ExactAuc(probs, labels), report->oracle_auc);

  auto oracle = ReadOracleFile(dir.File("oracle.txt"));
  ASSERT_TRUE(oracle.ok()) << oracle.status().ToString();
  EXPECT_DOUBLE_EQ(oracle->oracle_auc, report->oracle_auc);
  EXPECT_DOUBLE_EQ(oracle->oracle_logloss, report->oracle_logloss);
  EXPECT_EQ(oracle->test_lines, 6000);
}

TEST(CtrGeneratorTest, FilesAreIndependentOfTheOtherFileCounts) {
  TempDir a, b;
  CtrGeneratorOptions more = SmallOptions(b.path());
  more.train_files = 3;
  more.test_files = 1;
  ASSERT_TRUE(GenerateCtrData(SmallOptions(a.path())).ok());
  ASSERT_TRUE(GenerateCtrData(more).ok());
  EXPECT_EQ(testing::ReadPlain(a.File("train/part-00001.txt")),
            testing::ReadPlain(b.File("train/part-00001.txt")));
  EXPECT_EQ(testing::ReadPlain(a.File("test/part-00000.txt")),
            testing::ReadPlain(b.File("test/part-00000.txt")));
}

TEST(CtrGeneratorTest, RerunReplacesStalePartsAndLeavesNoTemporaries) {
  TempDir dir;
  CtrGeneratorOptions o = SmallOptions(dir.path());
  o.lines_per_file = 100;
  o.train_files = 3;
  ASSERT_TRUE(GenerateCtrData(o).ok());
  o.train_files = 1;
  ASSERT_TRUE(GenerateCtrData(o).ok());
  auto train = ExpandFileSpec(dir.File("train"));
  ASSERT_TRUE(train.ok());
  EXPECT_EQ(train->size(), 1u);
  for (const auto& de : std::filesystem::recursive_directory_iterator(dir.path())) {
    EXPECT_NE(de.path().filename().string()[0], '.') << de.path();
  }
}

TEST(CtrGeneratorTest, RejectsBadOptions) {
  TempDir dir;
  const std::vector<std::pair<const char*, void (*)(CtrGeneratorOptions*)>> cases = {
      {"out_dir", [](CtrGeneratorOptions* o) { o->out_dir.clear(); }},
      {"train_files", [](CtrGeneratorOptions* o) { o->train_files = 0; }},
      {"test_files", [](CtrGeneratorOptions* o) { o->test_files = 0; }},
      {"lines_per_file", [](CtrGeneratorOptions* o) { o->lines_per_file = 0; }},
      {"vocab", [](CtrGeneratorOptions* o) { o->vocab = 0; }},
      {"zipf", [](CtrGeneratorOptions* o) { o->zipf = NAN; }},
      {"target_ctr", [](CtrGeneratorOptions* o) { o->target_ctr = 1.0; }},
      {"missing_rate", [](CtrGeneratorOptions* o) { o->missing_rate = -0.1; }},
  };
  for (const auto& [name, mutate] : cases) {
    CtrGeneratorOptions o = SmallOptions(dir.path());
    mutate(&o);
    auto r = GenerateCtrData(o);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
    EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().ToString();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("oracle.txt")));
}

TEST(ReadOracleFileTest, MissingAndMalformed) {
  TempDir dir;
  EXPECT_TRUE(ReadOracleFile(dir.File("oracle.txt")).status().IsNotFound());
  testing::WritePlain(dir.File("bad.txt"), "# comment\noracle_auc 0.8\ntest_ctr x\n");
  auto bad = ReadOracleFile(dir.File("bad.txt"));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsCorruption());
  EXPECT_NE(bad.status().message().find("line 3"), std::string::npos) << bad.status().ToString();
  testing::WritePlain(dir.File("none.txt"), "test_ctr 0.2\n");
  EXPECT_TRUE(ReadOracleFile(dir.File("none.txt")).status().IsCorruption());
}

}  // namespace
}  // namespace fleet::data
