// PromptResponseDataset (data/prompt_response.h): which positions
// carry a target (the response's tokens and end-of-text, never the prompt's
// or the padding's), truncation, the split into parts, and malformed JSONL
// lines named by file:line.
#include "data/prompt_response.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/data/test_util.h"
#include "data/tokenizer.h"

namespace fleet::data {
namespace {

using testing::TempDir;
using testing::WriteGzip;
using testing::WritePlain;

constexpr int32_t kEot = ByteTokenizer::kEot;

Result<std::unique_ptr<PromptResponseDataset>> Open(const std::vector<std::string>& files,
                                                    int64_t seq_len,
                                                    std::vector<double> split = {1, 0, 0},
                                                    int part = 0) {
  ByteTokenizer tokenizer;
  return PromptResponseDataset::Open(
      files, tokenizer, {.seq_len = seq_len, .vocab_size = 257, .split = split, .part = part});
}

TEST(PromptResponseTest, OnlyResponseTokensAndEndOfTextAreTargets) {
  TempDir dir;
  WritePlain(dir.File("a.jsonl"),
             "{\"prompt\": \"ab\", \"response\": \"XY\", \"id\": 7}\n\n"
             "{\"response\": \"Z\", \"prompt\": \"q\"}\n");
  auto d = Open({dir.File("a.jsonl")}, 8);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ((*d)->num_samples(), 2);
  std::vector<int32_t> tokens(16), targets(16);
  const std::vector<int64_t> ids = {0, 1};
  ASSERT_TRUE((*d)->ReadInputsAndTargets(ids, tokens.data(), targets.data()).ok());
  // "ab" "XY" eot: inputs a b X Y eot, padded with eot; position 0 (a ->
  // b) is the prompt's, so no target; b -> X, X -> Y, Y -> eot are targets.
  EXPECT_EQ(tokens, (std::vector<int32_t>{'a', 'b', 'X', 'Y', kEot, kEot, kEot, kEot,  //
                                          'q', 'Z', kEot, kEot, kEot, kEot, kEot, kEot}));
  EXPECT_EQ(targets, (std::vector<int32_t>{-1, 'X', 'Y', kEot, -1, -1, -1, -1,  //
                                           'Z', kEot, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ((*d)->prompt_tokens(0), 2);
}

TEST(PromptResponseTest, LongPairsLoseTheirResponsesTailNeverThePrompt) {
  TempDir dir;
  WriteGzip(dir.File("a.jsonl.gz"), "{\"prompt\": \"abc\", \"response\": \"VWXYZ\"}\n");
  auto d = Open({dir.File("a.jsonl.gz")}, 4);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::vector<int32_t> tokens(4), targets(4);
  const std::vector<int64_t> ids = {0};
  ASSERT_TRUE((*d)->ReadInputsAndTargets(ids, tokens.data(), targets.data()).ok());
  EXPECT_EQ(tokens, (std::vector<int32_t>{'a', 'b', 'c', 'V'}));
  EXPECT_EQ(targets, (std::vector<int32_t>{-1, -1, 'V', 'W'}));

  // A prompt that fills the sequence leaves no response token: refused.
  WritePlain(dir.File("b.jsonl"),
             "{\"prompt\": \"a\", \"response\": \"b\"}\n"
             "{\"prompt\": \"abcde\", \"response\": \"b\"}\n");
  const Status st = Open({dir.File("b.jsonl")}, 4).status();
  EXPECT_TRUE(st.IsInvalidArgument());
  EXPECT_NE(st.ToString().find(dir.File("b.jsonl") + ":2"), std::string::npos) << st.ToString();
  EXPECT_NE(st.ToString().find("no room for the response"), std::string::npos) << st.ToString();
}

TEST(PromptResponseTest, MalformedLinesAreNamedByFileAndLine) {
  TempDir dir;
  const std::string good = "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  const struct {
    std::string line;
    std::string reason;
  } cases[] = {
      {"{\"prompt\": \"a\", \"response\": \"b\"", "not a JSON object"},
      {"[\"a\", \"b\"]", "not a JSON object"},
      {"{\"prompt\": \"a\"}", "needs string fields"},
      {"{\"prompt\": \"a\", \"response\": 3}", "needs string fields"},
      {"{\"text\": \"a\"}", "needs string fields"},
  };
  WritePlain(dir.File("good.jsonl"), good);
  for (const auto& c : cases) {
    // Line 3 of the second file (the first file's lines do not count).
    WritePlain(dir.File("bad.jsonl"), good + good + c.line + "\n" + good);
    const Status st = Open({dir.File("good.jsonl"), dir.File("bad.jsonl")}, 8).status();
    EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
    EXPECT_NE(st.ToString().find(dir.File("bad.jsonl") + ":3"), std::string::npos) << st.ToString();
    EXPECT_NE(st.ToString().find(c.reason), std::string::npos) << st.ToString();
  }
  EXPECT_TRUE(Open({dir.File("none.jsonl")}, 8).status().IsNotFound());
}

TEST(PromptResponseTest, PartsAreCutByPairCount) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 10; ++i) {
    text += "{\"prompt\": \"p\", \"response\": \"" + std::string(1, static_cast<char>('A' + i)) +
            "\"}\n";
  }
  WritePlain(dir.File("a.jsonl"), text);
  auto train = Open({dir.File("a.jsonl")}, 4, {8, 2, 0}, 0);
  auto eval = Open({dir.File("a.jsonl")}, 4, {8, 2, 0}, 1);
  ASSERT_TRUE(train.ok() && eval.ok());
  EXPECT_EQ((*train)->num_samples(), 8);
  ASSERT_EQ((*eval)->num_samples(), 2);
  EXPECT_EQ((*eval)->pair_ids(0)[1], 'I');  // pairs 8 and 9
  EXPECT_TRUE(Open({dir.File("a.jsonl")}, 4, {8, 2, 0}, 2).status().IsInvalidArgument());
  ByteTokenizer tokenizer;
  EXPECT_NE(PromptResponseDataset::Open({dir.File("a.jsonl")}, tokenizer, {.vocab_size = 100})
                .status()
                .ToString()
                .find("Model.vocab_size"),
            std::string::npos);
}

}  // namespace
}  // namespace fleet::data
