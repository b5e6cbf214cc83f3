// Hugging Face GPT-2 checkpoints (trainer/models/gpt_hf.h, trainer/safetensors.h):
// a small GPT-2 written by tests/trainer/make_hf_gpt2.py (NumPy) converts
// into a FleetPS checkpoint whose GptModel gives the NumPy forward's logits,
// in F32, F16 and BF16; converting back gives the same tensor bytes; and
// damaged or hostile files give a Status naming the problem, never a crash.
// The NumPy cases skip (with the reason) when /usr/bin/python3 or NumPy is
// missing.
#include "trainer/models/gpt_hf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/child_process.h"
#include "tests/test_paths.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/models/gpt.h"
#include "trainer/safetensors.h"

namespace fleet::trainer {
namespace {

namespace fs = std::filesystem;
using fleet::testing::ReadAll;

constexpr char kPython[] = "/usr/bin/python3";

void WriteFile(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = fs::temp_directory_path() / ("gpt_hf_test_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Why the NumPy fixture cannot be made here, or empty when it can.
std::string NumpyMissing() {
  if (::access(kPython, X_OK) != 0) return std::string(kPython) + " is missing";
  if (fleet::testing::RunCommand(std::string(kPython) + " -c 'import numpy'").exit_code != 0) {
    return "NumPy is missing for /usr/bin/python3 (apt-get install python3-numpy)";
  }
  return "";
}

// Runs make_hf_gpt2.py into `dir`.
void MakeFixture(const fs::path& dir, const std::string& dtype, const std::string& extra = "") {
  const std::string cmd = std::string(kPython) + " " +
                          fleet::testing::SourcePath("tests/trainer/make_hf_gpt2.py") + " " +
                          dir.string() + " --dtype " + dtype + " " + extra;
  ASSERT_EQ(fleet::testing::RunCommand(cmd).exit_code, 0) << cmd;
}

struct Expected {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> logits;  // [T][V]
};

Expected ReadExpected(const fs::path& dir) {
  const nlohmann::json doc = nlohmann::json::parse(ReadAll(dir / "expected.json"));
  return {doc["tokens"].get<std::vector<int32_t>>(),
          doc["logits"].get<std::vector<std::vector<double>>>()};
}

// GptModel's logits at every position of `tokens` (the last position of each
// prefix: the model is causal) against the NumPy forward's.
void ExpectLogitsMatch(const std::string& pretrained, const GptConfig& config,
                       const Expected& expected) {
  CpuBackend backend;
  CpuGptKernels kernels(nullptr);
  std::unique_ptr<GptModel> model = std::move(GptModel::Create(config, &backend, &kernels).value());
  ASSERT_TRUE(LoadPretrainedGpt(pretrained, config, &model->arena()).ok());
  const int T = static_cast<int>(expected.tokens.size());
  double worst = 0;
  for (int t = 1; t <= T; ++t) {
    std::vector<float> logits =
        model->LastLogits(std::span(expected.tokens.data(), t), 1, t).value();
    ASSERT_EQ(logits.size(), expected.logits[t - 1].size());
    for (size_t v = 0; v < logits.size(); ++v) {
      const double want = expected.logits[t - 1][v];
      worst = std::max(worst, std::abs(logits[v] - want) / (1.0 + std::abs(want)));
    }
  }
  // fp32 arithmetic against a float64 reference over 2 blocks: ~1e-6.
  EXPECT_LT(worst, 2e-5) << pretrained;
}

class NumpyFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string missing = NumpyMissing();
    if (!missing.empty()) GTEST_SKIP() << "skipped: " << missing;
  }
};

TEST_P(NumpyFixtureTest, ConvertedWeightsGiveNumpyLogitsAndConvertBackBitExact) {
  const std::string dtype = GetParam();
  TempDir tmp;
  const fs::path hf = tmp.path() / "hf", ckpt = tmp.path() / "ckpt", back = tmp.path() / "back";
  // BF16 with the "transformer." prefix and a tied lm_head, as
  // GPT2LMHeadModel's state dict has them; the others bare, as the hub's gpt2.
  MakeFixture(hf, dtype, dtype == "BF16" ? "--prefix --lm_head" : "");
  const Expected expected = ReadExpected(hf);

  Result<GptConfig> config = ConvertHfToCheckpoint(hf.string(), ckpt.string());
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->num_layers, 2);
  EXPECT_EQ(config->vocab_size, 67);
  ExpectLogitsMatch(ckpt.string(), *config, expected);  // through gpt.ckpt
  ExpectLogitsMatch(hf.string(), *config, expected);    // straight from the HF directory

