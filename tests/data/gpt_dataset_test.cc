#include "data/gpt_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/data/test_util.h"

namespace fleet::data {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

// Shards whose tokens are their stream positions (mod `mod`), so a sample's
// first token says where it was cut.
std::shared_ptr<const TokenCorpus> Shards(const TempDir& dir, const std::vector<int>& sizes,
                                          int mod = 65536) {
  std::vector<std::string> paths;
  int next = 0;
  for (size_t f = 0; f < sizes.size(); ++f) {
    std::vector<int32_t> t(sizes[f]);
    for (auto& x : t) x = next++ % mod;
    paths.push_back(dir.File("s" + std::to_string(f) + ".bin"));
    EXPECT_TRUE(WriteLlmcShard(paths.back(), t).ok());
  }
  auto c = TokenCorpus::OpenLlmc(paths);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

GptDatasetOptions Options(int64_t t) {
  GptDatasetOptions o;
  o.seq_len = t;
  o.vocab_size = 65536;
  o.split = {1};
  return o;
}

TEST(GptDatasetTest, SamplesOverlapByOneTokenAndCrossFiles) {
  TempDir dir;
  auto corpus = Shards(dir, {10, 3, 8});  // 21 tokens
  auto d = GptDataset::Open(corpus, Options(4));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)->num_samples(), 5);  // (21 - 1) / 4
  std::vector<int32_t> s(5);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*d)->ReadSample(i, s.data()).ok());
    for (int j = 0; j < 5; ++j) EXPECT_EQ(s[j], 4 * i + j) << i;
  }
  // A batch by ids, as the collective loop hands them to a task.
  const std::vector<int64_t> ids = {3, 0, 3};
  std::vector<int32_t> batch(3 * 5);
  ASSERT_TRUE((*d)->ReadSamples(ids, batch.data()).ok());
  EXPECT_EQ(batch[0], 12);
  EXPECT_EQ(batch[5], 0);
  EXPECT_EQ(batch[14], 16);
  for (int64_t bad : {int64_t{-1}, int64_t{5}}) {
    Status st = (*d)->ReadSample(bad, s.data());
    ASSERT_TRUE(st.IsInvalidArgument());
    EXPECT_THAT(st.message(), HasSubstr("is outside the 5 samples of the train part"));
  }
}

TEST(GptDatasetTest, SplitsDocumentsAsFleetXRounds) {
  TempDir dir;
  // 10 documents of 1..10 tokens.
  std::vector<int32_t> tokens;
  std::vector<int64_t> lens;
  for (int i = 1; i <= 10; ++i) {
    lens.push_back(i);
    for (int j = 0; j < i; ++j) tokens.push_back(static_cast<int32_t>(tokens.size() % 200));
  }
  ASSERT_TRUE(WriteFleetXData(dir.File("docs"), tokens, lens, 257).ok());
  auto c = TokenCorpus::OpenFleetX({dir.File("docs")});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*c)->has_documents());
  // Document starts: 0 1 3 6 10 15 21 28 36 45 | 55.
  // [8, 1, 1] -> documents [0, 8), [8, 9), [9, 10).
  EXPECT_EQ((*c)->PartRange({8, 1, 1}, 0), std::make_pair(int64_t{0}, int64_t{36}));
  EXPECT_EQ((*c)->PartRange({8, 1, 1}, 1), std::make_pair(int64_t{36}, int64_t{45}));
  EXPECT_EQ((*c)->PartRange({8, 1, 1}, 2), std::make_pair(int64_t{45}, int64_t{55}));
  // [1, 1, 1]: round(3.33) = 3 each, 9 in all, shifted by the missing 1
  // (FleetX: [0, 4, 7, 10]).
  EXPECT_EQ((*c)->PartRange({1, 1, 1}, 0), std::make_pair(int64_t{0}, int64_t{10}));
  EXPECT_EQ((*c)->PartRange({1, 1, 1}, 1), std::make_pair(int64_t{10}, int64_t{28}));
  // Python rounds halves to even: [1, 1, 2] of 10 is 2, 2, 5 (not 3, 3, 5),
  // shifted by the missing 1 to boundaries [0, 3, 5, 10].
  EXPECT_EQ((*c)->PartRange({1, 1, 2}, 0), std::make_pair(int64_t{0}, int64_t{6}));
  EXPECT_EQ((*c)->PartRange({1, 1, 2}, 1), std::make_pair(int64_t{6}, int64_t{15}));
  // A part of a FleetX corpus is only documents: one sample of T = 8 fits
  // the 9-token eval part of [8, 1, 1].
  auto o = Options(8);
  o.vocab_size = 257;
  o.split = {8, 1, 1};
  o.part = 1;
  auto eval = GptDataset::Open(*c, o);
  ASSERT_TRUE(eval.ok()) << eval.status().ToString();
  EXPECT_EQ((*eval)->num_samples(), 1);
  EXPECT_EQ((*eval)->range(), std::make_pair(int64_t{36}, int64_t{45}));
  o.part = 2;
  o.seq_len = 10;
  auto test = GptDataset::Open(*c, o);
  ASSERT_TRUE(test.status().IsInvalidArgument());
  EXPECT_THAT(test.status().message(), HasSubstr("the test part has 10 tokens; one sample"));
}

TEST(GptDatasetTest, SplitsTokensWithoutDocuments) {
  TempDir dir;
  auto c = Shards(dir, {600, 400});
  EXPECT_FALSE(c->has_documents());
  EXPECT_EQ(c->PartRange({949, 50, 1}, 0), std::make_pair(int64_t{0}, int64_t{949}));
  EXPECT_EQ(c->PartRange({949, 50, 1}, 1), std::make_pair(int64_t{949}, int64_t{999}));
  EXPECT_EQ(c->PartRange({949, 50, 1}, 2), std::make_pair(int64_t{999}, int64_t{1000}));
  EXPECT_EQ(c->PartRange({1}, 1), std::make_pair(int64_t{1000}, int64_t{1000}));
}

TEST(GptDatasetTest, BadTokensAndEmptyDataAreNamed) {
  TempDir dir;
  auto c = Shards(dir, {30, 30});  // ids 0..59
  auto o = Options(5);
  o.vocab_size = 40;
  auto d = *GptDataset::Open(c, o);
  std::vector<int32_t> out(6);
  // Samples 0..6 hold ids up to 35; sample 7 (ids 35..40) is the first bad.
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(d->ReadSample(i, out.data()).ok()) << i;
  Status st = d->ReadSample(7, out.data());
  ASSERT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("token id 40 at token 10 is outside the vocabulary [0, 40)"));
  EXPECT_THAT(st.message(), HasSubstr("s1.bin"));

  auto empty = Shards(dir, {0});
  auto e = GptDataset::Open(empty, Options(4));
  ASSERT_TRUE(e.status().IsInvalidArgument());
  EXPECT_THAT(e.status().message(), HasSubstr("the train part has 0 tokens"));
  EXPECT_TRUE(TokenCorpus::OpenLlmc({}).status().IsInvalidArgument());
  EXPECT_TRUE(TokenCorpus::OpenLlmc({dir.File("nope.bin")}).status().IsNotFound());
}

}  // namespace
}  // namespace fleet::data
