// LoRA's files (trainer/models/gpt_lora.h): what a LoRA run saves beside
// its checkpoints, and merging adapters into a full checkpoint.
//
// A LoRA run's checkpoint directory (Engine.save_load.output_dir) holds
//   gpt_lora.ckpt   the adapters alone: the updater's checkpoint of the task
//                   "gpt_lora" (trainer/checkpoint.h; parameters, AdamW's
//                   state beside it as for any run, step)
//   gpt_lora.json   the manifest: {"format": "fleetps-gpt-lora", "rank",
//                   "alpha", "targets": [...], "base": the Engine.init_from
//                   it was trained over, "base_sha256": PretrainedFingerprint
//                   of the base's weight file}
// Adapters only mean something over the weights they were trained on, so
// resuming and merging refuse a base whose fingerprint differs, and a manifest
// whose rank, alpha or targets differ from the config's.
//
// Merging: W [out, in] += (alpha / rank) B [out, rank] A [rank, in] for
// every adapted matrix, summed in double; the result is a plain gpt.ckpt
// (parameters only) that gpt_generate, gpt_serve, gpt_convert --to_hf and
// Engine.init_from read.
//
// Thread safety: free functions over their arguments.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_lora.h"

namespace fleet::trainer {

inline constexpr char kGptLoraTaskName[] = "gpt_lora";
inline constexpr char kGptLoraCheckpointFile[] = "gpt_lora.ckpt";
inline constexpr char kGptLoraManifestFile[] = "gpt_lora.json";

// The fingerprint of the weight file of the pretrained model at
// `init_from` (PretrainedWeightsFile): its SHA-256, in hex. Not a CRC-32: a
// FleetPS checkpoint ends with the CRC-32 of its bytes, which makes the
// CRC-32 of any checkpoint file the same constant. NotFound / IOError
// naming the file. Reads the whole file (about a second for GPT-2 124M).
Result<std::string> PretrainedFingerprint(const std::string& init_from);

// Writes <dir>/gpt_lora.json (atomically) for config.lora over the base
// `init_from` of fingerprint `base_sha256`. IOError naming the file.
// REQUIRES: config.lora.enabled().
Status WriteGptLoraManifest(const std::string& dir, const GptConfig& config,
                            const std::string& init_from, const std::string& base_sha256);

// What <dir>/gpt_lora.json says.
struct GptLoraManifest {
  GptLoraConfig lora;       // rank, alpha, targets
  std::string base;         // the Engine.init_from the adapters were trained over
  std::string base_sha256;  // PretrainedFingerprint of that base
};
// Reads <dir>/gpt_lora.json. NotFound / IOError for the file; Corruption
// for a malformed one (a rank < 1, alpha <= 0 or an unknown target
// included).
Result<GptLoraManifest> ReadGptLoraManifest(const std::string& dir);

// Reads <dir>/gpt_lora.json and checks it against config.lora and the
// base's fingerprint. NotFound / IOError for the file; Corruption for a
// malformed one; FailedPrecondition naming what differs (another base: the
// manifest's base and both fingerprints; or the rank, alpha or targets).
Status CheckGptLoraManifest(const std::string& dir, const GptConfig& config,
                            const std::string& base_sha256);

// params (GptParamTable order) += the adapters' products (GptLoraParamTable
// order). REQUIRES: the sizes match config's tables (CHECK).
void MergeGptLora(const GptConfig& config, std::span<const float> adapters,
                  std::span<float> params);

// The adapters of LoRA output directory `dir`, for serving over a base of
// shape `base_config` (its Model.lora ignored) whose weights have the
// fingerprint `base_sha256` (PretrainedFingerprint of `base_name`, which
// messages name): read with the rank, alpha and targets of the manifest
// into GptLoraAdapters on `backend` (not owned). Errors: those of
// ReadGptLoraManifest; FailedPrecondition naming both bases when the
// adapters were trained over another; those of the checkpoint reader for
// gpt_lora.ckpt (NotFound, Corruption, FailedPrecondition for another shape).
Result<std::unique_ptr<GptLoraAdapters>> LoadGptLoraAdapters(const std::string& dir,
                                                             const GptConfig& base_config,
                                                             const std::string& base_name,
                                                             const std::string& base_sha256,
                                                             Backend* backend);

// gpt_convert --merge_lora: the base at config's Engine.init_from
// (`init_from`), the adapters of `lora_dir` (checked against its manifest),
// merged into <out_dir>/gpt.ckpt (parameters only). Errors: those above and
// of the readers and writers, each naming its file.
Status MergeGptLoraCheckpoint(const std::string& lora_dir, const GptConfig& config,
                              const std::string& init_from, const std::string& out_dir);

}  // namespace fleet::trainer
