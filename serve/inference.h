// A trained GPT set up for inference, the way gpt_generate and gpt_serve
// both need it: the compute for a --device flag, and the model loaded from
// a checkpoint directory (FleetPS's gpt.ckpt or a Hugging Face GPT-2
// directory).
//
// Thread safety: plain functions.
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "collective/config/gpt_config.h"
#include "comm/status.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt.h"

namespace fleet::serve {

// The compute an inference program (gpt_generate, gpt_serve) runs on: the
// device its --device flag names ("" for the config's Global.device: "cpu"
// or "cuda:0"), in the config's precision, on cpu with `threads` threads (0:
// all cores, which sets OpenBLAS to one thread process-wide). A precision
// note (e.g. bf16 asked for on cpu) goes to `err` prefixed with `program`.
struct InferenceCompute {
  std::string device;
  trainer::GptCompute compute;
};
Result<InferenceCompute> CreateInferenceCompute(const trainer::config::GptJobConfig& config,
                                                const std::string& device_flag, int threads,
                                                const std::string& program, std::ostream& err);

// Builds config.model on `compute` (CreateGptCompute's backend and twin, not
// owned, must outlive the model) and loads the parameters of
// <checkpoint_dir>/gpt.ckpt, or of a Hugging Face GPT-2 directory
// (trainer::LoadPretrainedGpt). Errors: InvalidArgument for a bad Model
// section or one with Model.lora (decoding reads merged weights);
// FailedPrecondition for a LoRA output directory (adapters, no model),
// saying how to merge or serve it; NotFound / Corruption /
// FailedPrecondition (another shape, naming the tensor) from the checkpoint.
Result<std::unique_ptr<trainer::GptModel>> LoadGptModel(const trainer::config::GptJobConfig& config,
                                                        const std::string& checkpoint_dir,
                                                        trainer::GptCompute* compute);

}  // namespace fleet::serve
