#include "trainer/models/gpt_lora_files.h"

#include <glog/logging.h>
#include <openssl/evp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "comm/file_system.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/models/gpt_hf.h"
#include "trainer/models/gpt_lora.h"
#include "trainer/optimizer.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

namespace {

constexpr char kManifestFormat[] = "fleetps-gpt-lora";

std::vector<std::string> TargetNames(const GptLoraConfig& lora) {
  std::vector<std::string> names;
  for (int t = 0; t < kLoraTargets; ++t) {
    if (lora.targets[t]) names.emplace_back(LoraTargetName(static_cast<LoraTarget>(t)));
  }
  return names;
}

}  // namespace

Result<std::string> PretrainedFingerprint(const std::string& init_from) {
  const std::string file = PretrainedWeightsFile(init_from);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), std::fclose);
  if (f == nullptr) {
    return Status::NotFound("cannot open the pretrained weights to fingerprint them", file);
  }
  // SHA-256, not the CRC-32 the checkpoint already ends with: the CRC-32 of
  // a file that ends with the CRC-32 of its own bytes is one constant, for
  // every checkpoint.
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Status::IOError("cannot start SHA-256", file);
  }
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) {
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
  }
  if (std::ferror(f.get())) return Status::IOError("read failed", file);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

Status WriteGptLoraManifest(const std::string& dir, const GptConfig& config,
                            const std::string& init_from, const std::string& base_sha256) {
  CHECK(config.lora.enabled());
  const nlohmann::json manifest = {
      {"format", kManifestFormat},      {"rank", config.lora.rank},
      {"alpha", config.lora.alpha},     {"targets", TargetNames(config.lora)},
      {"base", init_from},              {"base_sha256", base_sha256},
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("cannot create the directory: " + ec.message(), dir);
  return WriteFileAtomically((std::filesystem::path(dir) / kGptLoraManifestFile).string(),
                                   manifest.dump(2) + "\n");
}

Result<GptLoraManifest> ReadGptLoraManifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kGptLoraManifestFile).string();
  std::ifstream in(path);
  if (!in) return Status::NotFound("no LoRA manifest (the adapters' rank and base)", path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IOError("read failed", path);
  const nlohmann::json m = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const Status malformed = Status::Corruption(
      absl::StrCat("not a ", kManifestFormat,
                   " manifest (format, rank >= 1, alpha > 0, targets, base_sha256)"),
      path);
  if (m.is_discarded() || !m.is_object() || m.value("format", "") != kManifestFormat ||
      !m.contains("rank") || !m["rank"].is_number_integer() || !m.contains("alpha") ||
      !m["alpha"].is_number() || !m.contains("targets") || !m["targets"].is_array() ||
      !m.contains("base_sha256") || !m["base_sha256"].is_string()) {
    return malformed;
  }
  GptLoraManifest out;
  out.base = m.value("base", "?");
  out.base_sha256 = m["base_sha256"].get<std::string>();
  const int64_t rank = m["rank"].get<int64_t>();
  const double alpha = m["alpha"].get<double>();
  if (rank < 1 || rank > (1 << 20) || !(alpha > 0.0) || !std::isfinite(alpha)) return malformed;
  out.lora.rank = static_cast<int>(rank);
  out.lora.alpha = static_cast<float>(alpha);
  for (const auto& t : m["targets"]) {
    bool known = false;
    for (int i = 0; i < kLoraTargets && t.is_string(); ++i) {
      if (LoraTargetName(static_cast<LoraTarget>(i)) == t.get<std::string>()) {
        out.lora.targets[i] = true;
        known = true;
      }
    }
    if (!known) {
      return Status::Corruption("unknown LoRA target " + t.dump() + " (qkv, proj, fc, fc_proj)",
                                path);
    }
  }
  return out;
}

Status CheckGptLoraManifest(const std::string& dir, const GptConfig& config,
                            const std::string& base_sha256) {
  const std::string path = (std::filesystem::path(dir) / kGptLoraManifestFile).string();
  FLEET_ASSIGN_OR_RETURN(GptLoraManifest m, ReadGptLoraManifest(dir));
  if (m.base_sha256 != base_sha256) {
    return Status::FailedPrecondition(
        absl::StrCat("the adapters were trained over another base model: ", m.base, " (SHA-256 ",
                     m.base_sha256, "), but Engine.init_from's weights have ", base_sha256,
                     "; point Engine.init_from at the base they were trained on"),
        path);
  }
  const GptLoraConfig& lora = config.lora;
  if (m.lora.rank != lora.rank || m.lora.alpha != lora.alpha || m.lora.targets != lora.targets) {
    return Status::FailedPrecondition(
        absl::StrCat("the adapters have rank ", m.lora.rank, ", alpha ", m.lora.alpha,
                     ", targets [", absl::StrJoin(TargetNames(m.lora), ", "),
                     "] but Model.lora says rank ", lora.rank, ", alpha ", lora.alpha,
                     ", targets [", absl::StrJoin(TargetNames(lora), ", "), "]"),
        path);
  }
  return Status::OK();
}

