// GptJobConfig: the GPT pretraining config (configs/gpt/*.yaml), in FleetX's
// shape so a FleetX user recognises it: sections Global, Engine, Model, Data,
// Optimizer, Distributed (and Generation for gpt_generate; Serving, which
// gpt_serve reads and checks itself: serve/chat_template.h), a `_base_` file
// that others extend, `-c FILE` and repeatable `-o Section.key=value`
// overrides (comm/yaml_config.h). FleetX's key names are kept where they
// apply; keys FleetPS adds are marked "FleetPS".
//
// Every key below says its default, what it trades off and when to change
// it. An unknown key or a bad value (wrong type, out of range, inconsistent
// batch sizes or degrees) is an InvalidArgument naming the key and the file
// (or -o override) it came from.
//
// FleetX keys that name Python objects or Paddle internals (Model.module,
// Data.*.loader.collate_fn, mix_precision.custom_black_list, ...) are accepted
// with any value so FleetX files load, and mean nothing here. FleetX features
// FleetPS does not have (pipeline parallelism, sequence parallelism, the Paddle profiler) are
// accepted only with their "off" value; anything else is refused with a message saying so.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/status.h"
#include "comm/yaml_config.h"
#include "trainer/models/adamw.h"     // AdamWConfig, LrScheduleConfig: the Optimizer section
#include "trainer/models/gpt.h"       // GptConfig: the Model section
#include "trainer/models/gpt_plan.h"  // Precision