  const SafetensorsDtype st_dtype = ParseFloatDtype(dtype).value();
  ASSERT_TRUE(ConvertCheckpointToHf(ckpt.string(), *config, back.string(), st_dtype).ok());
  auto original = std::move(SafetensorsReader::Open((hf / kHfWeightsFile).string()).value());
  auto written = std::move(SafetensorsReader::Open((back / kHfWeightsFile).string()).value());
  int compared = 0;
  for (const SafetensorsTensor& t : original->tensors()) {
    std::string name = t.name;
    if (name.starts_with("transformer.")) name = name.substr(12);
    if (name.ends_with(".attn.bias") || name == "lm_head.weight") continue;  // not parameters
    const SafetensorsTensor* w = written->Find(name);
    ASSERT_NE(w, nullptr) << name;
    EXPECT_EQ(w->shape, t.shape) << name;
    EXPECT_EQ(w->dtype, t.dtype) << name;
    EXPECT_EQ(written->ReadBytes(*w).value(), original->ReadBytes(t).value()) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 + 12 * 2 + 2);
  EXPECT_EQ(written->tensors().size(), static_cast<size_t>(compared));
  // The written config reads back as the same shape.
  Result<GptConfig> again = ReadHfGpt2Config((back / kHfConfigFile).string());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(CheckSameGptShape(*again, *config).ok());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NumpyFixtureTest, ::testing::Values("F32", "F16", "BF16"));

// ---- the programs ---------------------------------------------------------------------

TEST(GptConvertProgramTest, ConvertsBothWaysAndRefusesBadCommandLines) {
  const std::string missing = NumpyMissing();
  if (!missing.empty()) GTEST_SKIP() << "skipped: " << missing;
  TempDir tmp;
  const fs::path hf = tmp.path() / "hf";
  MakeFixture(hf, "F32");
  const std::string bin = fleet::testing::BinPath("gpt_convert");
  const auto run = [&](const std::string& args) {
    return fleet::testing::RunCommand(bin + " " + args + " >" + (tmp.path() / "out").string() + " 2>" +
                                      (tmp.path() / "err").string())
        .exit_code;
  };
  EXPECT_EQ(run("--from_hf " + hf.string() + " --checkpoint " + (tmp.path() / "ck").string()), 0);
  EXPECT_NE(ReadAll(tmp.path() / "out").find("28128 parameters: 2 layers"), std::string::npos);
  // Back out needs the model's shape from a config; the tiny config's is another shape.
  EXPECT_EQ(run("--checkpoint " + (tmp.path() / "ck").string() + " --to_hf " +
                (tmp.path() / "back").string()),
            2);
  EXPECT_NE(ReadAll(tmp.path() / "err").find("--to_hf needs -c CONFIG"), std::string::npos);
  EXPECT_EQ(run("-c " + fleet::testing::SourcePath("configs/gpt/pretrain_gpt_tiny.yaml") +
                " --checkpoint " + (tmp.path() / "ck").string() + " --to_hf " +
                (tmp.path() / "back").string()),
            1);
  EXPECT_NE(ReadAll(tmp.path() / "err").find("wte"), std::string::npos)
      << ReadAll(tmp.path() / "err");
  EXPECT_EQ(run("--from_hf " + hf.string() + " --to_hf x --checkpoint y"), 2);
  EXPECT_EQ(run("--from_hf " + hf.string() + " --checkpoint y --dtype int8"), 2);
}

// ---- hostile and damaged input (no Python needed) ----------------------------------------

GptConfig TinyConfig() {
  GptConfig c;
  c.vocab_size = 11;
  c.max_position_embeddings = 8;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_layers = 1;
  return c;
}

// A valid tiny HF directory written by FleetPS itself.
void WriteTiny(const fs::path& dir, const GptConfig& c = TinyConfig()) {
  std::vector<float> params(GptParamCount(c));
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.01f * static_cast<float>(i % 97);
  ASSERT_TRUE(WriteHfGpt2Dir(dir.string(), c, params, SafetensorsDtype::kF32).ok());
}

// A safetensors file from a header text and `data_bytes` zero bytes.
std::string Safetensors(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, EveryTruncationIsCorruptionNamingTheFile) {
  TempDir tmp;
  WriteTiny(tmp.path() / "hf");
  const std::string bytes = ReadAll(tmp.path() / "hf" / kHfWeightsFile);
  const fs::path cut = tmp.path() / "cut.safetensors";
  for (size_t n = 0; n < bytes.size(); n += (n < 64 ? 1 : 37)) {
    WriteFile(cut, bytes.substr(0, n));
    Result<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(cut.string());
    ASSERT_FALSE(r.ok()) << "a file cut to " << n << " of " << bytes.size() << " bytes opened";
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find(cut.string()), std::string::npos);
  }
}

