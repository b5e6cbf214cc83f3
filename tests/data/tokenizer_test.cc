#include "data/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/splitmix.h"
#include "tests/data/test_util.h"
#include "data/gpt2_tokenizer.h"

namespace fleet::data {
namespace {

using testing::Fixture;
using ::testing::HasSubstr;
using testing::ReadPlain;
using testing::TempDir;
using testing::WritePlain;

// GPT-2's files as scripts/setup.sh leaves them. Missing files fail the test
// (run scripts/setup.sh), they do not skip it.
const Gpt2Tokenizer& Gpt2() {
  static const Gpt2Tokenizer* t = [] {
    auto r = Gpt2Tokenizer::Load(DefaultGpt2VocabDir());
    CHECK(r.ok()) << r.status().ToString();
    return std::move(r).value().release();
  }();
  return *t;
}

TEST(TokenizerTest, Gpt2MatchesGpt3EncoderOnKnownStrings) {
  const nlohmann::json golden = nlohmann::json::parse(ReadPlain(Fixture("gpt2_golden.json")));
  ASSERT_GE(golden.size(), 20u);
  for (const auto& e : golden) {
    const std::string text = e["text"].get<std::string>();
    const std::vector<int32_t> want = e["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(Gpt2().Encode(text), want) << "'" << text << "'";
    auto back = Gpt2().Decode(want);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
  // The two everyone knows.
  EXPECT_EQ(Gpt2().Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(Gpt2().Encode(" Hello"), (std::vector<int32_t>{18435}));
  EXPECT_EQ(Gpt2().vocab_size(), 50257);
  EXPECT_EQ(Gpt2().eot_id(), 50256);
  EXPECT_EQ(*Gpt2().Decode(std::vector<int32_t>{50256}), "<|endoftext|>");
}

TEST(TokenizerTest, AnyBytesRoundTripThroughBothVocabularies) {
  ByteTokenizer byte;
  SplitMix64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng.Next() % 64, '\0');
    // Mostly text, sometimes raw bytes (invalid UTF-8 included).
    for (auto& c : s) {
      const uint64_t r = rng.Next();
      c = (r & 3) == 0 ? static_cast<char>(r >> 8) : "ab c\n'9é"[(r >> 8) % 9];
    }
    for (const Tokenizer* t :
         {static_cast<const Tokenizer*>(&byte), static_cast<const Tokenizer*>(&Gpt2())}) {
      const std::vector<int32_t> ids = t->Encode(s);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t->vocab_size());
      auto back = t->Decode(ids);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(*back, s) << t->name() << " trial " << trial;
    }
  }
  // Invalid UTF-8 between valid text keeps every byte.
  const std::string mixed = std::string("ok \xff\xfe then") + "\xc3" + " end";
  EXPECT_EQ(*Gpt2().Decode(Gpt2().Encode(mixed)), mixed);
}

TEST(TokenizerTest, ByteVocabularyIsBytesPlusEndOfText) {
  ByteTokenizer t;
  EXPECT_EQ(t.vocab_size(), 257);
  EXPECT_EQ(t.eot_id(), 256);
  EXPECT_EQ(t.Encode("A\xff"), (std::vector<int32_t>{65, 255}));
  EXPECT_EQ(*t.Decode(std::vector<int32_t>{104, 105, 256}), "hi<|endoftext|>");
  auto bad = t.Decode(std::vector<int32_t>{1, 257});
  ASSERT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_THAT(bad.status().message(), HasSubstr("id 257 at position 1"));
  EXPECT_THAT(Gpt2().Decode(std::vector<int32_t>{-1}).status().message(),
              HasSubstr("id -1 at position 0 is outside the GPT-2 vocabulary"));
}

TEST(TokenizerTest, MakeTokenizerByName) {
  auto byte = MakeTokenizer("byte", "");
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ((*byte)->name(), "byte");
  auto gpt2 = MakeTokenizer("gpt2", "");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status().ToString();
  EXPECT_EQ((*gpt2)->vocab_size(), 50257);
  EXPECT_TRUE(MakeTokenizer("bpe", "").status().IsInvalidArgument());
}

// The vocabulary directory is searched for, not only compiled in: the
// environment first, then beside the binary, the working directory, the
// source tree; the first holding both files wins; the error lists them all.
TEST(TokenizerTest, VocabularyDirectorySearch) {
  TempDir root;
  const Gpt2VocabSearch search{.env_dir = root.File("env"),
                               .binary_dir = root.File("bin"),
                               .working_dir = root.File("work"),
                               .source_dir = root.File("src")};
  const std::vector<std::string> want = {root.File("env"), root.File("bin") + "/../share/gpt2-bpe",
                                         root.File("bin") + "/gpt2-bpe",
                                         root.File("work") + "/.cache/gpt2-bpe", root.File("src")};
  EXPECT_EQ(Gpt2VocabDirCandidates(search), want);
  Gpt2VocabSearch no_env = search;
  no_env.env_dir.reset();
  EXPECT_EQ(Gpt2VocabDirCandidates(no_env).front(), want[1]);

  auto none = FindGpt2VocabDir(search);
  ASSERT_TRUE(none.status().IsNotFound()) << none.status().ToString();
  for (const std::string& dir : want) EXPECT_THAT(none.status().ToString(), HasSubstr(dir));
  EXPECT_THAT(none.status().ToString(), HasSubstr("FLEET_GPT2_VOCAB_DIR"));

  auto fill = [](const std::string& dir, bool both) {
    std::filesystem::create_directories(dir);
    WritePlain(dir + "/encoder.json", "{}");
    if (both) WritePlain(dir + "/vocab.bpe", "#version: 0.2\n");
  };
  fill(want[4], true);  // the source tree's
  EXPECT_EQ(*FindGpt2VocabDir(search), want[4]);
  fill(want[3], false);  // half a vocabulary is skipped
  EXPECT_EQ(*FindGpt2VocabDir(search), want[4]);
  fill(want[3], true);  // the working directory's wins over the source tree's
  EXPECT_EQ(*FindGpt2VocabDir(search), want[3]);
  fill(want[1], true);  // beside the binary wins over the working directory
  EXPECT_EQ(*FindGpt2VocabDir(search), want[1]);
  fill(want[0], true);  // the environment wins over everything
  EXPECT_EQ(*FindGpt2VocabDir(search), want[0]);
}

// This process (a test binary in <build>/tests) finds the real files
// through one of the places searched, wherever the source tree is.
TEST(TokenizerTest, ThisProcessFindsTheVocabulary) {
  auto found = FindGpt2VocabDir(ProcessGpt2VocabSearch());
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_TRUE(std::filesystem::is_regular_file(*found + "/encoder.json")) << *found;
}

TEST(TokenizerTest, BadVocabularyFilesAreNamed) {
  TempDir dir;
  auto missing = Gpt2Tokenizer::Load(dir.path());
  ASSERT_TRUE(missing.status().IsNotFound());
  EXPECT_THAT(missing.status().message(), HasSubstr("encoder.json"));
  EXPECT_THAT(missing.status().message(), HasSubstr("scripts/setup.sh"));

  const std::string encoder = ReadPlain(DefaultGpt2VocabDir() + "/encoder.json");
  const std::string merges = ReadPlain(DefaultGpt2VocabDir() + "/vocab.bpe");
  struct Case {
    std::string encoder, merges;
    const char* file;
    const char* message;
  } cases[] = {
      {"{not json", merges, "encoder.json", "not a JSON object"},
      {R"({"a": 0, "b": 0})", merges, "encoder.json", "id 0 is repeated"},
      {R"({"a": 5})", merges, "encoder.json", "not an integer in [0, 1)"},
      {R"({" ": 0})", merges, "encoder.json", "is not byte-level BPE text"},
      {encoder, "#version: 0.2\nĠ t\nĠt he x\n", "vocab.bpe", "line 3 is not two byte-level"},
      {encoder, "#version: 0.2\nĠ t\nĠt zzzzqqqq\n", "vocab.bpe", "line 3 merges tokens"},
      {encoder, "#version: 0.2\n", "vocab.bpe", "no merges"},
  };
  for (const auto& c : cases) {
    WritePlain(dir.File("encoder.json"), c.encoder);
    WritePlain(dir.File("vocab.bpe"), c.merges);
    auto t = Gpt2Tokenizer::Load(dir.path());
    ASSERT_TRUE(t.status().IsCorruption()) << c.message << ": " << t.status().ToString();
    EXPECT_THAT(t.status().message(), HasSubstr(c.message));
    EXPECT_THAT(t.status().message(), HasSubstr(dir.File(c.file)));
  }
}

}  // namespace
}  // namespace fleet::data
