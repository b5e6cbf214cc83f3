// Every program answers --help (and --helpshort, -h) with exit 0 and the one
// shape comm/program_help.h prints: a usage line first, its own flags in
// groups, at most one line pointing to the library flags; never glog's or
// gflags' own flags.
#include "comm/program_help.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/child_process.h"

namespace fleet {
namespace {

using testing::BinPath;
using testing::Child;
using testing::ReadAll;

struct HelpRun {
  testing::Exit exit;
  std::string text;
};

HelpRun RunHelp(const std::string& program, const std::string& flag) {
  const std::string log = ::testing::TempDir() + "/" + program + flag + ".txt";
  Child child({BinPath(program), flag}, {}, log);
  HelpRun run{child.Wait(std::chrono::seconds(20)), ""};
  run.text = ReadAll(log);
  return run;
}

class ProgramHelpTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ProgramHelpTest, HelpIsUsageThenGroupedOwnFlags) {
  const std::string program = GetParam();
  for (const std::string flag : {"--help", "--helpshort", "-h"}) {
    SCOPED_TRACE(program + " " + flag);
    const HelpRun run = RunHelp(program, flag);
    ASSERT_TRUE(run.exit.exited) << run.text;
    EXPECT_EQ(run.exit.code, 0) << run.text;
    const std::vector<std::string> lines = absl::StrSplit(run.text, '\n');
    ASSERT_GE(lines.size(), 4u) << run.text;
    EXPECT_EQ(lines[0].rfind("Usage: " + program + " ", 0), 0u) << run.text;
    // Groups: a title line "Something:" followed by indented flag lines.
    int groups = 0;
    for (size_t i = 1; i + 1 < lines.size(); ++i) {
      if (!lines[i].empty() && lines[i][0] != ' ' && lines[i].back() == ':' &&
          lines[i + 1].starts_with("  -")) {
        ++groups;
      }
    }
    EXPECT_GE(groups, 2) << run.text;
    // Library internals stay behind --helpfull.
    for (const char* library_flag :
         {"--logtostderr", "--minloglevel", "--flagfile", "--tryfromenv"}) {
      EXPECT_EQ(run.text.find(library_flag), std::string::npos) << library_flag << "\n" << run.text;
    }
    int library_pointers = 0;
    for (const std::string& line : lines)
      library_pointers += line.find("--helpfull") != std::string::npos;
    EXPECT_LE(library_pointers, 1) << run.text;
    EXPECT_LT(lines.size(), 110u) << run.text;
  }
}

INSTANTIATE_TEST_SUITE_P(Programs, ProgramHelpTest,
                         ::testing::Values("fleetrun", "ps_server", "ps_worker", "heter_worker",
                                           "mnist_mlp", "gpt_pretrain", "gpt_generate", "gpt_serve",
                                           "gpt_convert", "tokenize", "gen_ctr_data"));

TEST(ProgramHelpText, GptPretrainListsConfigFlagsAndItsReadmeExists) {
  const HelpRun run = RunHelp("gpt_pretrain", "--help");
  EXPECT_NE(run.text.find("\n  -c FILE"), std::string::npos) << run.text;
  EXPECT_NE(run.text.find("\n  -o Section.key=value"), std::string::npos) << run.text;
  EXPECT_NE(run.text.find("examples/gpt/README.md"), std::string::npos) << run.text;
  EXPECT_TRUE(std::filesystem::exists(testing::SourcePath("examples/gpt/README.md")));
}

TEST(ProgramHelpText, HelpfullAddsTheLibraryFlags) {
  const HelpRun run = RunHelp("ps_server", "--helpfull");
  ASSERT_TRUE(run.exit.exited);
  EXPECT_EQ(run.exit.code, 0);
  EXPECT_EQ(run.text.rfind("Usage: ps_server ", 0), 0u) << run.text;
  EXPECT_NE(run.text.find("-logtostderr"), std::string::npos) << run.text;
}

// One flag grammar: a mistyped flag is one line naming it and exit 2, in
// every program that parses its flags with ParseFlagsOrHelp.
TEST(ProgramFlags, UnknownFlagIsOneLineAndExit2) {
  for (const char* program : {"ps_server", "ps_worker", "heter_worker", "mnist_mlp", "gpt_pretrain",
                              "tokenize", "gen_ctr_data"}) {
    SCOPED_TRACE(program);
    const HelpRun run = RunHelp(program, "--no_such_flag");
    ASSERT_TRUE(run.exit.exited) << run.text;
    EXPECT_EQ(run.exit.code, 2) << run.text;
    EXPECT_EQ(run.text, std::string(program) + ": --no_such_flag: unknown flag (see " + program +
                            " --help)\n");
  }
}

// -o Key.sub=value (fleetrun's and FleetX's) in the programs that read a job
// config: it reaches the config, whose error names it.
TEST(ProgramFlags, DashOOverridesAConfigKey) {
  const std::string log = ::testing::TempDir() + "/ps_server_dash_o.txt";
  Child child({BinPath("ps_server"), "-o", "server.no_such_key=1",
               "--config=" + testing::SourcePath("configs/ctr_dnn.yaml")},
              {}, log);
  const testing::Exit exit = child.Wait(std::chrono::seconds(20));
  const std::string text = ReadAll(log);
  ASSERT_TRUE(exit.exited) << text;
  EXPECT_EQ(exit.code, 2) << text;
  EXPECT_NE(text.find("server.no_such_key: unknown key (from -o server.no_such_key=1)"),
            std::string::npos)
      << text;
}

TEST(ProgramHelpText, FormatWrapsAndShowsDefaults) {
  const ProgramHelp help{"prog --x=N",
                         "Does a thing.",
                         {{"Group one",
                           {{"--x", "N", std::string(131, 'a').replace(70, 1, " "), "3"},
                            {"-c", "FILE", "config", ""}}}},
                         "footer line"};
  const std::string text = FormatProgramHelp(help);
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  ASSERT_GE(lines.size(), 8u) << text;
  EXPECT_EQ(lines[0], "Usage: prog --x=N");
  EXPECT_EQ(lines[1], "Does a thing.");
  EXPECT_EQ(lines[3], "Group one:");
  EXPECT_TRUE(lines[4].starts_with("  --x=N   ")) << text;
  EXPECT_TRUE(lines[5].ends_with("(default: 3)")) << text;
  EXPECT_TRUE(lines[6].starts_with("  -c FILE ")) << text;
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_EQ(lines[8], "footer line");
}

}  // namespace
}  // namespace fleet
