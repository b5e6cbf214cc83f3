#include "comm/file_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/data/test_util.h"

namespace fleet::data {
namespace {

using testing::TempDir;
using testing::WriteGzip;
using testing::WritePlain;

std::vector<std::string> ReadLines(const std::string& path) {
  auto file = InputFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  LineReader reader(std::move(file).value());
  std::vector<std::string> lines;
  std::string_view line;
  for (;;) {
    auto got = reader.Next(&line);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok() || !*got) break;
    lines.emplace_back(line);
    EXPECT_EQ(reader.line_number(), static_cast<int64_t>(lines.size()));
  }
  return lines;
}

struct LineCase {
  const char* name;
  std::string bytes;
  std::vector<std::string> lines;
};

TEST(LineReaderTest, SplitsLinesPlainAndGzip) {
  const std::string long_line(3 << 20, 'x');  // longer than the initial buffer
  const std::vector<LineCase> cases = {
      {"empty file", "", {}},
      {"one newline", "\n", {""}},
      {"no trailing newline", "a\nb", {"a", "b"}},
      {"crlf", "a\r\nb\r\n", {"a", "b"}},
      {"crlf without final newline", "a\r\nb\r", {"a", "b"}},
      {"blank lines kept", "a\n\nb\n", {"a", "", "b"}},
      {"long line", "s\n" + long_line + "\nt", {"s", long_line, "t"}},
  };
  TempDir dir;
  for (const LineCase& c : cases) {
    SCOPED_TRACE(c.name);
    WritePlain(dir.File("plain"), c.bytes);
    WriteGzip(dir.File("packed.gz"), c.bytes);
    EXPECT_EQ(ReadLines(dir.File("plain")), c.lines);
    EXPECT_EQ(ReadLines(dir.File("packed.gz")), c.lines);
  }
}

TEST(InputFileTest, DetectsCompression) {
  TempDir dir;
  WritePlain(dir.File("plain"), "hello");
  WriteGzip(dir.File("packed"), "hello");
  for (const auto& [name, compressed] : {std::pair{"plain", false}, std::pair{"packed", true}}) {
    auto f = InputFile::Open(dir.File(name));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ((*f)->compressed(), compressed) << name;
    auto all = (*f)->ReadAll();
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    EXPECT_EQ(*all, "hello");
  }
}

TEST(InputFileTest, TruncatedGzipIsCorruption) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += std::to_string(i * 7919) + "\n";
  WriteGzip(dir.File("full.gz"), text);
  const std::string packed = testing::ReadPlain(dir.File("full.gz"));
  WritePlain(dir.File("cut.gz"), packed.substr(0, packed.size() / 2));
  auto f = InputFile::Open(dir.File("cut.gz"));
  ASSERT_TRUE(f.ok());
  auto all = (*f)->ReadAll();
  ASSERT_FALSE(all.ok());
  EXPECT_TRUE(all.status().IsCorruption()) << all.status().ToString();
  EXPECT_NE(all.status().message().find("cut.gz"), std::string::npos) << all.status().ToString();
}

TEST(InputFileTest, MissingFileAndDirectory) {
  TempDir dir;
  auto missing = InputFile::Open(dir.File("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound()) << missing.status().ToString();
  auto directory = InputFile::Open(dir.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_TRUE(directory.status().IsIOError()) << directory.status().ToString();
}

TEST(AtomicFileWriterTest, CommitRenamesAndAbandonLeavesNothing) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("out.txt"), "abc").ok());
  EXPECT_EQ(testing::ReadPlain(dir.File("out.txt")), "abc");
  {
    auto w = AtomicFileWriter::Create(dir.File("never.txt"));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append("partial").ok());
  }  // destroyed without Commit()
  std::vector<std::string> names;
  for (const auto& de : std::filesystem::directory_iterator(dir.path())) {
    names.push_back(de.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"out.txt"});
  auto bad = AtomicFileWriter::Create(dir.File("no_such_dir/x"));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsIOError());
}

TEST(ExpandFileSpecTest, DirectoriesGlobsAndLists) {
  TempDir dir;
  std::filesystem::create_directory(dir.File("d"));
  std::filesystem::create_directory(dir.File("empty"));
  for (const char* name : {"d/b.txt", "d/a.txt", "d/.hidden", "c.gz", "x.txt"}) {
    WritePlain(dir.File(name), "1\n");
  }
  auto listed = ExpandFileSpec(dir.File("d"));
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(*listed, (std::vector<std::string>{dir.File("d/a.txt"), dir.File("d/b.txt")}));

  auto mixed = ExpandFileSpec(dir.File("x.txt") + " , " + dir.File("*.gz") + "," +
                              dir.File("empty") + "," + dir.File("d"));
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  EXPECT_EQ(*mixed, (std::vector<std::string>{dir.File("x.txt"), dir.File("c.gz"),
                                              dir.File("d/a.txt"), dir.File("d/b.txt")}));

  for (const std::string& spec : {dir.File("missing.txt"), dir.File("*.nomatch")}) {
    auto r = ExpandFileSpec(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
  }
  auto empty = ExpandFileSpec(" , ");
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(empty.status().IsInvalidArgument());
}

}  // namespace
}  // namespace fleet::data
