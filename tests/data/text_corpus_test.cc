#include "data/text_corpus.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "tests/data/test_util.h"
#include "collective/config/gpt_data.h"
#include "data/token_files.h"
#include "data/tokenize_tool.h"

namespace fleet::data {
namespace {

using ::testing::HasSubstr;
using testing::SourcePath;
using testing::TempDir;
using testing::WritePlain;

std::vector<std::string> Split(std::string_view text, TextFormat f) {
  auto docs = SplitDocuments(text, f, "t.txt");
  EXPECT_TRUE(docs.ok()) << docs.status().ToString();
  return docs.ok() ? *docs : std::vector<std::string>{};
}

using Docs = std::vector<std::string>;

TEST(TextCorpusTest, SplitsDocumentsInEveryFormat) {
  const std::string text = "one\r\ntwo\n\n\nthree\n%\nfour\n  \nfive";
  EXPECT_EQ(Split(text, TextFormat::kFile), Docs{text});
  EXPECT_EQ(Split("", TextFormat::kFile), Docs{});
  EXPECT_EQ(Split(text, TextFormat::kLine),
            (Docs{"one", "two", "three", "%", "four", "  ", "five"}));
  EXPECT_EQ(Split(text, TextFormat::kBlankLine), (Docs{"one\ntwo", "three\n%\nfour", "five"}));
  EXPECT_EQ(Split(text, TextFormat::kPercent), (Docs{"one\ntwo\n\n\nthree", "four\n  \nfive"}));
  EXPECT_EQ(Split("%\n%\na\n%\n", TextFormat::kPercent), Docs{"a"});
  EXPECT_EQ(
      Split("{\"text\": \"a\\nb\", \"n\": 1}\n\n{\"text\": \"\\u00e9\"}\r\n{\"text\": \"\"}\n",
            TextFormat::kJsonl),
      (Docs{"a\nb", "é"}));
  auto bad = SplitDocuments("{\"text\": \"ok\"}\n[1, 2]\n", TextFormat::kJsonl, "x.jsonl");
  ASSERT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_THAT(bad.status().message(), HasSubstr("x.jsonl:2"));
  auto nokey = SplitDocuments("{\"body\": \"a\"}\n", TextFormat::kJsonl, "y.jsonl");
  EXPECT_THAT(nokey.status().message(), HasSubstr("no string field \"text\": y.jsonl:1"));
  EXPECT_TRUE(ParseTextFormat("blank_line").ok());
  EXPECT_THAT(ParseTextFormat("csv").status().message(), HasSubstr("not one of file, line"));
}

TEST(TextCorpusTest, TokenizesDocumentsWithEndOfTextAfterEach) {
  TempDir dir;
  WritePlain(dir.File("a.txt"), "ab\n%\nc\n");
  WritePlain(dir.File("b.txt"), "%\nde\n");
  ByteTokenizer byte;
  TextCorpusOptions o;
  o.files = {dir.File("a.txt"), dir.File("b.txt")};
  o.format = TextFormat::kPercent;
  o.shuffle_documents = false;
  auto t = TokenizeTextFiles(o, byte);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->tokens, (std::vector<int32_t>{'a', 'b', 256, 'c', 256, 'd', 'e', 256}));
  EXPECT_EQ(t->doc_lens, (std::vector<int64_t>{3, 2, 3}));

  // Shuffled: the same documents in another, fixed order.
  o.files = {dir.File("many.txt")};
  std::string many;
  for (int i = 0; i < 50; ++i) many += std::to_string(i) + "\n%\n";
  WritePlain(dir.File("many.txt"), many);
  o.shuffle_documents = true;
  auto s1 = TokenizeTextFiles(o, byte);
  auto s2 = TokenizeTextFiles(o, byte);
  o.shuffle_documents = false;
  auto plain = TokenizeTextFiles(o, byte);
  ASSERT_TRUE(s1.ok() && s2.ok() && plain.ok());
  EXPECT_EQ(s1->tokens, s2->tokens);
  EXPECT_NE(s1->tokens, plain->tokens);
  std::vector<int32_t> a = s1->tokens, b = plain->tokens;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);