TEST(SafetensorsTest, HostileHeadersAreCorruptionWithTheReason) {
  TempDir tmp;
  const fs::path f = tmp.path() / "bad.safetensors";
  const struct {
    std::string bytes;
    std::string reason;
  } cases[] = {
      {Safetensors("{not json", 0), "not JSON"},
      {Safetensors("[1, 2]", 0), "not a JSON object"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2]}})", 8), "needs dtype, shape"},
      {Safetensors(R"({"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}})", 8),
       "unknown dtype"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
       "non-negative integer"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
       "holds 3 F32 elements but data_offsets span 8 bytes"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
       "outside the file's 4 data bytes"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8),
       "outside"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296],)"
                   R"( "data_offsets": [0, 0]}})",
                   0),
       "too large"},
      {Safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                   R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                   12),
       "overlap"},
      {Safetensors(R"({"__metadata__": 3})", 0), "__metadata__"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10), "header length"},
      {std::string("\x02\0\0\0", 4), "fewer than the 8"},
  };
  for (const auto& c : cases) {
    WriteFile(f, c.bytes);
    Result<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(f.string());
    ASSERT_FALSE(r.ok()) << c.reason;
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find(c.reason), std::string::npos) << r.status().ToString();
  }
  EXPECT_TRUE(SafetensorsReader::Open((tmp.path() / "none").string()).status().IsNotFound());
}

TEST(SafetensorsTest, NonFloatTensorsAreRefusedWhenRead) {
  TempDir tmp;
  const fs::path f = tmp.path() / "i.safetensors";
  WriteFile(f, Safetensors(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8));
  auto r = std::move(SafetensorsReader::Open(f.string()).value());
  std::vector<float> out(1);
  const Status st = r->ReadFloats(r->tensors()[0], out);
  EXPECT_TRUE(st.IsInvalidArgument());
  EXPECT_NE(st.ToString().find("tensor 'a' is I64"), std::string::npos) << st.ToString();
}

TEST(SafetensorsTest, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);         // tie to even
  EXPECT_EQ(FloatToFp16(std::ldexp(1.5f, -25)), 0x0001);         // above the tie
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie to even, up
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::nanf("")))));
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie to even
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie to even, up
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  // Every half value survives float and back.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    if ((x & 0x7c00) == 0x7c00 && (x & 0x3ff)) continue;  // NaNs
    ASSERT_EQ(FloatToFp16(Fp16ToFloat(x)), x) << h;
    ASSERT_EQ(FloatToBf16(Bf16ToFloat(x)), x) << h;
  }
}

