// gpt_convert: Hugging Face GPT-2 checkpoints in and out of FleetPS.
//
//   build/bin/gpt_convert --from_hf gpt2/ --checkpoint output/gpt2
//       gpt2/config.json + gpt2/model.safetensors -> output/gpt2/gpt.ckpt
//   build/bin/gpt_convert --checkpoint output/gpt2_ft -c configs/gpt/finetune_gpt2_124M.yaml
//       --to_hf output/gpt2_ft_hf [--dtype bfloat16]          (one command line)
//       output/gpt2_ft/gpt.ckpt -> output/gpt2_ft_hf/{config.json, model.safetensors}
//   build/bin/gpt_convert --merge_lora output/gpt2_lora -c configs/gpt/finetune_gpt2_124M_lora.yaml
//       --checkpoint output/gpt2_lora_merged                  (one command line)
//       the config's Engine.init_from + output/gpt2_lora/gpt_lora.ckpt (checked against
//       gpt_lora.json: same base SHA-256, rank, alpha, targets) -> output/gpt2_lora_merged/gpt.ckpt
//
// The names, layouts and config keys are trainer/models/gpt_hf.h's. From HF,
// the model's shape is config.json's; -c CONFIG (optional) then checks it
// against the config's Model section. To HF, -c CONFIG (required) gives the
// shape the checkpoint was trained with. The written gpt.ckpt holds only
// parameters: gpt_generate --checkpoint and Engine.init_from read it.
//
// Output: one line on stdout naming what was written and the model's shape.
// Exit status: 0 done; 1 conversion failed (the file and the reason on
// stderr); 2 bad command line or config.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace fleet::examples::gpt {

int GptConvertMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace fleet::examples::gpt
