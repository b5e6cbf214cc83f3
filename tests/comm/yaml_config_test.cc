#include "comm/yaml_config.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/child_process.h"
#include "tests/data/test_util.h"

namespace fleet {
namespace {

using data::testing::TempDir;
using data::testing::WritePlain;
using ::testing::HasSubstr;

TEST(YamlConfigTest, BaseMergesMapsKeyByKeyAndChildWins) {
  TempDir dir;
  WritePlain(dir.File("base.yaml"),
             "A:\n  x: 1\n  y: 2\n  list: [1, 2, 3]\n  inner: {p: 1, q: 2}\nB:\n  z: 3\n");
  WritePlain(dir.File("child.yaml"),
             "_base_: ./base.yaml\nA:\n  y: 20\n  list: [9]\n  inner: {q: 22}\nC: 4\n");
  auto doc = ConfigDocument::Load(dir.File("child.yaml"));
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  const YAML::Node& r = doc->root();
  EXPECT_EQ(r["A"]["x"].as<int>(), 1);
  EXPECT_EQ(r["A"]["y"].as<int>(), 20);
  ASSERT_EQ(r["A"]["list"].size(), 1u);  // lists replace, not merge
  EXPECT_EQ(r["A"]["list"][0].as<int>(), 9);
  EXPECT_EQ(r["A"]["inner"]["p"].as<int>(), 1);
  EXPECT_EQ(r["A"]["inner"]["q"].as<int>(), 22);
  EXPECT_EQ(r["B"]["z"].as<int>(), 3);
  EXPECT_EQ(r["C"].as<int>(), 4);
  EXPECT_FALSE(r["_base_"].IsDefined());
  EXPECT_EQ(doc->SourceOf("A.x"), dir.File("base.yaml"));
  EXPECT_EQ(doc->SourceOf("A.y"), dir.File("child.yaml"));
  EXPECT_EQ(doc->SourceOf("A.inner.p"), dir.File("base.yaml"));
  EXPECT_EQ(doc->SourceOf("A.list"), dir.File("child.yaml"));
  EXPECT_EQ(doc->SourceOf("A.nothing"), dir.File("base.yaml"));  // closest enclosing key
  EXPECT_EQ(doc->SourceOf("Nothing.at.all"), "");
}

TEST(YamlConfigTest, BaseChainsAreFollowedRelativeToEachFile) {
  TempDir dir;
  WritePlain(dir.File("root.yaml"), "A: {x: 1, y: 1, z: 1}\n");
  ASSERT_EQ(fleet::testing::RunCommand("mkdir -p " + dir.File("sub")).exit_code, 0);
  WritePlain(dir.File("sub/mid.yaml"), "_base_: ../root.yaml\nA: {y: 2}\n");
  WritePlain(dir.File("sub/leaf.yaml"), "_base_: mid.yaml\nA: {z: 3}\n");
  auto doc = ConfigDocument::Load(dir.File("sub/leaf.yaml"));
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ(doc->root()["A"]["x"].as<int>(), 1);
  EXPECT_EQ(doc->root()["A"]["y"].as<int>(), 2);
  EXPECT_EQ(doc->root()["A"]["z"].as<int>(), 3);
}

TEST(YamlConfigTest, InheritedFalseReplacesTheBaseMap) {
  TempDir dir;
  WritePlain(dir.File("base.yaml"), "A: {x: 1, y: 2}\n");
  WritePlain(dir.File("child.yaml"), "_base_: base.yaml\nA: {_inherited_: false, y: 5}\n");
  auto doc = ConfigDocument::Load(dir.File("child.yaml"));
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_FALSE(doc->root()["A"]["x"].IsDefined());
  EXPECT_EQ(doc->root()["A"]["y"].as<int>(), 5);
  EXPECT_FALSE(doc->root()["A"]["_inherited_"].IsDefined());
}

TEST(YamlConfigTest, CyclesAndMissingBasesAreRefused) {
  TempDir dir;
  WritePlain(dir.File("a.yaml"), "_base_: b.yaml\nX: 1\n");
  WritePlain(dir.File("b.yaml"), "_base_: a.yaml\nY: 1\n");
  auto cyc = ConfigDocument::Load(dir.File("a.yaml"));
  ASSERT_FALSE(cyc.ok());
  EXPECT_TRUE(cyc.status().IsInvalidArgument());
  EXPECT_THAT(cyc.status().message(), HasSubstr("cycle"));
  EXPECT_THAT(cyc.status().message(), HasSubstr("b.yaml"));

  WritePlain(dir.File("self.yaml"), "_base_: ./self.yaml\n");
  EXPECT_THAT(ConfigDocument::Load(dir.File("self.yaml")).status().message(), HasSubstr("cycle"));

  WritePlain(dir.File("orphan.yaml"), "_base_: gone.yaml\n");
  auto missing = ConfigDocument::Load(dir.File("orphan.yaml"));
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsNotFound());
  EXPECT_THAT(missing.status().message(), HasSubstr("gone.yaml"));
  EXPECT_THAT(missing.status().message(), HasSubstr("orphan.yaml"));

