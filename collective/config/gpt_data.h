// The GPT config's Data sections made real: the corpus a Data.<Split>
// section names, opened as a GptDataset of that split's part, and the
// tokenizer its ids are in. What gpt_pretrain and gpt_generate call.
//
//   Data.Train.dataset.name  GPTDataset       input_dir: every *_idx.npz in it
//                                             (with its *_ids.npy), sorted;
//                                             input_files: the listed prefixes'
//                                             files (name either file of a pair)
//                            TokenBinDataset  input_dir: every *.bin in it,
//                                             sorted; input_files: the listed
//                                             shards (files, dirs, globs)
//                            MegatronGPTDataset  input_files: the PREFIX of
//                                             Megatron's PREFIX.bin + PREFIX.idx
//                                             (either file may be named);
//                                             input_dir: its one *.idx;
//                                             sampled by Megatron's indices
//                                             (data/megatron_data.h) for
//                                             MegatronSamplesFor samples
//                            TextDataset      input_files/input_dir: the text
//                                             files; neither: the default corpus
//                                             (DefaultCorpusFiles, split at "%"
//                                             lines whatever text_format says),
//                                             tokenized once into cache_dir
//
// Train reads split part 0, Eval part 1, Test part 2 of its own section's
// data (FleetX's convention; a section may name other files than Train).
//
// Errors name the config key and the file: NotFound ("Data.Train.dataset.
// input_dir: no *_idx.npz in ./data/"), and those of the readers, the
// tokenizer and BuildTokenCache (Corruption, InvalidArgument for an id
// beyond Model.vocab_size or a part too small for one sample, ...).
//
// Thread safety: free functions; the objects returned are immutable.
#pragma once

#include <memory>
#include <vector>

#include "comm/status.h"
#include "collective/config/gpt_config.h"
#include "data/gpt_dataset.h"
#include "data/tokenizer.h"

namespace fleet::data {

enum class DataPart { kTrain = 0, kEval = 1, kTest = 2 };
// "Train", "Eval", "Test": the config section's name.
std::string_view DataPartName(DataPart part);

// The GptDataset of `part` as config.data's section for it describes, with
// config.model.vocab_size as the id bound. FailedPrecondition when the
// config has no such section (e.g. no Data.Eval); InvalidArgument for a
// PromptResponseDataset section (not a token stream: OpenConfiguredSamples).
Result<std::unique_ptr<GptDataset>> OpenConfiguredDataset(
    const trainer::config::GptJobConfig& config, DataPart part);

// What a GPT task trains on for `part`: OpenConfiguredDataset's GptDataset
// for the token-stream kinds, a PromptResponseDataset (prompt_response.h)
// for PromptResponseDataset. Errors: those of either, with the section's key.
Result<std::unique_ptr<GptSamples>> OpenConfiguredSamples(
    const trainer::config::GptJobConfig& config, DataPart part);

// The samples Megatron builds its indices for (its train_val_test_num_samples):
// train Engine.max_steps x global batch; eval (max_steps / eval_freq + 1) x
// eval_iters x global batch; test test_iters x global batch (at least 1).
int64_t MegatronSamplesFor(const trainer::config::GptJobConfig& config, DataPart part);

// The tokenizer named by a dataset section (Data.<Split>.dataset.tokenizer,
// vocab_dir).
Result<std::unique_ptr<Tokenizer>> OpenConfiguredTokenizer(
    const trainer::config::DatasetConfig& dataset);

// The data files a dataset section names, as OpenConfiguredDataset reads
// them (FleetX: prefixes; TokenBin: .bin paths; Text: text files, the
// default corpus's when none are named). `key` ("Data.Train.dataset") names
// the section in errors.
Result<std::vector<std::string>> ConfiguredDataFiles(const trainer::config::DatasetConfig& dataset,
                                                     const std::string& key);

}  // namespace fleet::data
