#include "serve/inference.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "trainer/models/gpt_hf.h"
#include "trainer/models/gpt_lora_files.h"

namespace fleet::serve {

using trainer::config::GptJobConfig;

Result<InferenceCompute> CreateInferenceCompute(const GptJobConfig& config,
                                                const std::string& device_flag, int threads,
                                                const std::string& program, std::ostream& err) {
  InferenceCompute out;
  out.device = !device_flag.empty()                                    ? device_flag
               : config.global.device == trainer::config::Device::kCpu ? "cpu"
                                                                       : "cuda:0";
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  FLEET_ASSIGN_OR_RETURN(
      out.compute,
      trainer::CreateGptCompute(out.device, config.engine.mix_precision.precision, threads));
  if (!out.compute.precision_note.empty()) {
    err << program << ": " << out.compute.precision_note << "\n";
  }
  return out;
}

Result<std::unique_ptr<trainer::GptModel>> LoadGptModel(const GptJobConfig& config,
                                                        const std::string& checkpoint_dir,
                                                        trainer::GptCompute* compute) {
  std::error_code ec;
  const std::filesystem::path dir(checkpoint_dir);
  if (std::filesystem::exists(dir / trainer::kGptLoraManifestFile, ec) &&
      !std::filesystem::exists(trainer::PretrainedWeightsFile(checkpoint_dir), ec)) {
    return Status::FailedPrecondition(
        "it holds LoRA adapters (" + std::string(trainer::kGptLoraManifestFile) +
            "), not a model: merge them into their base first (gpt_convert --merge_lora " +
            checkpoint_dir +
            " -c <the LoRA config> --checkpoint <new dir>), or serve them over "
            "their base (gpt_serve --checkpoint <base> --lora NAME=" +
            checkpoint_dir + ")",
        checkpoint_dir);
  }
  if (config.model.lora.enabled()) {
    return Status::InvalidArgument(
        "decoding reads merged weights: merge the adapters first (gpt_convert --merge_lora) and "
        "decode the merged checkpoint with -o Model.lora=null, or serve them over their base "
        "(gpt_serve --lora NAME=DIR)",
        "Model.lora");
  }
  FLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::GptModel> model,
      trainer::GptModel::Create(config.model, compute->backend.get(), compute->kernels.get()));
  FLEET_RETURN_IF_ERROR(trainer::LoadPretrainedGpt(checkpoint_dir, config.model, &model->arena()));
  return model;
}

}  // namespace fleet::serve