Result<std::unique_ptr<GptLoraAdapters>> LoadGptLoraAdapters(const std::string& dir,
                                                             const GptConfig& base_config,
                                                             const std::string& base_name,
                                                             const std::string& base_sha256,
                                                             Backend* backend) {
  FLEET_ASSIGN_OR_RETURN(GptLoraManifest m, ReadGptLoraManifest(dir));
  if (m.base_sha256 != base_sha256) {
    return Status::FailedPrecondition(
        absl::StrCat("the adapters were trained over another base model: ", m.base, " (SHA-256 ",
                     m.base_sha256, "), but ", base_name, " has SHA-256 ", base_sha256,
                     "; serve them over the base they were trained on"),
        (std::filesystem::path(dir) / kGptLoraManifestFile).string());
  }
  GptConfig config = base_config;
  config.lora = m.lora;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<GptLoraAdapters> adapters,
                         GptLoraAdapters::Create(config, backend));
  FLEET_RETURN_IF_ERROR(LoadCheckpointParams(
      (std::filesystem::path(dir) / kGptLoraCheckpointFile).string(), &adapters->arena()));
  return adapters;
}

void MergeGptLora(const GptConfig& config, std::span<const float> adapters,
                  std::span<float> params) {
  CHECK_EQ(adapters.size(), static_cast<size_t>(GptLoraParamCount(config)));
  CHECK_EQ(params.size(), static_cast<size_t>(GptParamCount(config)));
  // Offsets of each base weight matrix by (kind, layer), from the table order.
  std::vector<std::array<size_t, kLoraTargets>> base(config.num_layers);
  size_t offset = 0;
  ForEachGptTensor(config, [&](GptTensor kind, int layer, int64_t rows, int64_t cols) {
    for (int t = 0; layer >= 0 && t < kLoraTargets; ++t) {  // layer -1: not a block's tensor
      if (LoraBaseTensor(static_cast<LoraTarget>(t)) == kind) base[layer][t] = offset;
    }
    offset += static_cast<size_t>(rows * (cols ? cols : 1));
  });
  const int64_t r = config.lora.rank;
  const double s = config.lora.scale();
  size_t at = 0;  // the adapters' table order: per layer, per target, A then B
  for (int l = 0; l < config.num_layers; ++l) {
    for (int t = 0; t < kLoraTargets; ++t) {
      if (!config.lora.targets[t]) continue;
      const auto [in, out] = LoraTargetShape(config, static_cast<LoraTarget>(t));
      const float* A = adapters.data() + at;  // [r, in]
      const float* B = A + r * in;            // [out, r]
      float* W = params.data() + base[l][t];  // [out, in]
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          double acc = 0.0;
          for (int64_t k = 0; k < r; ++k) acc += double{B[o * r + k]} * A[k * in + i];
          W[o * in + i] = static_cast<float>(W[o * in + i] + s * acc);
        }
      }
      at += static_cast<size_t>(r * (in + out));
    }
  }
}

Status MergeGptLoraCheckpoint(const std::string& lora_dir, const GptConfig& config,
                              const std::string& init_from, const std::string& out_dir) {
  if (!config.lora.enabled()) {
    return Status::InvalidArgument("the config has no Model.lora section to merge", "Model.lora");
  }
  FLEET_ASSIGN_OR_RETURN(std::string fingerprint, PretrainedFingerprint(init_from));
  FLEET_RETURN_IF_ERROR(CheckGptLoraManifest(lora_dir, config, fingerprint));
  CpuBackend backend;
  GptConfig plain = config;
  plain.lora = {};
  FLEET_ASSIGN_OR_RETURN(ParamArena model,
                         ParamArena::Create(GptParamTable(plain), &backend, false));
  FLEET_RETURN_IF_ERROR(LoadPretrainedGpt(init_from, plain, &model).WithContext("Engine.init_from"));
  FLEET_ASSIGN_OR_RETURN(ParamArena adapters,
                         ParamArena::Create(GptLoraParamTable(config), &backend, false));
  FLEET_RETURN_IF_ERROR(LoadCheckpointParams(
      (std::filesystem::path(lora_dir) / kGptLoraCheckpointFile).string(), &adapters));
  std::vector<float> params = model.ParamsToHost();
  MergeGptLora(config, adapters.ParamsToHost(), params);
  FLEET_RETURN_IF_ERROR(model.ParamsFromHost(params));
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Status::IOError("cannot create the directory: " + ec.message(), out_dir);
  // SGD has no state: the file holds the parameters alone (step 0).
  Sgd no_state(&model, 1.0f);
  return SaveCheckpoint((std::filesystem::path(out_dir) / kGptCheckpointFile).string(), model,
                        no_state);
}

}  // namespace fleet::trainer