  o.files = {dir.File("none.txt")};
  EXPECT_TRUE(TokenizeTextFiles(o, byte).status().IsNotFound());
  WritePlain(dir.File("empty.txt"), "%\n%\n");
  o.files = {dir.File("empty.txt")};
  o.format = TextFormat::kPercent;
  EXPECT_THAT(TokenizeTextFiles(o, byte).status().message(), HasSubstr("no documents"));
}

TEST(TextCorpusTest, TokenCacheIsBuiltOnceAndRebuiltWhenInputsChange) {
  TempDir dir;
  WritePlain(dir.File("a.txt"), "hello\n%\nworld\n");
  ByteTokenizer byte;
  TextCorpusOptions o;
  o.files = {dir.File("a.txt")};
  o.format = TextFormat::kPercent;
  const std::string cache = dir.File("cache/tokens");
  auto p1 = BuildTokenCache(o, byte, cache, "text");
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  EXPECT_THAT(*p1, HasSubstr("cache/tokens/text_byte_"));
  auto d = OpenFleetXData(*p1);
  ASSERT_TRUE(d.ok());
  auto direct = TokenizeTextFiles(o, byte);
  ASSERT_TRUE(direct.ok());
  std::vector<int32_t> cached(d->ids.size());
  d->ids.CopyTo(0, d->ids.size(), cached.data());
  EXPECT_EQ(cached, direct->tokens);
  EXPECT_EQ(d->lens, direct->doc_lens);

  const auto written = std::filesystem::last_write_time(*p1 + "_ids.npy");
  auto p2 = BuildTokenCache(o, byte, cache, "text");
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(*p2, *p1);
  EXPECT_EQ(std::filesystem::last_write_time(*p1 + "_ids.npy"), written);  // reused

  WritePlain(dir.File("a.txt"), "hello\n%\nworld, again\n");
  auto p3 = BuildTokenCache(o, byte, cache, "text");
  ASSERT_TRUE(p3.ok());
  EXPECT_NE(*p3, *p1);
  o.format = TextFormat::kFile;
  EXPECT_NE(*BuildTokenCache(o, byte, cache, "text"), *p3);

  WritePlain(dir.File("blocker"), "a file where the cache directory should be");
  Status st = BuildTokenCache(o, byte, dir.File("blocker/sub"), "text").status();
  EXPECT_TRUE(st.IsIOError()) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("blocker/sub"));
}

TEST(TextCorpusTest, DefaultCorpusIsTheFortunesPackage) {
  auto files = DefaultCorpusFiles();
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_GE(files->size(), 20u);
  for (const auto& f : *files) {
    EXPECT_FALSE(f.ends_with(".dat") || f.ends_with(".u8")) << f;
  }
  TempDir dir;
  auto none = DefaultCorpusFiles(dir.path());
  ASSERT_TRUE(none.status().IsNotFound());
  EXPECT_THAT(none.status().message(), HasSubstr("apt-get install fortunes"));
}

TEST(TextCorpusTest, Gpt2TokensOfTheDefaultCorpusAreGpt3EncodersOwn) {
  // fixtures/check_fortunes_gpt2.js compared every token of this with the
  // npm package gpt-3-encoder (identical); pinned here by count and hash.
  auto files = DefaultCorpusFiles();
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  auto gpt2 = MakeTokenizer("gpt2", "");
  ASSERT_TRUE(gpt2.ok()) << gpt2.status().ToString();
  TextCorpusOptions o;
  o.files = *files;
  o.format = TextFormat::kPercent;
  o.shuffle_documents = false;
  auto t = TokenizeTextFiles(o, **gpt2);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the uint16 little-endian bytes
  for (int32_t id : t->tokens) {
    for (int shift : {0, 8}) h = (h ^ ((id >> shift) & 0xff)) * 0x100000001b3ULL;
  }
  EXPECT_EQ(t->doc_lens.size(), 15217u);
  EXPECT_EQ(t->tokens.size(), 701304u);
  EXPECT_EQ(h, 0x6cbc64a250fc60b9ULL);
}