  EXPECT_TRUE(ConfigDocument::Load(dir.File("none.yaml")).status().IsNotFound());
  WritePlain(dir.File("bad.yaml"), "A: [1, 2\n");
  auto bad = ConfigDocument::Load(dir.File("bad.yaml"));
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.yaml"));
  WritePlain(dir.File("list.yaml"), "- 1\n- 2\n");
  EXPECT_THAT(ConfigDocument::Load(dir.File("list.yaml")).status().message(),
              HasSubstr("must be a YAML map"));
}

// yaml-cpp keeps both entries of a repeated key and a lookup sees the first,
// so `lr: 0.1` written twice would silently train with the first value.
TEST(YamlConfigTest, DuplicateKeysAreRefusedNamingTheKeyAndBothLines) {
  TempDir dir;
  WritePlain(dir.File("dup.yaml"), "A:\n  x: 1\n  y: 2\n  x: 3\n");
  auto dup = ConfigDocument::Load(dir.File("dup.yaml"));
  ASSERT_FALSE(dup.ok());
  EXPECT_TRUE(dup.status().IsInvalidArgument());
  EXPECT_THAT(dup.status().message(), HasSubstr("duplicate key A.x at line 4 (first at line 2)"));
  EXPECT_THAT(dup.status().message(), HasSubstr("dup.yaml"));

  // In a base file, at the top level, and inside a list entry.
  WritePlain(dir.File("base.yaml"), "B: 1\nB: 2\n");
  WritePlain(dir.File("child.yaml"), "_base_: base.yaml\nC: 1\n");
  EXPECT_THAT(ConfigDocument::Load(dir.File("child.yaml")).status().message(),
              HasSubstr("duplicate key B"));
  EXPECT_THAT(ParseYaml("L:\n  - {k: 1, k: 2}\n", "inline").status().message(),
              HasSubstr("duplicate key L.0.k"));
  // The same key in two different maps is fine.
  EXPECT_TRUE(ParseYaml("A: {x: 1}\nB: {x: 1}\n", "inline").ok());
}

TEST(YamlConfigTest, OverridesParseYamlValuesAndRecordTheirSource) {
  auto doc = ConfigDocument::FromString("A: {x: 1, l: [1, 2]}\n", "inline.yaml");
  ASSERT_TRUE(doc.ok());
  ASSERT_TRUE(doc->Override("A.x=2.5e-4").ok());
  ASSERT_TRUE(doc->Override("A.l=[7, 8, 9]").ok());
  ASSERT_TRUE(doc->Override("A.l.1=80").ok());
  ASSERT_TRUE(doc->Override("B.new.deep=True").ok());
  ASSERT_TRUE(doc->Override("A.name=hello world").ok());
  EXPECT_DOUBLE_EQ(doc->root()["A"]["x"].as<double>(), 2.5e-4);
  EXPECT_EQ(doc->root()["A"]["l"][1].as<int>(), 80);
  EXPECT_EQ(doc->root()["A"]["l"].size(), 3u);
  EXPECT_TRUE(doc->root()["B"]["new"]["deep"].as<bool>());
  EXPECT_EQ(doc->root()["A"]["name"].as<std::string>(), "hello world");
  EXPECT_EQ(doc->SourceOf("A.x"), "-o A.x=2.5e-4");
  EXPECT_EQ(doc->SourceOf("B.new.deep"), "-o B.new.deep=True");

  EXPECT_TRUE(doc->Override("noequals").IsInvalidArgument());
  EXPECT_TRUE(doc->Override("=1").IsInvalidArgument());
  EXPECT_TRUE(doc->Override("A..x=1").IsInvalidArgument());
  EXPECT_TRUE(doc->Override("A.l.7=1").IsInvalidArgument());
  EXPECT_TRUE(doc->Override("A.x.y=1").IsInvalidArgument());  // below a plain value
}

TEST(YamlConfigTest, SectionReadsCheckTypesRangesAndUnknownKeys) {
  TempDir dir;
  WritePlain(dir.File("c.yaml"),
             "S:\n  i: 5\n  d: 0.5\n  b: False\n  s: word\n  c: red\n  l: [1, 2]\n  n:\n"
             "  sub: {k: 1}\n");
  auto doc = ConfigDocument::Load(dir.File("c.yaml"));
  ASSERT_TRUE(doc.ok());
  ConfigSection s(*doc, "S");
  int64_t i = 0;
  double d = 0;
  bool b = true;
  std::string str, c = "blue";
  std::vector<double> l;
  std::optional<int64_t> n;
  ASSERT_TRUE(s.Int("i", &i, 1, 10).ok());
  ASSERT_TRUE(s.Double("d", &d, 0, 1).ok());
  ASSERT_TRUE(s.Bool("b", &b).ok());
  ASSERT_TRUE(s.String("s", &str).ok());
  ASSERT_TRUE(s.Choice("c", &c, {"red", "blue"}).ok());
  ASSERT_TRUE(s.DoubleList("l", &l, 1, 3, 0, 10).ok());
  ASSERT_TRUE(s.OptionalInt("n", &n).ok());
  EXPECT_EQ(i, 5);
  EXPECT_EQ(d, 0.5);
  EXPECT_FALSE(b);
  EXPECT_EQ(str, "word");
  EXPECT_EQ(c, "red");
  EXPECT_EQ(l, (std::vector<double>{1, 2}));
  EXPECT_FALSE(n.has_value());  // null keeps "not given"
  // "sub" was never read: Finish() names it and the file.
  Status unknown = s.Finish();
  ASSERT_TRUE(unknown.IsInvalidArgument());
  EXPECT_THAT(unknown.message(), HasSubstr("S.sub: unknown key"));
  EXPECT_THAT(unknown.message(), HasSubstr("c.yaml"));
  ConfigSection sub = s.Sub("sub");
  EXPECT_TRUE(s.Finish().ok());
  EXPECT_THAT(sub.Finish().message(), HasSubstr("S.sub.k: unknown key"));

  // Absent keys keep defaults.
  int64_t absent = 42;
  ASSERT_TRUE(s.Int("absent", &absent).ok());
  EXPECT_EQ(absent, 42);

  // Type and range errors name the key, the value and the file; outputs untouched.
  i = 7;
  Status range = s.Int("i", &i, 6, 10);
  EXPECT_THAT(range.message(), HasSubstr("S.i: must be in [6, 10], got 5"));
  EXPECT_THAT(range.message(), HasSubstr("c.yaml"));
  EXPECT_EQ(i, 7);
  EXPECT_THAT(s.Int("d", &i).message(), HasSubstr("S.d: must be an integer, got '0.5'"));
  EXPECT_THAT(s.Int("s", &i).message(), HasSubstr("must be an integer, got 'word'"));
  EXPECT_THAT(s.Int("l", &i).message(), HasSubstr("got a list"));
  EXPECT_THAT(s.Bool("i", &b).message(), HasSubstr("S.i: must be true or false"));
  EXPECT_THAT(s.Double("s", &d, 0, 1).message(), HasSubstr("must be a number"));
  EXPECT_THAT(s.Choice("s", &c, {"red", "blue"}).message(), HasSubstr("must be one of red, blue"));
  EXPECT_THAT(s.DoubleList("l", &l, 3, 3, 0, 10).message(), HasSubstr("must have 3..3 entries"));
  EXPECT_THAT(s.DoubleList("l", &l, 1, 3, 0, 1).message(), HasSubstr("entry 1 must be in"));
  EXPECT_THAT(s.String("l", &str).message(), HasSubstr("must be a string"));

  // An override's error names the override.
  ASSERT_TRUE(doc->Override("S.i=-3").ok());
  ConfigSection again(*doc, "S");
  EXPECT_THAT(again.Int("i", &i, 0).message(), HasSubstr("(from -o S.i=-3)"));

  // A section that is not a map.
  ASSERT_TRUE(doc->Override("T=3").ok());
  ConfigSection t(*doc, "T");
  EXPECT_THAT(t.Finish().message(), HasSubstr("T: must be a map"));
  EXPECT_FALSE(t.Int("x", &i).ok());
}

// The getters the PS job, table and worker configs use: integers of every
// width (unsigned ones refuse a minus), floats, integer lists, enums,
// required keys, nested sections that check themselves, and list entries
// whose errors name their index and the file that set the list.
TEST(YamlConfigTest, TypedGettersOfThePsConfigsNameKeyAndSource) {
  TempDir dir;
  WritePlain(dir.File("base.yaml"),
             "S:\n  u: 4000000000\n  big: 18446744073709551615\n  neg: -1\n  f: 0.25\n"
             "  huge: 1e39\n  w: [3, 4]\n  e: b\n  inner: {k: 1, typo: 2}\n"
             "L:\n  - {id: 1}\n  - {id: 2, idd: 3}\n  - 7\n");
  WritePlain(dir.File("c.yaml"), "_base_: base.yaml\nS: {e: c}\n");
  auto doc = ConfigDocument::Load(dir.File("c.yaml"));
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  ConfigSection s(*doc, "S");

  uint32_t u = 0;
  uint64_t big = 0;
  ASSERT_TRUE(s.Int("u", &u).ok());
  EXPECT_EQ(u, 4000000000u);
  ASSERT_TRUE(s.Int("big", &big).ok());
  EXPECT_EQ(big, UINT64_MAX);
  int small = 9;
  EXPECT_THAT(s.Int("u", &small).message(), HasSubstr("S.u: must be in [-2147483648, 2147483647]"));
  EXPECT_EQ(small, 9);
  EXPECT_THAT(s.Int("neg", &u).message(), HasSubstr("S.neg: must be in [0, 4294967295], got -1"));
  EXPECT_THAT(s.Int("neg", &big).message(), HasSubstr("S.neg: must be >= 0, got -1"));
  EXPECT_THAT(s.Int("neg", &big).message(), HasSubstr("(from " + dir.File("base.yaml") + ")"));

  float f = 0;
  ASSERT_TRUE(s.Float("f", &f).ok());
  EXPECT_EQ(f, 0.25f);
  EXPECT_THAT(s.Float("huge", &f).message(), HasSubstr("S.huge: must be in ["));
  EXPECT_THAT(s.Float("f", &f, 0.5, 1).message(), HasSubstr("S.f: must be in [0.5, 1], got 0.25"));

  std::vector<int64_t> w;
  ASSERT_TRUE(s.IntList("w", &w, 1, 4, 1, 10).ok());
  EXPECT_EQ(w, (std::vector<int64_t>{3, 4}));
  EXPECT_THAT(s.IntList("w", &w, 1, 4, 1, 3).message(), HasSubstr("S.w: entry 1 must be in [1, 3], got 4"));
  EXPECT_THAT(s.IntList("w", &w, 3, 4).message(), HasSubstr("S.w: must have 3..4 entries, got 2"));
  EXPECT_THAT(s.IntList("f", &w, 1, 4).message(), HasSubstr("S.f: must be a list"));

  enum class Letter { kA, kB, kC };
  constexpr std::pair<const char*, Letter> kLetters[] = {
      {"a", Letter::kA}, {"b", Letter::kB}, {"c", Letter::kC}};
  Letter letter = Letter::kA;
  ASSERT_TRUE(s.Enum("e", kLetters, &letter).ok());
  EXPECT_EQ(letter, Letter::kC);  // the child's value over the base's
  EXPECT_THAT(s.Enum("f", kLetters, &letter).message(),
              HasSubstr("S.f: must be one of a, b, c; got '0.25'"));
  ASSERT_TRUE(s.Enum("absent", kLetters, &letter).ok());
  EXPECT_EQ(letter, Letter::kC);

  EXPECT_TRUE(s.Require("u").ok());
  EXPECT_THAT(s.Require("gone", "section").message(),
              HasSubstr("missing section: S.gone (from " + dir.File("base.yaml") + ")"));

  // Section() refuses the keys its reader did not read, naming the file that set them.
  int k = 0;
  Status inner = s.Section("inner", [&](ConfigSection& i) { return i.Int("k", &k); });
  EXPECT_EQ(k, 1);
  EXPECT_THAT(inner.message(), HasSubstr("S.inner.typo: unknown key (from " + dir.File("base.yaml")));
  EXPECT_THAT(inner.message(), HasSubstr("S.inner takes k"));
  for (const char* key : {"big", "neg", "huge", "gone"}) s.Accept(key);
  EXPECT_TRUE(s.Finish().ok()) << s.Finish().ToString();

  // List entries are sections of their own: "L.1.idd", "L.2 must be a map".
  ConfigSection top(*doc, "");
  std::vector<ConfigSection> entries;
  ASSERT_TRUE(top.Entries("L", &entries).ok());
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[1].path(), "L.1");
  int id = 0;
  ASSERT_TRUE(entries[1].Int("id", &id).ok());
  EXPECT_EQ(id, 2);
  EXPECT_THAT(entries[1].Finish().message(), HasSubstr("L.1.idd: unknown key (from " + dir.File("base.yaml")));
  EXPECT_THAT(entries[2].Finish().message(), HasSubstr("L.2: must be a map, got '7'"));
  EXPECT_THAT(top.Entries("S", &entries).message(), HasSubstr("S: must be a list, got a map"));
  top.Accept("S");
  EXPECT_THAT(top.Finish("unknown top-level section").ok(), true);
  ASSERT_TRUE(doc->Override("Typo.x=1").ok());
  EXPECT_THAT(top.Finish("unknown top-level section").message(),
              HasSubstr("Typo: unknown top-level section (from -o Typo.x=1); the top level takes L, S"));
}