namespace fleet::trainer::config {

enum class Device { kCpu, kGpu };
std::string_view DeviceName(Device d);

struct GlobalConfig {
  // `Global.device`: cpu | gpu, default gpu (FleetX). gpu runs the CUDA
  // kernels and NCCL on one GPU per rank; cpu runs the BLAS kernels and Gloo.
  // Set cpu for laptops and CI.
  Device device = Device::kGpu;
  // `Global.seed`: default 1024. Seeds parameter initialisation and the
  // order of training samples (with the epoch). Change it to get another
  // run of the same config; keep it to reproduce one.
  int64_t seed = 1024;
  // Batch sizes, in sequences (FleetX's definitions):
  //   global_batch_size = local_batch_size x dp_degree x sharding_degree
  //   local_batch_size  = micro_batch_size x Engine.accumulate_steps
  // `Global.global_batch_size` (default: derived) is what one optimizer
  // step sees across all ranks; `Global.local_batch_size` (default: derived)
  // what one rank sees per step; at least one of the two must be given, and
  // when both are, they must agree with the degrees. `Global.micro_batch_size`
  // (default 1) is what one forward/backward holds in memory: raise it until
  // memory or speed stops improving; the rest of the local batch is gradient
  // accumulation. local_batch_size must be a multiple of micro_batch_size.
  // After loading, all three are resolved.
  int64_t global_batch_size = 0;
  int64_t local_batch_size = 0;
  int64_t micro_batch_size = 1;
};

struct MixPrecisionConfig {
  // The compute precision, from `Engine.mix_precision`:
  //   use_pure_fp16        (FleetX before March 2023) true: float16 with
  //                        dynamic loss scaling and float32 master weights
  //                        (FleetX's AMP level O2, "pure fp16"); false:
  //                        float32. When given it decides; enable/dtype
  //                        asking for something else is an error.
  //   enable: true         (FleetX since) with dtype: float16 (FleetX's
  //                        base), bfloat16 (the default when no dtype is
  //                        given) or float32
  // Default float32 (neither set). `level` (O1 | O2) and the op lists are
  // accepted for FleetX files; FleetPS has one mixed-precision scheme (O2's:
  // float32 master weights in the optimizer, 16-bit GEMM and attention
  // operands). Reduced precision roughly halves activation memory and
  // doubles GEMM speed on GPUs with tensor cores; bfloat16 needs no loss
  // scaling and is the one to pick on Ampere or newer. CPUs compute in
  // float32 whatever is set.
  Precision precision = Precision::kFp32;
  // float16's loss scaling, Paddle's GradScaler (what FleetX uses):
  //   `scale_loss`: default 32768, > 0: the first scale. Lower it if the
  //     first steps all overflow.
  //   `use_dynamic_loss_scaling` (Paddle's): default true; false keeps
  //     scale_loss fixed (overflowing steps are still skipped).
  //   `incr_every_n_steps` (Paddle's): default 1000, >= 1: clean steps in a
  //     row before the scale doubles.
  //   `decr_every_n_nan_or_inf` (Paddle's): default 2, >= 1: overflowing
  //     steps in a row before it halves (each such step is skipped).
  //   `min_loss_scale` (FleetPS): default 1, > 0: the floor of the scale.
  double scale_loss = 32768.0;
  bool dynamic_loss_scaling = true;
  int64_t incr_every_n_steps = 1000;
  int64_t decr_every_n_nan_or_inf = 2;
  double min_loss_scale = 1.0;
};

struct SaveLoadConfig {
  // `Engine.save_load.save_steps`: default never (FleetX: absent or -1).
  // Save a checkpoint every this many optimizer steps. Smaller loses less
  // work to a crash and costs a pause per save.
  std::optional<int64_t> save_steps;
  // `Engine.save_load.save_epoch`: default 1, >= 1. Also save after every
  // this many epochs.
  int64_t save_epoch = 1;
  // `Engine.save_load.output_dir`: default ./output. Checkpoints and logs go
  // here (one subdirectory per save).
  std::string output_dir = "./output";
  // `Engine.save_load.ckpt_dir`: default empty. When set, training resumes
  // from this checkpoint (parameters, optimizer state, data position, RNG).
  std::string ckpt_dir;
};

enum class EngineMode { kPretrain, kFinetune };

struct EngineConfig {
  // `Engine.mode` (FleetPS): pretrain | finetune, default pretrain.
  // pretrain: next-token loss on every position of token streams (GPTDataset,
  // TokenBinDataset, TextDataset). finetune: supervised fine-tuning of a
  // pretrained model (init_from, required) on prompt/response pairs
  // (PromptResponseDataset, required for Data.Train), the loss on the
  // response tokens only. Full fine-tuning: every parameter trains, data
  // parallel and sharded as pretraining is.
  EngineMode mode = EngineMode::kPretrain;
  // `Engine.init_from` (FleetPS): default empty. The parameters to start
  // from: a FleetPS checkpoint (a directory holding gpt.ckpt, e.g. what
  // gpt_pretrain or gpt_convert wrote, or the file) or a Hugging Face GPT-2
  // directory (config.json + model.safetensors, whose shape must equal the
  // Model section's). Only parameters are taken (a fresh optimizer, step 0).
  // A checkpoint in save_load.output_dir (or ckpt_dir) wins: a resumed run
  // continues from it. With mode pretrain it continues pretraining from the
  // weights.
  std::string init_from;
  // `Engine.tensorboard` (FleetPS): default true. Rank 0 writes TensorBoard
  // event files (loss, learning rate, tokens/s, gradient norm, loss scale,
  // eval loss and perplexity) into <log_dir>/tb when the job has a log
  // directory (fleetrun's --log_dir), or into gpt_pretrain's
  // --tensorboard_dir. false writes none unless --tensorboard_dir asks.
  // View with `tensorboard --logdir <log_dir>/tb`.
  bool tensorboard = true;
  // `Engine.max_steps`: default 500000, >= 1. Training stops after this many
  // optimizer steps (or num_train_epochs, whichever comes first).
  int64_t max_steps = 500000;
  // `Engine.num_train_epochs`: default 1, >= 1. Passes over the training
  // split; each epoch visits the samples in a new order.
  int64_t num_train_epochs = 1;
  // `Engine.accumulate_steps`: derived, local_batch_size / micro_batch_size
  // (FleetX derives it too). If given it must equal that.
  int64_t accumulate_steps = 1;
  // `Engine.logging_freq`: default 1, >= 1. A log line (step, loss, costs,
  // tokens/s, lr) every this many steps. Raise it for long runs.
  int64_t logging_freq = 1;
  // `Engine.eval_freq`: default 500. Evaluate the held-out loss every this
  // many steps; 0 or a negative value never evaluates.
  int64_t eval_freq = 500;
  // `Engine.eval_iters`: default 10, >= 0. Batches per evaluation. More is a
  // steadier estimate and a longer pause.
  int64_t eval_iters = 10;
  // `Engine.test_iters`: default eval_iters x 10, >= 0. Batches of the test
  // split evaluated after training.
  int64_t test_iters = 100;
  MixPrecisionConfig mix_precision;
  SaveLoadConfig save_load;
  // `Engine.wall_clock_breakdown` (FleetPS; DeepSpeed's key): default
  // false. Rank 0 follows each [train] line with a [time] line: the
  // window's milliseconds per step by layer kind and the rest (communication
  // and the optimizer). For finding where a step's time goes.
  bool wall_clock_breakdown = false;
  // `Engine.dry_run` (FleetPS): default false. Print the plan (parameters,
  // memory per rank under the sharding stage and precision, FLOPs per token)
  // and exit without allocating the model. Use it to size a big config.
  bool dry_run = false;
};

// The Model section fills a trainer::GptConfig (trainer/models/gpt.h), the
// model's own construction parameters, with its seed from Global.seed:
//   `Model.vocab_size`: default 50304, >= 1. Rows of the token embedding
//     (and the tied output layer). Must cover the tokenizer's ids (50257 for
//     GPT-2, 257 for the byte vocabulary); 50304 pads GPT-2's to a multiple
//     of 128, which GEMMs like better.
//   `Model.hidden_size`: default 768, >= 1, a multiple of
//     num_attention_heads. `Model.num_layers`: default 12, >= 1.
//     `Model.num_attention_heads`: default 12, >= 1. Width, depth and heads:
//     parameters grow as 12 x layers x hidden^2.
//   `Model.ffn_hidden_size`: default 4 x hidden_size (empty or 0), >= 0.
//     Width of the MLP inside each block.
//   `Model.max_position_embeddings`: default 1024, >= 1. Rows of the
//     position embedding: the longest sequence the model takes
//     (Data.*.dataset.max_seq_len must not exceed it).
//   `Model.initializer_range`: default 0.02, > 0. Standard deviation of the
//     normal initialisation (residual projections scaled by 1/sqrt(2 L)).
//   `Model.use_recompute`: default false. Keep only each block's input in
//     forward and recompute the block in backward: activation memory of one
//     block instead of L, for ~1/3 more compute. Turn on when a micro batch
//     does not fit.
//   `Model.recompute_granularity`: full (the default; the whole block) only;
//     FleetX's full_attn and core_attn are refused.
//   `Model.hidden_dropout_prob`: default 0, in [0, 1). Dropout on the
//     embeddings and on the attention's and the MLP's outputs before each
//     joins the residual stream (FleetX's places; FleetX's configs say 0.1).
//     `Model.attention_probs_dropout_prob`: default 0, in [0, 1). Dropout
//     on the attention probabilities. Both regularise (GPT-2 pretraining at
//     scale and llm.c use 0) and cost a mask draw per element (counter-based:
//     a step's masks are a function of Global.seed, the step and the sample,
//     so a resumed or recomputed step draws the same ones); evaluation never
//     drops. On GPUs attention dropout runs the float-tile attention kernels
//     (the tensor-core ones have no dropout).
//   `Model.lora` (FleetPS): default absent (every parameter trains). LoRA
//     fine-tuning (trainer/models/gpt_lora.h): the weights are frozen (no
//     gradients, no optimizer state) and low-rank adapters beside the
//     targeted matrices train, data parallel as any run (sharding stages 1-2
//     allowed; mp_degree > 1, stage 3 and sharding_offload are refused).
//     Needs Engine.init_from (the base). Checkpoints hold the adapters alone
//     (gpt_lora.ckpt + gpt_lora.json naming the base's SHA-256);
//     `gpt_convert --merge_lora` writes a full checkpoint. Keys:
//       `rank`: required, in [1, hidden_size]. 8-16 suit most tasks; more
//         is more capacity and state.
//       `alpha`: default rank, > 0. The adapters' output is scaled by
//         alpha / rank; raise it (or the learning rate) for a stronger push.
//       `dropout`: 0 only (not implemented).
//       `targets`: default [qkv, proj, fc, fc_proj], a non-empty subset: the
//         attention's qkv and output projection, the MLP's two matrices.
//         [qkv] alone is the paper's cheapest setting.
// Accepted FleetX keys: module, name (GPT only), type_vocab_size (unused by
// GPT), fused_linear and fuse_attn_qkv (no effect: the kernels are fixed),
// sequence_parallel (false only), recompute_layers and no_recompute_layers
// (empty only: every block is recomputed).

enum class DatasetKind {
  kFleetX,          // GPTDataset: FleetX's *_ids.npy + *_idx.npz
  kTokenBin,        // TokenBinDataset: llm.c .bin token shards
  kText,            // TextDataset: text files, tokenized once into cache_dir
  kPromptResponse,  // PromptResponseDataset: JSONL prompt/response pairs (finetune)
  kMegatron,        // MegatronGPTDataset: Megatron's PREFIX.bin + PREFIX.idx
};
std::string_view DatasetKindName(DatasetKind k);

struct DatasetConfig {
  // `Data.<Split>.dataset.name`: GPTDataset (FleetX's *_ids.npy + *_idx.npz
  // pairs), TokenBinDataset (FleetPS: llm.c .bin shards), TextDataset
  // (FleetPS: text, tokenized into cache_dir at start) or
  // PromptResponseDataset (FleetPS, Engine.mode finetune only: JSONL files,
  // one {"prompt": ..., "response": ...} object a line, each pair one
  // sequence padded to max_seq_len, data/prompt_response.h) or
  // MegatronGPTDataset (FleetPS: Megatron-LM's indexed dataset PREFIX.bin +
  // PREFIX.idx, sampled as Megatron's GPT dataset samples it: documents
  // shuffled over as many epochs as the run's samples need, from
  // Global.seed; the training loop then reads its samples in order, as
  // Megatron's sampler does; data/megatron_data.h). Default GPTDataset.
  DatasetKind kind = DatasetKind::kFleetX;
  // `Data.<Split>.dataset.input_dir` (FleetX): a directory holding the
  // data files. `input_files` (FleetPS): a file list instead, as
  // comma-separated files, directories or globs ("a.bin,shards/*.bin").
  // At most one of the two. TextDataset with neither trains on the default
  // corpus (data/default_corpus.h: the fortunes a Debian package
  // installs).
  std::string input_dir;
  std::string input_files;
  // `Data.<Split>.dataset.split`: default [949, 50, 1]. Weights of the
  // train / eval / test parts of the data's documents (token ranges for
  // .bin shards, which have no document index), cut in order as FleetX
  // does. Train reads part 0, Eval part 1, Test part 2. [1, 0, 0] gives all
  // to training, e.g. when Eval names other files.
  std::vector<double> split = {949, 50, 1};
  // `Data.<Split>.dataset.max_seq_len`: default 1024, >= 1. Tokens per
  // sequence T (each sample holds T+1: inputs and shifted targets). Longer
  // sees more context and costs O(T^2) attention.
  int64_t max_seq_len = 1024;
  // `Data.<Split>.dataset.tokenizer` (FleetPS): gpt2 | byte, default gpt2.
  // The vocabulary the token ids are in: TextDataset tokenizes with it,
  // gpt_generate encodes prompts and decodes with it. byte (256 bytes + an
  // end-of-text token, 257 ids) needs no vocabulary files and suits tiny
  // models; gpt2 is GPT-2's 50257-token BPE.
  std::string tokenizer = "gpt2";
  // `Data.<Split>.dataset.vocab_dir` (FleetPS): default empty, meaning
  // the first of $FLEET_GPT2_VOCAB_DIR, beside the binary, the working
  // directory's .cache/gpt2-bpe and the source tree's that holds GPT-2's
  // encoder.json and vocab.bpe (data/gpt2_tokenizer.h). Set it to
  // use another copy of the two files.
  std::string vocab_dir;
  // `Data.<Split>.dataset.vocab_file`, `merge_file` (FleetPS; Megatron's
  // --vocab-file / --merge-file): gpt2's encoder.json and vocab.bpe named
  // one by one (any names); both or neither, and not with vocab_dir.
  std::string vocab_file;
  std::string merge_file;
  // `Data.<Split>.dataset.text_format` (FleetPS, TextDataset): how a text
  // file splits into documents (an end-of-text token goes between them):
  // file (each file is one document; default), line, blank_line
  // (paragraphs), percent (fortune files: documents between "%" lines) or
  // jsonl (one JSON object per line, its "text" field, as FleetX's
  // preprocessing reads).
  std::string text_format = "file";
  // `Data.<Split>.dataset.cache_dir` (FleetPS, TextDataset): default
  // .cache/fleetps/tokens (relative to the working directory). Tokenized
  // text is written here once (FleetX npy/npz, named by a hash of the
  // inputs and tokenizer) and reused while the inputs are unchanged.
  std::string cache_dir = ".cache/fleetps/tokens";
};

struct DataSplitConfig {
  // True when the config has this section (Data.Train, Data.Eval, Data.Test).
  bool present = false;
  DatasetConfig dataset;
  // The order of training samples is the collective loop's
  // (collective/train_loop.h): a fresh permutation every epoch from
  // Global.seed and the epoch, the last partial global batch dropped. So the
  // FleetX keys under `sampler` are accepted as FleetX writes them: name
  // (GPTBatchSampler or DistributedBatchSampler), shuffle (any; FleetX's
  // GPTDataset shuffles internally too and its configs say false) and
  // drop_last (true only). Under `loader`: num_workers (samples are read
  // from memory-mapped files on the training thread; avg_reader_cost in the
  // log shows what that costs), return_list, collate_fn.
};

struct DataConfig {
  DataSplitConfig train;  // Data.Train (required)
  DataSplitConfig eval;   // Data.Eval (no evaluation without it)
  DataSplitConfig test;   // Data.Test
};

// The Optimizer section fills the optimizer's own structs
// (trainer/models/adamw.h): AdamWConfig and LrScheduleConfig.
//   `Optimizer.name`: AdamW or FusedAdamW (the same here): AdamW with
//     decoupled weight decay, none on biases and LayerNorm parameters.
//   `Optimizer.weight_decay`: default 0.01, >= 0 (GPT-3 used 0.1).
//   `Optimizer.beta1`: default 0.9; `Optimizer.beta2`: default 0.999 (GPT-3
//     used 0.95 for stability at scale); both in [0, 1).
//   `Optimizer.epsilon`: default 1e-8, > 0.
//   `Optimizer.grad_clip.clip_norm` (name ClipGradByGlobalNorm): default
//     1.0, >= 0; gradients are scaled down when their global L2 norm
//     exceeds it; 0 turns clipping off. Guards against loss spikes.
//   `Optimizer.lr`: linear warmup to max_lr over warmup_rate x decay_steps
//     steps (rounded to whole steps), then by `name`:
//       CosineAnnealingWithWarmupDecay (FleetX's; the default) cosine decay
//         to min_lr at decay_steps, min_lr after;
//       LinearAnnealingWithWarmupDecay (FleetPS; Megatron's linear
//         --lr-decay-style) linear decay to min_lr at decay_steps;
//       ConstantWithWarmup (FleetPS; Megatron's constant) max_lr after warmup;
//       WarmupLR, WarmupDecayLR (DeepSpeed's schedulers): warmup from
//         warmup_min_lr by warmup_type (log, DeepSpeed's default, or
//         linear), then max_lr (WarmupLR) or a linear decay back to
//         warmup_min_lr at decay_steps (WarmupDecayLR).
//     `max_lr`: default 5e-5, > 0; `min_lr`: default 1e-5, in [0, max_lr];
//     `decay_steps`: default 360000, >= 1, usually about Engine.max_steps;
//     `warmup_rate`: default 0.01, in [0, 1]; `warmup_steps` (FleetPS):
//     the warmup in steps instead, <= decay_steps; `warmup_min_lr`,
//     `warmup_type`: DeepSpeed's, only with its two names. Larger models and
//     batches want a lower max_lr and a longer warmup.
//     `use_increments` (FleetX): default false. True counts decay_steps and
//     the warmup in samples (FleetX's scheduler steps by the global batch).
// Accepted FleetX key: tensor_fusion (parameters always live in one buffer).

struct DistributedConfig {
  // `Distributed.dp_degree`: default (empty) world size / sharding_degree.
  // Data-parallel replicas. When given, dp_degree x sharding_degree must
  // equal the number of ranks. With both degrees above 1, rank r is in
  // sharding group r / sharding_degree at index r % sharding_degree
  // (FleetX's order; collective/parallel_groups.h).
  int64_t dp_degree = 1;
  // `Distributed.sharding.sharding_degree`: default 1, >= 1. Ranks that
  // split the optimizer state (stage 1) and gradients (stage 2) among
  // themselves; they also read distinct data, like dp ranks.
  int64_t sharding_degree = 1;
  // `Distributed.sharding.sharding_stage`: 1, 2 or 3, default 1. Stage 1
  // keeps 1/sharding_degree of the optimizer state per rank; stage 2 also
  // keeps only the rank's shard of the gradients after reduce-scatter;
  // stage 3 also of the parameters, all-gathering each block's just before
  // its forward and backward (1.5x stage 2's communication). Same result
  // whichever; each stage saves more memory than the one before.
  int64_t sharding_stage = 1;
  // `Distributed.sharding.sharding_offload`: default false. Keep the fp32
  // master weights and AdamW's moments on the host and update them there on
  // CPU threads (collective/sharded_adamw.h, "Offload"): frees 12
  // bytes per parameter of the rank's share from the device for two copies
  // of the share per step. For models whose state does not fit the device.
  bool sharding_offload = false;
  // `Distributed.mp_degree`: default 1. Megatron tensor parallelism's
  // degree: each group of mp_degree consecutive ranks splits every block
  // (heads, MLP width) and the vocabulary (trainer/models/
  // gpt_tensor_parallel.h) and reads the same data. Must divide the heads
  // and the MLP width. Raise it when the model does not fit a rank even
  // with ZeRO; it costs activation all-reduces every block (best within a
  // node). Ranks = dp_degree x pp_degree x sharding_degree x mp_degree.
  int64_t mp_degree = 1;
  // `Distributed.pp_degree`: default 1. Pipeline parallelism's degree
  // (collective/gpt_pipeline.h): the blocks are cut into pp_degree stages
  // of num_layers / pp_degree consecutive blocks (the first stage also holds
  // the embeddings, the last the head), each on its own ranks, and a step's
  // Engine.accumulate_steps micro-batches flow through them in Megatron's
  // 1F1B schedule. Must divide Model.num_layers; combines with mp_degree,
  // dp_degree and sharding stage 1 (not stages 2-3, offload or LoRA). A
  // stage holds 1 / pp_degree of the layers' parameters and state and the
  // activations of up to pp_degree micro-batches; each stage idles for
  // (pp_degree - 1) / (accumulate_steps + pp_degree - 1) of a step (the
  // bubble), so give it several micro-batches per stage.
  int64_t pp_degree = 1;
  // `Distributed.reduce_bucket_size` (FleetPS; DeepSpeed's, in elements):
  // default 0, FleetPS's 1 MiB buckets. Gradients reduce (and, sharded,
  // all-gather) in buckets of about this many floats as backward finishes
  // them: larger ones start later and take fewer calls. Stage 3's buckets
  // are the model's units whatever it says.
  int64_t reduce_bucket_size = 0;
  // Accepted FleetX keys: sharding.reduce_overlap and sharding.broadcast_overlap (communication
  // is always overlapped where the loop can).
};

struct GenerationConfig {
  // `Generation.decode_strategy`: sampling | greedy_search, default
  // sampling. Greedy is deterministic and repetitive.
  std::string decode_strategy = "sampling";
  // `Generation.top_k`: default 50, >= 0 (0: no top-k cut). Sample only
  // among the k most likely tokens.
  int64_t top_k = 50;
  // `Generation.top_p`: default 0.75, in (0, 1] (1: no cut). Sample only
  // among the most likely tokens whose probabilities add up to p.
  double top_p = 0.75;
  // `Generation.temperature`: default 1.0, >= 0. Lower is more conservative;
  // 0 is greedy (the most likely token), whatever decode_strategy says.
  double temperature = 1.0;
  // `Generation.min_dec_len`: default 1, >= 0; `max_dec_len`: default 200,
  // >= min_dec_len. Bounds on generated tokens (end-of-text is not
  // sampled before min_dec_len).
  int64_t min_dec_len = 1;
  int64_t max_dec_len = 200;
  // `Generation.num_return_sequences`: default 1, >= 1.
  int64_t num_return_sequences = 1;
};

struct GptJobConfig {
  GlobalConfig global;
  EngineConfig engine;
  GptConfig model;
  DataConfig data;
  AdamWConfig optimizer;
  LrScheduleConfig lr;
  DistributedConfig distributed;
  GenerationConfig generation;