// The tiny config as shipped, with its token cache in a temporary directory.
trainer::config::GptJobConfig TinyConfig(const TempDir& dir,
                                         std::vector<std::string> overrides = {}) {
  overrides.push_back("Data.Train.dataset.cache_dir=" + dir.File("cache"));
  overrides.push_back("Data.Eval.dataset.cache_dir=" + dir.File("cache"));
  auto c = trainer::config::LoadGptJobConfig(SourcePath("configs/gpt/pretrain_gpt_tiny.yaml"),
                                             overrides);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

TEST(TextCorpusTest, TinyConfigTrainsOnTheDefaultCorpusWithAHeldOutPart) {
  TempDir dir;
  const trainer::config::GptJobConfig config = TinyConfig(dir);
  auto train = OpenConfiguredDataset(config, DataPart::kTrain);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  auto eval = OpenConfiguredDataset(config, DataPart::kEval);
  ASSERT_TRUE(eval.ok()) << eval.status().ToString();
  const auto [tb, te] = (*train)->range();
  const auto [eb, ee] = (*eval)->range();
  EXPECT_EQ(tb, 0);
  EXPECT_EQ(te, eb);  // eval follows train, no overlap
  const int64_t total = (*train)->corpus().num_tokens();
  EXPECT_GT(total, 2'000'000);  // ~2.6 MB of fortunes, one byte per token
  EXPECT_NEAR(static_cast<double>(ee - eb) / total, 0.05, 0.01);
  EXPECT_EQ((*train)->sample_tokens(), 129);
  std::vector<int32_t> s(129);
  ASSERT_TRUE((*eval)->ReadSample((*eval)->num_samples() - 1, s.data()).ok());
  for (int32_t id : s) EXPECT_TRUE(id >= 0 && id < 257);
  // Held-out text is text.
  auto tokenizer = OpenConfiguredTokenizer(config.data.eval.dataset);
  ASSERT_TRUE(tokenizer.ok());
  auto text = (*tokenizer)->Decode(s);
  ASSERT_TRUE(text.ok());
  EXPECT_GT(std::count_if(text->begin(), text->end(), ::isalpha), 40) << *text;

  EXPECT_EQ(OpenConfiguredDataset(config, DataPart::kTest).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(TextCorpusTest, ConfiguredTokenFilesOpenAndBadOnesAreNamed) {
  TempDir dir;
  std::vector<int32_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 250);
  ASSERT_TRUE(std::filesystem::create_directories(dir.File("fleetx")));
  ASSERT_TRUE(
      WriteFleetXData(dir.File("fleetx/part_a"), tokens, std::vector<int64_t>{100, 200}, 257).ok());
  ASSERT_TRUE(std::filesystem::create_directories(dir.File("bin")));
  ASSERT_TRUE(WriteLlmcShard(dir.File("bin/s_000000.bin"), tokens).ok());
  ASSERT_TRUE(std::filesystem::create_directories(dir.File("empty")));

  auto fleetx = TinyConfig(
      dir, {"Data.Train.dataset.name=GPTDataset",
            "Data.Train.dataset.input_dir=" + dir.File("fleetx"), "Data.Train.dataset.split=[1]"});
  auto ds = OpenConfiguredDataset(fleetx, DataPart::kTrain);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ((*ds)->num_samples(), 2);  // (300 - 1) / 128

  auto bin = TinyConfig(dir, {"Data.Train.dataset.name=TokenBinDataset",
                              "Data.Train.dataset.input_files=" + dir.File("bin/*.bin"),
                              "Data.Train.dataset.split=[1]"});
  ASSERT_TRUE(OpenConfiguredDataset(bin, DataPart::kTrain).ok());

  auto empty = TinyConfig(dir, {"Data.Train.dataset.name=GPTDataset",
                                "Data.Train.dataset.input_dir=" + dir.File("empty")});
  Status st = OpenConfiguredDataset(empty, DataPart::kTrain).status();
  ASSERT_TRUE(st.IsNotFound()) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("Data.Train.dataset.input_dir: no *_ids.npy"));

  auto missing = TinyConfig(dir, {"Data.Train.dataset.name=TokenBinDataset",
                                  "Data.Train.dataset.input_files=" + dir.File("nope.bin")});
  st = OpenConfiguredDataset(missing, DataPart::kTrain).status();
  ASSERT_TRUE(st.IsNotFound()) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("Data.Train.dataset.input_files"));
  EXPECT_THAT(st.message(), HasSubstr("nope.bin"));

  // Ids of a GPT-2 corpus are beyond the tiny model's 257.
  std::vector<int32_t> wide = tokens;
  wide[200] = 50256;
  ASSERT_TRUE(WriteLlmcShard(dir.File("bin/s_000000.bin"), wide).ok());
  auto big = OpenConfiguredDataset(bin, DataPart::kTrain);
  ASSERT_TRUE(big.ok());
  std::vector<int32_t> s(129);
  st = (*big)->ReadSample(1, s.data());
  ASSERT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("token id 50256 at token 200"));
}

