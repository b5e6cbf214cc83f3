#include "data/token_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "tests/child_process.h"
#include "tests/data/test_util.h"

namespace fleet::data {
namespace {

using testing::Fixture;
using ::testing::HasSubstr;
using testing::ReadPlain;
using testing::TempDir;
using testing::WritePlain;

// Copies a fixture into `dir` under `name`, optionally cutting or patching it.
std::string CopyFixture(const TempDir& dir, const std::string& fixture, const std::string& name,
                        int cut = 0) {
  std::string bytes = ReadPlain(Fixture(fixture));
  bytes.erase(bytes.size() - std::min(bytes.size(), static_cast<size_t>(cut)));
  WritePlain(dir.File(name), bytes);
  return dir.File(name);
}

TEST(TokenFilesTest, ReadsFleetXFilesNumPyWrote) {
  auto d = OpenFleetXData(Fixture("fleetx_u2"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->ids.dtype(), TokenDtype::kUint16);
  ASSERT_EQ(d->ids.size(), 15);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(d->ids.Get(i), 100 + i);
  EXPECT_EQ(d->lens, (std::vector<int64_t>{3, 4, 1, 5, 2}));
  std::vector<int32_t> out(5);
  d->ids.CopyTo(10, 5, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{110, 111, 112, 113, 114}));

  // int32 ids in a version 2.0 .npy, a deflated .npz without `docs`.
  auto wide = OpenFleetXData(Fixture("fleetx_i4"));
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  EXPECT_EQ(wide->ids.dtype(), TokenDtype::kInt32);
  EXPECT_EQ(wide->ids.Get(0), 70000);
  EXPECT_EQ(wide->ids.Get(4), 65535);
  EXPECT_EQ(wide->lens, (std::vector<int64_t>{2, 4}));
}

TEST(TokenFilesTest, RefusesArraysItCannotRead) {
  struct Case {
    const char* file;
    const char* message;
  } cases[] = {
      {"bad_2d.npy", "must be a 1-D array, has 2 dimensions"},
      {"bad_big_endian.npy", "dtype '>u2' is not a little-endian"},
      {"bad_float.npy", "dtype '<f4' is not a little-endian"},
  };
  for (const auto& c : cases) {
    auto a = OpenNpyTokens(Fixture(c.file));
    ASSERT_TRUE(a.status().IsInvalidArgument()) << c.file;
    EXPECT_THAT(a.status().message(), HasSubstr(c.message));
    EXPECT_THAT(a.status().message(), HasSubstr(c.file));
  }
  EXPECT_TRUE(OpenNpyTokens(Fixture("missing.npy")).status().IsNotFound());
}

TEST(TokenFilesTest, CorruptNpyFilesAreCorruptionNamingTheFile) {
  TempDir dir;
  std::string good = ReadPlain(Fixture("fleetx_u2_ids.npy"));
  struct Case {
    std::string name;
    std::string bytes;
    const char* message;
  } cases[] = {
      {"cut.npy", good.substr(0, good.size() - 1),
       "header says 15 x <u2 (158 bytes), file has 157"},
      {"long.npy", good + "x", "file has 159 bytes"},
      {"magic.npy", "\x92" + good.substr(1), "bad magic"},
      {"short.npy", good.substr(0, 40), "truncated .npy header"},
      {"dict.npy", std::string(good).replace(good.find("descr"), 5, "dexcr"), "cannot parse"},
      {"version.npy", std::string(good).replace(6, 1, "\x07"), "version 7 is unknown"},
      {"empty.npy", "", "bad magic"},
  };
  for (const auto& c : cases) {
    WritePlain(dir.File(c.name), c.bytes);
    auto a = OpenNpyTokens(dir.File(c.name));
    ASSERT_TRUE(a.status().IsCorruption()) << c.name << ": " << a.status().ToString();
    EXPECT_THAT(a.status().message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(a.status().message(), HasSubstr(dir.File(c.name)));
  }
}

TEST(TokenFilesTest, BadIndexFilesAreRefused) {
  TempDir dir;
  // ids of one pair with the index of another: the lengths disagree.
  CopyFixture(dir, "fleetx_u2_ids.npy", "mixed_ids.npy");
  CopyFixture(dir, "fleetx_i4_idx.npz", "mixed_idx.npz");
  auto mixed = OpenFleetXData(dir.File("mixed"));
  ASSERT_TRUE(mixed.status().IsCorruption());
  EXPECT_THAT(mixed.status().message(), HasSubstr("lens sum to 6 tokens but"));
  EXPECT_THAT(mixed.status().message(), HasSubstr("mixed_idx.npz"));

  CopyFixture(dir, "fleetx_u2_ids.npy", "cut_ids.npy");
  CopyFixture(dir, "fleetx_u2_idx.npz", "cut_idx.npz", 100);
  auto cut = OpenFleetXData(dir.File("cut"));
  ASSERT_TRUE(cut.status().IsCorruption()) << cut.status().ToString();
  EXPECT_THAT(cut.status().message(), HasSubstr("cut_idx.npz"));

  CopyFixture(dir, "fleetx_u2_ids.npy", "notzip_ids.npy");
  CopyFixture(dir, "fleetx_u2_ids.npy", "notzip_idx.npz");
  auto notzip = OpenFleetXData(dir.File("notzip"));
  ASSERT_TRUE(notzip.status().IsCorruption()) << notzip.status().ToString();
  EXPECT_THAT(notzip.status().message(), HasSubstr("not a readable .npz"));

  auto member = ReadNpzIntArray(Fixture("fleetx_u2_idx.npz"), "sizes");
  ASSERT_TRUE(member.status().IsNotFound());
  EXPECT_THAT(member.status().message(), HasSubstr("no member 'sizes.npy'"));

  CopyFixture(dir, "fleetx_u2_ids.npy", "noidx_ids.npy");
  auto noidx = OpenFleetXData(dir.File("noidx"));
  ASSERT_TRUE(noidx.status().IsNotFound());
  EXPECT_THAT(noidx.status().message(), HasSubstr("noidx_idx.npz"));
}

TEST(TokenFilesTest, WrittenFleetXDataReadsBackHereAndInNumPy) {
  TempDir dir;
  const std::vector<int32_t> tokens = {5, 0, 256, 7, 7, 1, 255};
  const std::vector<int64_t> lens = {3, 0, 4};
  ASSERT_TRUE(WriteFleetXData(dir.File("small"), tokens, lens, 257).ok());
  auto d = OpenFleetXData(dir.File("small"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->ids.dtype(), TokenDtype::kUint16);
  std::vector<int32_t> back(tokens.size());
  d->ids.CopyTo(0, tokens.size(), back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ(d->lens, lens);

  // A vocabulary past uint16 is stored as int32, as FleetX does.
  const std::vector<int32_t> wide = {50256, 70000};
  ASSERT_TRUE(WriteFleetXData(dir.File("wide"), wide, std::vector<int64_t>{2}, 100000).ok());
  auto w = OpenFleetXData(dir.File("wide"));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->ids.dtype(), TokenDtype::kInt32);
  EXPECT_EQ(w->ids.Get(1), 70000);

  // NumPy reads what we wrote.
  const std::string script = dir.File("check.py");
  WritePlain(script,
             "import numpy as np, sys\n"
             "p = sys.argv[1]\n"
             "ids = np.load(p + '_ids.npy', mmap_mode='r')\n"
             "idx = np.load(p + '_idx.npz')\n"
             "print(ids.dtype, list(ids), list(idx['lens']), list(idx['docs']), idx['lens'].dtype,"
             " idx['docs'].dtype)\n");
  const fleet::testing::CommandResult numpy =
      fleet::testing::RunCommand("/usr/bin/python3 " + script + " " + dir.File("small"));
  ASSERT_EQ(numpy.exit_code, 0) << numpy.output;
  EXPECT_EQ(numpy.output,
            "uint16 [5, 0, 256, 7, 7, 1, 255] [3, 0, 4] [0, 1, 2, 3] int32 int64\n");

  Status bad = WriteFleetXData(dir.File("bad"), tokens, lens, 256);
  EXPECT_TRUE(bad.IsInvalidArgument());
  EXPECT_THAT(bad.message(), HasSubstr("token 256 at index 2 is outside [0, 256)"));
  EXPECT_THAT(WriteFleetXData(dir.File("bad"), tokens, std::vector<int64_t>{3}, 257).message(),
              HasSubstr("document lengths sum to 3, not the 7 tokens"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("bad_ids.npy")));
}

TEST(TokenFilesTest, LlmcShardsRoundTripAndCorruptionIsNamed) {
  TempDir dir;
  const std::vector<int32_t> tokens = {50256, 15496, 995, 0, 65535};
  ASSERT_TRUE(WriteLlmcShard(dir.File("a.bin"), tokens).ok());
  const std::string bytes = ReadPlain(dir.File("a.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 5);
  auto a = OpenLlmcShard(dir.File("a.bin"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<int32_t> back(tokens.size());
  a->CopyTo(0, tokens.size(), back.data());
  EXPECT_EQ(back, tokens);

  struct Case {
    std::string name;
    std::string bytes;
    StatusCode code;
    const char* message;
  } cases[] = {
      {"cut.bin", bytes.substr(0, bytes.size() - 1), StatusCode::kCorruption,
       "truncated: header says 5 tokens (1034 bytes), file has 1033"},
      {"long.bin", bytes + "xx", StatusCode::kCorruption, "trailing bytes"},
      {"short.bin", bytes.substr(0, 100), StatusCode::kCorruption, "shorter than the 1024-byte"},
      {"magic.bin", std::string(bytes).replace(0, 1, "\x01"), StatusCode::kCorruption, "bad magic"},
      {"version.bin", std::string(bytes).replace(4, 1, "\x02"), StatusCode::kInvalidArgument,
       "version 2 is not 1"},
      {"empty.bin", "", StatusCode::kCorruption, "truncated: 0 bytes"},
  };
  for (const auto& c : cases) {
    WritePlain(dir.File(c.name), c.bytes);
    auto r = OpenLlmcShard(dir.File(c.name));
    ASSERT_EQ(r.status().code(), c.code) << c.name << ": " << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.name;
    EXPECT_THAT(r.status().message(), HasSubstr(dir.File(c.name)));
  }
  EXPECT_TRUE(OpenLlmcShard(dir.File("none.bin")).status().IsNotFound());
  const std::vector<int32_t> too_big = {65536};
  EXPECT_THAT(WriteLlmcShard(dir.File("big.bin"), too_big).message(),
              HasSubstr("token 65536 at index 0 is outside [0, 65536)"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("big.bin")));
}

}  // namespace
}  // namespace fleet::data