TEST(GptHfTest, ConfigSettingsGptModelCannotComputeAreRefusedByKey) {
  TempDir tmp;
  WriteTiny(tmp.path() / "hf");
  const fs::path cfg = tmp.path() / "hf" / kHfConfigFile;
  const nlohmann::json good = nlohmann::json::parse(ReadAll(cfg));
  const struct {
    const char* key;
    nlohmann::json value;
  } cases[] = {
      {"activation_function", "relu"},
      {"layer_norm_epsilon", 1e-6},
      {"tie_word_embeddings", false},
      {"scale_attn_by_inverse_layer_idx", true},
      {"n_head", 3},
      {"n_layer", "two"},
  };
  for (const auto& c : cases) {
    nlohmann::json doc = good;
    doc[c.key] = c.value;
    WriteFile(cfg, doc.dump());
    Result<GptConfig> r = ReadHfGpt2Config(cfg.string());
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
    const std::string named = std::string(c.key) == "n_head" ? "num_attention_heads" : c.key;
    EXPECT_NE(r.status().ToString().find(named), std::string::npos) << r.status().ToString();
  }
  nlohmann::json doc = good;
  doc.erase("n_embd");
  WriteFile(cfg, doc.dump());
  EXPECT_NE(ReadHfGpt2Config(cfg.string()).status().ToString().find("no \"n_embd\""),
            std::string::npos);
}

TEST(GptHfTest, TensorsThatDoNotFitTheConfigAreNamed) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "hf";
  WriteTiny(dir);
  const fs::path cfg = dir / kHfConfigFile;
  const std::string good = ReadAll(cfg);
  const auto load_error = [&] { return ReadHfGpt2Dir(dir.string()).status().ToString(); };
  ASSERT_EQ(load_error(), "OK");

  // One layer more in config.json than in the file: the first missing tensor.
  nlohmann::json doc = nlohmann::json::parse(good);
  doc["n_layer"] = 2;
  WriteFile(cfg, doc.dump());
  EXPECT_NE(load_error().find("tensor 'h.1.ln_1.weight' is missing"), std::string::npos)
      << load_error();
  // A file of two layers under a config.json of one: the extra block is named.
  GptConfig two = TinyConfig();
  two.num_layers = 2;
  WriteTiny(dir, two);
  doc = nlohmann::json::parse(good);
  WriteFile(cfg, doc.dump());
  EXPECT_NE(load_error().find("'h.1.ln_1.weight' is not part of a GPT-2 with 1 layers"),
            std::string::npos)
      << load_error();
  // Wider positions in config.json than wpe has.
  WriteTiny(dir);
  doc["n_positions"] = 9;
  WriteFile(cfg, doc.dump());
  EXPECT_NE(load_error().find("'wpe.weight' has shape [8, 8]"), std::string::npos) << load_error();
  EXPECT_NE(load_error().find("needs [9, 8]"), std::string::npos) << load_error();
  // A model config of another shape than the weights.
  WriteTiny(dir);
  GptConfig other = TinyConfig();
  other.hidden_size = 16;
  CpuBackend backend;
  ParamArena arena = std::move(ParamArena::Create(GptParamTable(other), &backend).value());
  const Status st = LoadPretrainedGpt(dir.string(), other, &arena);
  EXPECT_TRUE(st.IsInvalidArgument());
  EXPECT_NE(st.ToString().find("Model.hidden_size"), std::string::npos) << st.ToString();
  // Neither kind of checkpoint.
  EXPECT_TRUE(LoadPretrainedGpt((tmp.path() / "none").string(), other, &arena).IsNotFound());
}

}  // namespace
}  // namespace fleet::trainer
