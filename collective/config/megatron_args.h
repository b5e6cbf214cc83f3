// The command line of Megatron-LM's pretrain_gpt2.py (v1.1.5, the DeepSpeed
// Megatron GPT-2 examples' version) and DeepSpeed's JSON config, read as a
// GPT job config (gpt_config.h): what gpt_pretrain runs when it is given
// Megatron's flags instead of -c FILE, so a seed's script runs with its
// launcher and program names changed:
//
//   fleetrun --nproc_per_node 8 --nnodes N --node_rank R --master_addr A --master_port P
//     build/bin/gpt_pretrain --deepspeed --deepspeed_config ds.json --model-parallel-size 8
//     --num-layers 480 --hidden-size 4096 --num-attention-heads 32 --batch-size 6 ...
//
// The translation is a YAML document over FleetPS's keys: Megatron's
// defaults (kMegatronDefaults below: seed 1234, dropout 0.1, weight decay
// 0.01, Adam's betas 0.9 and 0.999, linear decay, warmup 0.01, log every
// 100 steps, evaluate every 1000 on 100 batches, split 969,30,1, vocabulary
// padded to 128 x the model-parallel size, fp16 loss scale 2^32 with window
// 1000 and hysteresis 2) under what the flags and the JSON say, then
// ParseGptJobConfig, so every check of a YAML job applies (an error names
// the flag or JSON key that set the value).
//
// Flags (every one of the seeds' command lines; --name value or
// --name=value):
//   honoured  --model-parallel-size, --num-layers, --hidden-size,
//             --num-attention-heads, --max-position-embeddings,
//             --seq-length, --batch-size (per GPU: the micro-batch),
//             --train-iters, --lr, --min-lr, --lr-decay-style
//             (linear | cosine | constant), --lr-decay-iters, --warmup,
//             --weight-decay, --clip-grad, --adam-beta1, --adam-beta2,
//             --adam-eps, --hidden-dropout, --attention-dropout,
//             --init-method-std, --seed, --make-vocab-size-divisible-by,
//             --fp16, --loss-scale (static), --initial-loss-scale,
//             --min-loss-scale, --loss-scale-window, --hysteresis,
//             --checkpoint-activations (Model.use_recompute), --save,
//             --load, --save-interval, --log-interval, --eval-interval,
//             --eval-iters, --data-path (Megatron's indexed dataset),
//             --train-data (loose JSON, a "text" field a line), --split,
//             --vocab-file, --merge-file, --tokenizer-type
//             (GPT2BPETokenizer), --cpu-optimizer (ZeRO-Offload: with a
//             DeepSpeed config's zero_optimization), --deepspeed,
//             --deepspeed_config
//   accepted, with a note saying what FleetPS does instead:
//             --distributed-backend (NCCL on GPUs, shared memory or Gloo on
//             CPU ranks, whatever it says), --lazy-loader (text is tokenized
//             once into a cache and memory-mapped), --local_rank (the rank
//             comes from fleetrun)
//   anything else is refused naming it.
//
// DeepSpeed's JSON (--deepspeed_config): train_batch_size,
// train_micro_batch_size_per_gpu, gradient_accumulation_steps (any two
// determine the third, as DeepSpeed derives it), gradient_clipping,
// optimizer (Adam / AdamW: lr, betas, eps, weight_decay), scheduler
// (WarmupLR, WarmupDecayLR: warmup_min_lr, warmup_max_lr, warmup_num_steps,
// warmup_type, total_num_steps), fp16 (enabled, loss_scale 0 = dynamic,
// initial_scale_power, loss_scale_window, hysteresis, min_loss_scale),
// bf16 (enabled), zero_optimization (stage: sharding over the data-parallel
// ranks; offload_optimizer / cpu_offload: sharding_offload;
// reduce_bucket_size: the gradient buckets; allgather_bucket_size,
// overlap_comm, contiguous_gradients, allgather_partitions, reduce_scatter:
// noted, FleetPS's behaviour is fixed; offload_param is refused: parameters
// stay on the device), activation_checkpointing (partition_activations,
// cpu_checkpointing: noted, not built), steps_per_print (the log interval
// when --log-interval is not given), wall_clock_breakdown (a time
// breakdown line after each log line). The JSON's optimizer, scheduler and
// clipping win over the flags, as in Megatron-DeepSpeed (a note says so
// where they differ). Unknown keys: one warning line naming each.
//
// Thread safety: free functions.
#pragma once

#include <string>
#include <vector>

#include "collective/config/gpt_config.h"
#include "comm/status.h"

namespace fleet::trainer::config {

// Whether `name` (without "--") is a Megatron or DeepSpeed flag above.
bool IsMegatronFlag(std::string_view name);

// True when `args` hold a Megatron flag: gpt_pretrain then reads them with
// ParseMegatronCommandLine (FleetPS's own --flags may be mixed in).
bool IsMegatronCommandLine(const std::vector<std::string>& args);

struct MegatronTarget {
  int64_t world_size = 1;  // ranks of the job (the Megatron layout's dp = world / mp)
  bool gpu = true;         // Global.device gpu (else cpu)
};

struct MegatronCommand {
  GptJobConfig config;
  // One line each: a flag or key accepted with another effect than in
  // Megatron / DeepSpeed, and "warning: ..." for each unknown DeepSpeed key.
  std::vector<std::string> notes;
  // Everything in `args` that is not a Megatron flag (with its value), in
  // order: the program's own flags.
  std::vector<std::string> rest;
};

// The arguments of `args` that are not Megatron flags (nor their values):
// the program's own, for its flag parser. InvalidArgument as below for a
// Megatron flag without its value.
Result<std::vector<std::string>> NonMegatronArgs(const std::vector<std::string>& args);

// Reads the flags (and the DeepSpeed JSON they name). Errors:
// InvalidArgument naming the flag or JSON key (a missing required flag, a
// bad value, a feature FleetPS lacks with the reason), NotFound / IOError
// for the JSON file, and ParseGptJobConfig's errors with the flag that set
// the key.
Result<MegatronCommand> ParseMegatronCommandLine(const std::vector<std::string>& args,
                                                 const MegatronTarget& target);

}  // namespace fleet::trainer::config
