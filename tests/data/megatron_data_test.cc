// Megatron's data (data/megatron_data.h): the indexed dataset written and
// read back (tokenize's --output_format=megatron too), every malformed
// index refused naming the file and the problem, Megatron's split, and its
// three indices against an oracle that builds them with NumPy's own
// RandomState (tests/data/megatron_indices.py; those cases skip without
// /usr/bin/python3 and NumPy), then the samples' tokens.
#include "data/megatron_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/byte_io.h"
#include "data/tokenize_tool.h"
#include "tests/child_process.h"
#include "tests/data/test_util.h"

namespace fleet::data {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::WritePlain;

constexpr char kPython[] = "/usr/bin/python3";

// Documents of the given lengths, token j of document d = (d * 7 + j) % vocab.
std::vector<int32_t> Tokens(const std::vector<int64_t>& lens, int64_t vocab) {
  std::vector<int32_t> out;
  for (size_t d = 0; d < lens.size(); ++d) {
    for (int64_t j = 0; j < lens[d]; ++j) out.push_back(static_cast<int32_t>((d * 7 + j) % vocab));
  }
  return out;
}

TEST(MegatronIndexedData, WritesAndReadsEveryDtype) {
  TempDir dir;
  const std::vector<int64_t> lens = {5, 0, 12, 1};
  for (int64_t vocab : {257, 70000}) {
    const std::string prefix = dir.File("v" + std::to_string(vocab));
    const auto tokens = Tokens(lens, vocab);
    ASSERT_TRUE(WriteMegatronIndexed(prefix, tokens, lens, vocab).ok());
    auto data = MegatronIndexedData::Open(prefix);
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    EXPECT_EQ((*data)->dtype(), vocab < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32);
    ASSERT_EQ((*data)->num_sequences(), 4);
    EXPECT_EQ((*data)->doc_idx(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
    size_t at = 0;
    for (int64_t s = 0; s < 4; ++s) {
      ASSERT_EQ((*data)->size(s), lens[s]);
      std::vector<int32_t> got(lens[s]);
      ASSERT_TRUE((*data)->Read(s, 0, lens[s], vocab, got.data()).ok());
      EXPECT_EQ(got, std::vector<int32_t>(tokens.begin() + at, tokens.begin() + at + lens[s]));
      at += lens[s];
    }
    // An id beyond a smaller vocabulary names the file, sequence and token.
    std::vector<int32_t> two(2);
    const Status st = (*data)->Read(2, 10, 2, 10, two.data());
    EXPECT_TRUE(st.IsInvalidArgument());
    EXPECT_THAT(st.message(), HasSubstr("sequence 2, token 1"));
    EXPECT_THAT(st.message(), HasSubstr(prefix + ".bin"));
  }
  EXPECT_TRUE(WriteMegatronIndexed(dir.File("bad"), {{1, 2}}, {{3}}, 10).IsInvalidArgument());
  EXPECT_TRUE(WriteMegatronIndexed(dir.File("bad"), {{1, 12}}, {{2}}, 10).IsInvalidArgument());
}

// tokenize writes what Megatron's preprocess_data.py would name and hold.
TEST(MegatronIndexedData, TokenizeWritesIt) {
  TempDir dir;
  WritePlain(dir.File("a.jsonl"), "{\"text\": \"hello\"}\n{\"text\": \"megatron data\"}\n");
  TokenizeToolOptions o;
  o.input = dir.File("a.jsonl");
  o.text_format = "jsonl";
  o.tokenizer = "byte";
  o.output_prefix = dir.File("corpus");
  o.output_format = "megatron";
  std::ostringstream log;
  ASSERT_TRUE(RunTokenize(o, log).ok()) << log.str();
  EXPECT_EQ(MegatronOutputPrefix(o), dir.File("corpus_text_document"));
  auto data = MegatronIndexedData::Open(dir.File("corpus_text_document"));
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_EQ((*data)->num_sequences(), 2);
  // Each document's bytes and the end-of-text token (256).
  std::vector<int32_t> got((*data)->size(0));
  ASSERT_TRUE((*data)->Read(0, 0, got.size(), 257, got.data()).ok());
  EXPECT_EQ(got, (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o', 256}));
  EXPECT_EQ((*data)->size(1), 14);
}

// The .idx of a valid 3-sequence dataset, to break one field at a time.
struct IdxFields {
  std::string magic = std::string("MMIDIDX\0\0", 9);
  uint64_t version = 1;
  uint8_t code = 8;
  uint64_t count = 3, doc_count = 4;
  std::vector<int32_t> sizes = {2, 3, 1};
  std::vector<int64_t> pointers = {0, 4, 10};
  std::vector<int64_t> doc_idx = {0, 1, 2, 3};
  std::string Bytes() const {
    std::string out;
    ByteWriter w(&out);
    w.PutBytes(magic);
    w.Put(version);
    w.Put(code);
    w.Put(count);
    w.Put(doc_count);
    for (int32_t s : sizes) w.Put(s);
    for (int64_t p : pointers) w.Put(p);
    for (int64_t d : doc_idx) w.Put(d);
    return out;
  }
};

TEST(MegatronIndexedData, RefusesMalformedIndexesNamingTheProblem) {
  TempDir dir;
  const std::string prefix = dir.File("x");
  WritePlain(prefix + ".bin", std::string(12, '\1'));  // 6 uint16 tokens
  auto open_with = [&](const std::string& idx) {
    WritePlain(prefix + ".idx", idx);
    auto d = MegatronIndexedData::Open(prefix);
    return d.ok() ? Status::OK() : d.status();
  };
  ASSERT_TRUE(open_with(IdxFields{}.Bytes()).ok());
  struct Case {
    std::function<void(IdxFields&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](IdxFields& f) { f.magic[0] = 'X'; }, "no MMIDIDX header"},
      {[](IdxFields& f) { f.version = 2; }, "index version 2"},
      {[](IdxFields& f) { f.code = 6; }, "dtype code 6 is not an integer type"},
      {[](IdxFields& f) { f.code = 1; }, "dtype code 1 (8 or 16-bit integers)"},
      {[](IdxFields& f) { f.count = 1000000; }, "declares 1000000 sequences"},
      {[](IdxFields& f) { f.sizes[1] = -1; }, "sequence 1 has size -1"},
      {[](IdxFields& f) { f.pointers[2] = 12; },
       "sequence 2 at byte 12 with 1 tokens lies outside"},
      {[](IdxFields& f) { f.pointers[1] = 3; }, "sequence 1 at byte 3"},
      {[](IdxFields& f) { f.doc_idx[2] = 0; }, "document index entry 2 is 0"},
      {[](IdxFields& f) { f.doc_idx[3] = 9; }, "document index entry 3 is 9"},
      {[](IdxFields& f) { f.doc_idx.push_back(3); }, "8 bytes after the document index"},
  };
  for (const Case& c : cases) {
    IdxFields f;
    c.edit(f);
    const Status st = open_with(f.Bytes());
    EXPECT_FALSE(st.ok()) << c.says;
    EXPECT_THAT(st.message(), HasSubstr(c.says));
    EXPECT_THAT(st.ToString(), HasSubstr(prefix + ".idx"));
  }
  // Every truncation is refused (never read past the end).
  const std::string whole = IdxFields{}.Bytes();
  for (size_t n = 0; n < whole.size(); ++n) {
    EXPECT_TRUE(open_with(whole.substr(0, n)).IsCorruption()) << n << " bytes";
  }
  WritePlain(prefix + ".idx", whole);
  WritePlain(prefix + ".bin", std::string(11, '\1'));
  EXPECT_THAT(MegatronIndexedData::Open(prefix).status().message(),
              HasSubstr("11 bytes is not a whole number of <u2 tokens"));
  EXPECT_TRUE(MegatronIndexedData::Open(dir.File("missing")).status().IsNotFound());
}

// Megatron's RandomState(seed).shuffle, bit for bit: the generator is
// MT19937 seeded as numpy seeds it, the bounded draws rejection-sampled.
TEST(MegatronIndices, ShuffleIsNumpys) {
  // Values numpy 1.24 gives (np.random.RandomState(1234).shuffle of
  // arange(10), then of arange(5) from the same stream).
  std::mt19937 rng(1234);
  std::vector<int32_t> a(10), b(5);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  NumpyShuffle(rng, std::span<int32_t>(a));
  NumpyShuffle(rng, std::span<int32_t>(b));
  EXPECT_EQ(a, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(b, (std::vector<int32_t>{0, 4, 3, 2, 1}));
}

std::string NumpyMissing() {
  if (::access(kPython, X_OK) != 0) return std::string(kPython) + " is missing";
  if (fleet::testing::RunCommand(std::string(kPython) + " -c 'import numpy'").exit_code != 0) {
    return "NumPy is missing for /usr/bin/python3 (apt-get install python3-numpy)";
  }
  return "";
}

std::vector<int64_t> ParseLine(std::istream& in) {
  std::string line;
  std::getline(in, line);
  std::istringstream words(line);
  std::vector<int64_t> out;
  for (int64_t v; words >> v;) out.push_back(v);
  return out;
}

// The doc, sample and shuffle indices equal the NumPy oracle's for one and
// several epochs, each split part, and another seed; each sample's tokens
// are the documents the sample index says, seq_len + 1 of them, and
// consecutive samples (before shuffling) share one token.
TEST(MegatronIndices, MatchNumpysAndSamplesFollowThem) {
  if (const std::string why = NumpyMissing(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  std::vector<int64_t> lens;
  std::mt19937 len_rng(5);
  for (int i = 0; i < 60; ++i) lens.push_back(1 + len_rng() % 40);
  const int64_t vocab = 50000;
  const auto tokens = Tokens(lens, vocab);
  const std::string prefix = dir.File("corpus");
  ASSERT_TRUE(WriteMegatronIndexed(prefix, tokens, lens, vocab).ok());
  std::string sizes_text;
  for (int64_t l : lens) sizes_text += std::to_string(l) + "\n";
  WritePlain(dir.File("sizes.txt"), sizes_text);
  auto data = MegatronIndexedData::Open(prefix);
  ASSERT_TRUE(data.ok()) << data.status().ToString();

  struct Case {
    int part;
    int64_t num_samples, seq_len;
    uint64_t seed;
  };
  for (const Case& c :
       {Case{0, 20, 16, 1234}, Case{0, 400, 16, 1234}, Case{1, 5, 8, 7}, Case{0, 3, 64, 99}}) {
    SCOPED_TRACE(absl::StrCat("part ", c.part, ", ", c.num_samples, " samples of ", c.seq_len,
                              ", seed ", c.seed));
    MegatronSamplesOptions o;
    o.seq_len = c.seq_len;
    o.vocab_size = vocab;
    o.split = {949, 50, 1};
    o.part = c.part;
    o.num_samples = c.num_samples;
    o.seed = c.seed;
    auto samples = MegatronGptSamples::Open(*data, o);
    ASSERT_TRUE(samples.ok()) << samples.status().ToString();
    const auto bounds = SplitBoundaries(o.split, 60);
    const std::string cmd =
        absl::StrCat(kPython, " ", testing::SourcePath("tests/data/megatron_indices.py"), " ",
                     dir.File("sizes.txt"), " ", bounds[c.part], " ", bounds[c.part + 1], " ",
                     c.num_samples, " ", c.seq_len, " ", c.seed);
    const auto run = fleet::testing::RunCommand(cmd);
    ASSERT_EQ(run.exit_code, 0) << cmd << "\n" << run.output;
    std::istringstream out(run.output);
    const auto doc_idx = ParseLine(out), sample_idx = ParseLine(out), shuffle = ParseLine(out);
    const MegatronGptSamples& s = **samples;
    EXPECT_EQ(std::vector<int64_t>(s.doc_index().begin(), s.doc_index().end()), doc_idx);
    EXPECT_EQ(s.sample_index(), sample_idx);
    EXPECT_EQ(s.shuffle_index(), shuffle);
    EXPECT_GE(s.num_samples(), c.num_samples);
    if (c.num_samples == 400) {
      EXPECT_GT(s.epochs(), 1);
    }

    // Samples: the tokens the indices point at.
    std::vector<int32_t> sample(c.seq_len + 1), in(c.seq_len), target(c.seq_len);
    for (int64_t id = 0; id < s.num_samples(); id += 3) {
      ASSERT_TRUE(s.ReadSample(id, sample.data()).ok());
      const int64_t k = s.shuffle_index()[id];
      std::vector<int32_t> want;
      for (int64_t pos = s.sample_index()[2 * k], off = s.sample_index()[2 * k + 1];
           static_cast<int64_t>(want.size()) < c.seq_len + 1; ++pos, off = 0) {
        const int64_t d = s.doc_index()[pos];
        size_t start = 0;
        for (int64_t e = 0; e < d; ++e) start += lens[e];
        for (int64_t j = off; j < lens[d] && static_cast<int64_t>(want.size()) < c.seq_len + 1;
             ++j) {
          want.push_back(tokens[start + j]);
        }
      }
      ASSERT_EQ(sample, want) << "sample " << id;
      const int64_t ids[1] = {id};
      ASSERT_TRUE(s.ReadInputsAndTargets(ids, in.data(), target.data()).ok());
      EXPECT_EQ(in, std::vector<int32_t>(sample.begin(), sample.end() - 1));
      EXPECT_EQ(target, std::vector<int32_t>(sample.begin() + 1, sample.end()));
    }
  }
  MegatronSamplesOptions tiny;
  tiny.seq_len = 100000;
  tiny.num_samples = 1;
  tiny.vocab_size = vocab;
  EXPECT_THAT(MegatronGptSamples::Open(*data, tiny).status().message(),
              HasSubstr("one sample of seq_len 100000 needs 100001"));
  tiny.seq_len = 8;
  auto built = MegatronGptSamples::Open(*data, tiny);
  ASSERT_TRUE(built.ok());
  std::vector<int32_t> row(9);
  EXPECT_TRUE((*built)->ReadSample((*built)->num_samples(), row.data()).IsInvalidArgument());
  EXPECT_TRUE((*built)->ReadSample(-1, row.data()).IsInvalidArgument());
}

}  // namespace
}  // namespace fleet::data