TEST(TextCorpusTest, TokenizeToolWritesShardsAndFleetXFiles) {
  TempDir dir;
  WritePlain(dir.File("a.txt"), "Hello world\n\nSecond paragraph here.\n");
  TokenizeToolOptions o;
  o.input = dir.File("a.txt");
  o.text_format = "blank_line";
  o.tokenizer = "gpt2";
  o.output_prefix = dir.File("out");
  o.output_format = "both";
  o.shard_tokens = 4;
  std::ostringstream log;
  Status st = RunTokenize(o, log);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_THAT(log.str(), HasSubstr("2 documents"));
  // "Hello world" + EOT, then the second paragraph + EOT.
  auto fx = OpenFleetXData(dir.File("out"));
  ASSERT_TRUE(fx.ok()) << fx.status().ToString();
  ASSERT_GE(fx->ids.size(), 5);
  EXPECT_EQ(fx->ids.Get(0), 15496);
  EXPECT_EQ(fx->ids.Get(1), 995);
  EXPECT_EQ(fx->ids.Get(2), 50256);
  EXPECT_EQ(fx->lens[0], 3);
  // The shards hold the same tokens, 4 at a time.
  std::vector<std::string> shards;
  for (int s = 0;; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "out_%06d.bin", s);
    if (!std::filesystem::exists(dir.File(name))) break;
    shards.push_back(dir.File(name));
  }
  auto corpus = TokenCorpus::OpenLlmc(shards);
  ASSERT_TRUE(corpus.ok());
  ASSERT_EQ((*corpus)->num_tokens(), fx->ids.size());
  EXPECT_EQ(shards.size(), static_cast<size_t>((fx->ids.size() + 3) / 4));
  std::vector<int32_t> from_bin(fx->ids.size()), from_npy(fx->ids.size());
  ASSERT_TRUE((*corpus)->Read(0, fx->ids.size(), 50257, from_bin.data()).ok());
  fx->ids.CopyTo(0, fx->ids.size(), from_npy.data());
  EXPECT_EQ(from_bin, from_npy);

  o.output_format = "parquet";
  EXPECT_THAT(RunTokenize(o, log).message(), HasSubstr("--output_format"));
  o.output_format = "bin";
  o.text_format = "xml";
  EXPECT_THAT(RunTokenize(o, log).message(), HasSubstr("--text_format"));
  o.text_format = "file";
  o.input = dir.File("missing.txt");
  EXPECT_TRUE(RunTokenize(o, log).IsNotFound());
}

}  // namespace
}  // namespace fleet::data
