// GPT pretraining from a FleetX-style config (collective/config/gpt_config.h):
// what the gpt_pretrain program and the tests run. It opens the Train (and
// Eval) data the config names, builds the model on the CPU kernels (one
// thread set, gpt_cpu_kernels.h) or a GPU twin, and trains it with the
// collective loop (train_loop.h): micro-batches = Engine.accumulate_steps
// (with Distributed.pp_degree > 1 run through the pipeline's stages,
// gpt_pipeline.h), AdamW with the cosine schedule, its state replicated or sharded per
// Distributed.sharding (sharded_adamw.h), evaluation every Engine.eval_freq
// steps, checkpoints into Engine.save_load.output_dir every save_steps
// steps, after each epoch and at the end, resuming from ckpt_dir (or
// output_dir when it holds a checkpoint). Engine.mode finetune trains the
// same way on PromptResponseDataset pairs (loss on response tokens only),
// starting from Engine.init_from's parameters (a FleetPS or Hugging Face
// GPT-2 checkpoint, trainer/models/gpt_hf.h), which pretraining may also
// start from. With Model.lora the loaded weights stay frozen and only LoRA's
// adapters train (trainer/models/gpt_lora.h): the loop, the updater and
// the checkpoints (gpt_lora.ckpt, and the manifest gpt_lora.json written
// at the start, trainer/models/gpt_lora_files.h) see the adapters alone, and
// TrainReport::params holds them. Resuming refuses adapters of another base.
//
// Log lines (FleetX's, to `progress`):
//   [train] epoch: E, batch: B, loss: L, avg_batch_cost: C sec, speed: X step/s,
//       ips_total: T tokens/s, ips: P tokens/s, learning rate: LR, avg_reader_cost: R sec
//     FleetX's line (B: the last step's index in its epoch, from 0), then the reader cost
//   [eval] epoch: E, step: S, loss: L, ppl: P, eval_cost: C sec
//   [time] ms per step: ...                 with Engine.wall_clock_breakdown
//   [test] step: S, loss: L, ppl: P        after training, when the config
//       has Data.Test and Engine.test_iters > 0 (TrainReport::test_metric)
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "comm/cluster.h"
#include "comm/collective.h"
#include "comm/status.h"
#include "collective/parallel_groups.h"
#include "collective/train_loop.h"
#include "collective/config/gpt_config.h"
#include "trainer/models/gpt_plan.h"

namespace fleet::trainer::collective {

struct GptPretrainOptions {
  // This rank's device when Global.device is gpu: "cuda:K" (fleetrun's
  // FLEET_DEVICE). Ignored for Global.device cpu.
  std::string gpu_device = "cuda:0";
  // CPU threads of this rank's kernels (>= 1): the cores the rank may use.
  // SetUpGptCpuThreads sets OpenBLAS to one thread process-wide.
  int cpu_threads = 1;
  // The group's own bound on each collective call; the loop's waits for its
  // communication thread get twice this, so the Collective, which knows the
  // operation and peer, reports a failure first.
  std::chrono::milliseconds collective_timeout{30000};
  // Called after every step (tests: fault injection); may be empty.
  std::function<Status(int64_t step)> after_step;
  // Joins this rank's subgroups (parallel_groups.h): the sharding and
  // data-parallel groups when both Distributed.dp_degree and
  // sharding_degree exceed 1; the model-parallel group, the pipeline's
  // links and groups and the data world when mp_degree or pp_degree
  // exceeds 1 and they are not the whole job (programs: rank_setup.h
  // RankGroupFactory). Unused otherwise.
  GroupFactory join_group;
  // Measure the memory each rank holds for parameters, gradients and
  // optimizer state (TrainReport::memory's measured_* fields; CPU only, a
  // look at the page table per measurement). For tests and benchmarks.
  bool measure_memory = false;
  // Rank 0 writes TensorBoard event files here (empty: none): the loop's
  // curves (train_loop.h) plus train/tokens_per_sec and eval/ppl.
  // Programs: tensorboard::TensorBoardDir of --tensorboard_dir, the log dir
  // and Engine.tensorboard.
  std::string tensorboard_dir;
  // Rank 0 also writes the same curves here (not owned; null: none), e.g.
  // as figures of its progress reports for fleetrun's job page.
  tensorboard::ScalarSink* figures = nullptr;
};

// Trains as described above. `collective` is this rank's group (null for
// one process); its size must equal dp_degree x pp_degree x
// sharding_degree x mp_degree, and on GPUs it must be an NCCL group on
// gpu_device. With mp_degree or pp_degree > 1 the ranks of each replica
// (its tensor-parallel ranks and pipeline stages, gpt_pipeline.h) read the
// same data and only the first stage's first rank prints the log lines;
// TrainReport::params is the whole model on every rank. Engine.mix_precision: bfloat16 or
// float16 GEMMs on GPUs (the CPU computes in float32), float16 with dynamic
// loss scaling from scale_loss. Errors: those of the data, the model, the
// loop and the checkpoints, each naming what failed; Unavailable for
// Global.device gpu in a build or on a machine without CUDA.
Result<TrainReport> RunGptPretrain(const config::GptJobConfig& config, Collective* collective,
                                   const GptPretrainOptions& options, std::ostream* progress);

// The dry-run plan's options for `config` (Engine.dry_run): its batch,
// sequence, degrees, stage, offload and precision; ranks per node from
// FLEET_NPROC_PER_NODE (fleetrun sets it), else the job's ranks up to 8 (a
// GPU node).
GptPlanOptions GptPlanOptionsFor(const config::GptJobConfig& config, const EnvLookup& env);

// The dry-run plan of `config` on the device it names: on GPUs with the
// flash attention's memory, on CPU ranks with what the CPU twin holds and in
// fp32 (what a CPU runs, whatever Engine.mix_precision asks). Errors as
// PlanGpt.
Result<GptPlan> PlanGptJob(const config::GptJobConfig& config, const EnvLookup& env);

// The FleetX-style lines above, for a run of `tokens_per_sample` tokens a
// sample.
std::string GptTrainLine(const ProgressWindow& window, int64_t tokens_per_sample);
// Engine.wall_clock_breakdown's line after each [train] line:
//   [time] ms per step: embedding E, layernorm L, ..., other (communication,
//       optimizer, data) O
// the model's kernel time by kind over the window's steps (on a GPU the
// launch times; GptProfile), and the rest of the window's time.
std::string GptTimeLine(const GptProfile& profile, const ProgressWindow& window);
std::string GptEvalLine(const EvalWindow& window);

}  // namespace fleet::trainer::collective