  // Ranks that read distinct data: dp_degree x sharding_degree.
  int64_t data_world_size() const { return distributed.dp_degree * distributed.sharding_degree; }

  // The merged document (for error messages naming a key's file, and for
  // printing the effective config).
  ConfigDocument document;

  // What loading adjusted for the job, one line each for the log: today, a
  // config written for more data-parallel ranks than the job has, run with
  // its global batch through more gradient accumulation.
  std::vector<std::string> notes;
};

// Reads `path` (its `_base_` chain, then `overrides` in order), checks every
// key and resolves the derived values: dp_degree, the three batch sizes,
// accumulate_steps, test_iters.
// `world_size` is the number of ranks of the job; 0 means "as the config
// says" (dp_degree, or 1 when it is empty, times sharding_degree and
// mp_degree), which is
// what a dry run of a big config uses on a small machine.
// A file's dp_degree written for more ranks than `world_size` gives is
// lowered to fit, keeping the global batch by gradient accumulation (noted
// in GptJobConfig::notes); a dp_degree given on the command line is not.
// Errors: NotFound (the file or a base), InvalidArgument naming the key and
// its file for unknown keys, wrong types, out-of-range values and
// inconsistent batch sizes or degrees (including a world_size they do not
// fit; that message lists every override the job would need).
Result<GptJobConfig> LoadGptJobConfig(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      int64_t world_size = 0);

// The same over an already loaded document (overrides applied).
Result<GptJobConfig> ParseGptJobConfig(ConfigDocument document, int64_t world_size = 0);

}  // namespace fleet::trainer::config