// A tree built in code (FromNode) reads the same; its errors name keys only.
TEST(YamlConfigTest, FromNodeReadsATreeWithoutSources) {
  const ConfigDocument doc = ConfigDocument::FromNode(YAML::Load("{a: 1, b: x, c: 2}"));
  ConfigSection top(doc, "");
  int a = 0;
  ASSERT_TRUE(top.Int("a", &a).ok());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(top.Int("b", &a).message(), "b: must be an integer, got 'x'");
  EXPECT_EQ(top.Finish().message(), "c: unknown key; the top level takes a, b");
  const ConfigDocument scalar = ConfigDocument::FromNode(YAML::Load("7"));
  EXPECT_THAT(ConfigSection(scalar, "").Finish().message(), HasSubstr("must be a map, got '7'"));
}

// The document owns a copy: overriding it leaves the tree alone, and
// threads may build and read documents from one shared tree (the workers of
// an in-process job each parse the job's root; sharing it crashed in
// yaml-cpp's memory merge).
TEST(YamlConfigTest, FromNodeCopiesTheTreeSoThreadsMayShareIt) {
  const YAML::Node shared = YAML::Load("{a: 1, s: {x: 2, y: [1, 2, 3]}}");
  ConfigDocument doc = ConfigDocument::FromNode(shared);
  ASSERT_TRUE(doc.Override("a=5").ok());
  ASSERT_TRUE(doc.Override("s.z=4").ok());
  EXPECT_EQ(shared["a"].as<int>(), 1);
  EXPECT_FALSE(shared["s"]["z"].IsDefined());

  std::vector<std::thread> threads;
  std::atomic<int> read{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        ConfigDocument mine = ConfigDocument::FromNode(shared);
        ConfigSection top(mine, "");
        int a = 0;
        if (top.Int("a", &a).ok() && a == 1) read.fetch_add(1);
        (void)mine.Override("s.x=" + std::to_string(i));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(read.load(), 8 * 300);
  EXPECT_EQ(shared["s"]["x"].as<int>(), 2);
}

TEST(YamlConfigTest, ParseConfigArgsTakesFleetXFlags) {
  auto a = ParseConfigArgs(
      {"-c", "x.yaml", "-o", "A.b=1", "--nproc=2", "--override=C.d=[1, 2]", "-o", "E=f", "tail"});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->config, "x.yaml");
  EXPECT_EQ(a->overrides, (std::vector<std::string>{"A.b=1", "C.d=[1, 2]", "E=f"}));
  EXPECT_EQ(a->rest, (std::vector<std::string>{"--nproc=2", "tail"}));
  auto b = ParseConfigArgs({"--config=y.yaml"});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->config, "y.yaml");
  EXPECT_TRUE(ParseConfigArgs({"-c"}).status().IsInvalidArgument());
  EXPECT_TRUE(ParseConfigArgs({"-o"}).status().IsInvalidArgument());
  EXPECT_TRUE(ParseConfigArgs({"-c", "a", "-c", "b"}).status().IsInvalidArgument());
}

}  // namespace
}  // namespace fleet
