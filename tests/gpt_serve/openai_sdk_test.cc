// gpt_serve driven by the official OpenAI Node SDK (npm openai, installed by
// scripts/setup.sh into .cache/openai-node): openai_sdk_check.mjs lists the
// models and sends completions and chat, streamed and not, with n > 1, stop,
// logprobs and a LoRA adapter by name, through an API key, and fails on any
// throw or warning of the SDK. Skips only when Node.js is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/child_process.h"
#include "tests/data/test_util.h"
#include "tests/gpt_serve/serve_fixture.h"

namespace fleet::serve::testing {
namespace {

TEST(GptServeOpenAiSdk, TheOfficialNodeClientGetsWhatItExpects) {
  if (::fleet::testing::RunCommand("command -v node").exit_code != 0) {
    GTEST_SKIP() << "no node on PATH: this test drives gpt_serve with the OpenAI Node SDK and "
                    "needs Node.js";
  }
  const std::string sdk = data::testing::SourcePath(".cache/openai-node");
  ASSERT_TRUE(std::filesystem::exists(sdk + "/node_modules/openai/package.json"))
      << "the OpenAI Node SDK is not in " << sdk << ": run scripts/setup.sh";
  data::testing::TempDir dir;
  const std::string base = dir.path() + "/base", adapter = dir.path() + "/shout";
  {
    Model m;
    WriteCheckpoint(*m.model, base);
  }
  WriteAdapterDir(adapter, {.rank = 4, .alpha = 8, .targets = {true, true, true, true}}, 21, base);
  ServeOptions options = Server::Default();
  options.service.api_keys = {"sdk-test-key-0123456789"};
  Server s(options, "cpu", base, {{"shout", adapter}});
  const std::string command =
      "OPENAI_SDK_DIR='" + sdk + "' GPT_SERVE_URL='http://127.0.0.1:" + std::to_string(s.port()) +
      "/v1' GPT_SERVE_KEY='sdk-test-key-0123456789' " + "GPT_SERVE_ADAPTER=shout node '" +
      data::testing::SourcePath("tests/gpt_serve/openai_sdk_check.mjs") + "'";
  const ::fleet::testing::CommandResult r =
      ::fleet::testing::RunCommand(command, std::chrono::seconds(120));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("openai SDK checks passed"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fleet::serve::testing
