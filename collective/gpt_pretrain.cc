#include "collective/gpt_pretrain.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "collective/config/gpt_data.h"
#include "collective/gpt_task.h"
#include "collective/loss_scaler.h"
#include "collective/sharded_adamw.h"
#include "comm/thread_pool.h"
#include "trainer/backend.h"
#include "trainer/kernels/backend_factory.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/adamw.h"
#include "trainer/models/gpt_hf.h"
#include "trainer/models/gpt_lora.h"
#include "trainer/models/gpt_lora_files.h"
#include "trainer/models/gpt_tensor_parallel.h"

namespace fleet::trainer::collective {

std::string GptTrainLine(const ProgressWindow& w, int64_t tokens_per_sample) {
  const double steps = static_cast<double>(std::max<int64_t>(w.steps, 1));
  const double speed = w.seconds > 0 ? w.steps / w.seconds : 0.0;
  const double ips_total = speed * static_cast<double>(w.global_batch * tokens_per_sample);
  // FleetX's line (ppfleetx LanguageModule.training_step_end), field for
  // field, so its log parsers read ours; the reader cost comes last, after
  // every field FleetX has. As there, ips_total is the tokens of every
  // rank's samples a second and ips that over the data world (dp x
  // sharding; one tensor- or pipeline-parallel replica counts once).
  return absl::StrFormat(
      "[train] epoch: %d, batch: %d, loss: %.9f, avg_batch_cost: %.5f sec, speed: %.2f step/s, "
      "ips_total: %.0f tokens/s, ips: %.0f tokens/s, learning rate: %.5e, "
      "avg_reader_cost: %.5f sec",
      w.epoch, w.batch, w.loss, w.seconds / steps, speed, ips_total,
      ips_total / std::max(w.data_world_size, 1), w.learning_rate, w.reader_seconds / steps);
}

GptPlanOptions GptPlanOptionsFor(const config::GptJobConfig& config, const EnvLookup& env) {
  const config::DistributedConfig& d = config.distributed;
  GptPlanOptions o;
  o.micro_batch_size = static_cast<int>(config.global.micro_batch_size);
  o.seq_len = static_cast<int>(config.data.train.dataset.max_seq_len);
  o.sharding_degree = static_cast<int>(d.sharding_degree);
  o.sharding_stage = d.sharding_degree > 1 ? static_cast<int>(d.sharding_stage) : 0;
  o.precision = config.engine.mix_precision.precision;
  o.mp_degree = static_cast<int>(d.mp_degree);
  o.dp_degree = static_cast<int>(d.dp_degree);
  o.offload = d.sharding_offload;
  o.cpu = config.global.device == config::Device::kCpu;
  o.accumulate_steps = static_cast<int>(config.engine.accumulate_steps);
  o.pp_degree = static_cast<int>(d.pp_degree);
  const int64_t world = d.dp_degree * d.pp_degree * d.sharding_degree * d.mp_degree;
  int per_node = 0;
  if (std::optional<std::string> n = env("FLEET_NPROC_PER_NODE")) {
    if (!absl::SimpleAtoi(*n, &per_node)) per_node = 0;
  }
  o.ranks_per_node = per_node > 0 ? per_node : static_cast<int>(std::min<int64_t>(world, 8));
  return o;
}

Result<GptPlan> PlanGptJob(const config::GptJobConfig& config, const EnvLookup& env) {
  GptPlanOptions options = GptPlanOptionsFor(config, env);
  if (config.global.device != config::Device::kCpu) return PlanGpt(config.model, options);
  // CPU ranks compute in fp32 whatever mix_precision asks, and the CPU twin
  // keeps each layer's attention probabilities (B NH T T floats) where a
  // GPU's flash kernels keep B NH T: plan what runs.
  options.precision = Precision::kFp32;
  FLEET_ASSIGN_OR_RETURN(GptCompute cpu, CreateGptCompute("cpu", Precision::kFp32, 1));
  return PlanGpt(config.model, options, cpu.kernels.get());
}

std::string GptTimeLine(const GptProfile& profile, const ProgressWindow& w) {
  const double steps = static_cast<double>(std::max<int64_t>(w.steps, 1));
  std::string line = "[time] ms per step:";
  double kernels = 0;
  for (size_t k = 0; k < GptProfile::kKinds; ++k) {
    const double ms = profile.seconds[k] * 1e3 / steps;
    kernels += ms;
    absl::StrAppend(&line, k == 0 ? " " : ", ",
                    std::string(GptProfile::Name(static_cast<GptLayerKind>(k))), " ",
                    absl::StrFormat("%.2f", ms));
  }
  absl::StrAppend(&line, absl::StrFormat(", other (communication, optimizer, data) %.2f",
                                         std::max(0.0, w.seconds * 1e3 / steps - kernels)));
  return line;
}

std::string GptEvalLine(const EvalWindow& w) {
  return absl::StrFormat("[eval] epoch: %d, step: %d, loss: %.6f, ppl: %.4f, eval_cost: %.2f sec",
                         w.epoch, w.step, w.metric, std::exp(w.metric), w.seconds);
}

namespace {

// LoRA's manifest (gpt_lora_files.h): a checkpoint the run resumes from must
// have been trained over the same base with the same adapters; rank 0 then
// writes the manifest into the output directory for later saves and merges.
Status PrepareLoraCheckpoints(const config::GptJobConfig& config, bool writer) {
  const config::SaveLoadConfig& save = config.engine.save_load;
  FLEET_ASSIGN_OR_RETURN(std::string base, PretrainedFingerprint(config.engine.init_from));
  const std::filesystem::path resume(save.ckpt_dir.empty() ? save.output_dir : save.ckpt_dir);
  std::error_code ec;
  if (std::filesystem::exists(resume / kGptLoraCheckpointFile, ec)) {
    FLEET_RETURN_IF_ERROR(CheckGptLoraManifest(resume.string(), config.model, base)
                              .WithContext("resuming LoRA adapters"));
  }
  if (!writer) return Status::OK();
  return WriteGptLoraManifest(save.output_dir, config.model, config.engine.init_from, base);
}

// Engine.init_from's weights into `arena`: the whole model, or this rank's
// part of it under `split` (tensor-parallel ranks, pipeline stages).
Status LoadPretrainedPart(const config::GptJobConfig& config, const ParamSplit* split,
                          ParamArena* arena) {
  if (split == nullptr) return LoadPretrainedGpt(config.engine.init_from, config.model, arena);
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<Backend> cpu, CreateBackend(Device{}, nullptr));
  FLEET_ASSIGN_OR_RETURN(ParamArena whole,
                         ParamArena::Create(GptParamTable(config.model), cpu.get()));
  FLEET_RETURN_IF_ERROR(LoadPretrainedGpt(config.engine.init_from, config.model, &whole));
  std::vector<float> part(arena->size());
  TakePart(*split, std::span<const float>(whole.params().data(), whole.size()), part);
  return arena->ParamsFromHost(part);
}

}  // namespace

Result<TrainReport> RunGptPretrain(const config::GptJobConfig& config, Collective* collective,
                                   const GptPretrainOptions& options, std::ostream* progress) {
  const int world = collective ? collective->size() : 1;
  const config::DistributedConfig& dist = config.distributed;
  const int mp = static_cast<int>(dist.mp_degree), pp = static_cast<int>(dist.pp_degree);
  if (config.data_world_size() * mp * pp != world) {
    return Status::InvalidArgument(
        absl::StrCat("the config's dp_degree x pp_degree x sharding_degree x mp_degree is ",
                     config.data_world_size() * mp * pp, " but the job has ", world, " ranks"),
        "Distributed.dp_degree");
  }
  // The groups first: the model is built for this rank's stage and
  // tensor-parallel part.
  const HybridLayout layout{static_cast<int>(dist.dp_degree),
                            static_cast<int>(dist.sharding_degree), mp, pp};
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<HybridGroups> hybrid,
                         HybridGroups::Create(layout, collective, options.join_group));
  const int rank = collective ? collective->rank() : 0;
  const int stage_index = layout.pp_index(rank);
  FLEET_ASSIGN_OR_RETURN(GptStage stage, GptPipelineStage(config.model, pp, stage_index));
  FLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<GptTensorParallel> tensor_parallel,
      GptTensorParallel::Create(config.model, hybrid->model_parallel(), pp > 1 ? &stage : nullptr));
  // What each rank of a replica's model holds (null: the whole model):
  // checkpoints, the clipping norm and the report see the whole model
  // through it.
  std::optional<ParamSplit> model_split;
  if (pp > 1) {
    model_split = GptModelSplit(config.model, mp, pp, stage_index * mp + layout.mp_index(rank));
    model_split->group = hybrid->model();
  }
  const ParamSplit* split = pp > 1 ? &*model_split : mp > 1 ? &tensor_parallel->split() : nullptr;
  // The loop runs over the data world: the ranks of a replica's model (its
  // stages and tensor-parallel ranks) read the same samples and show one
  // set of lines (the first stage's first rank's).
  Collective* data_world = hybrid->groups().world;
  const bool lead = tensor_parallel->lead() && stage_index == 0;
  if (!lead) progress = nullptr;
  const Precision precision = config.engine.mix_precision.precision;
  const std::string device =
      config.global.device == config::Device::kCpu ? std::string("cpu") : options.gpu_device;
  FLEET_ASSIGN_OR_RETURN(GptCompute compute,
                         CreateGptCompute(device, precision, options.cpu_threads));
  if (progress != nullptr && !compute.precision_note.empty()) *progress << compute.precision_note << std::endl;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<data::GptSamples> train,
                         data::OpenConfiguredSamples(config, data::DataPart::kTrain));
  std::unique_ptr<data::GptSamples> eval;
  if (config.data.eval.present && config.engine.eval_freq > 0) {
    FLEET_ASSIGN_OR_RETURN(eval, data::OpenConfiguredSamples(config, data::DataPart::kEval));
  }

  GptKernels* kernels = compute.kernels.get();
  GptTaskOptions task_options;
  task_options.eval_iters = config.engine.eval_iters;
  task_options.eval_batch = static_cast<int>(config.global.micro_batch_size);
  task_options.tensor_parallel = mp > 1 ? tensor_parallel.get() : nullptr;
  task_options.seed = static_cast<uint64_t>(config.global.seed);
  if (pp > 1) {
    // The step's micro-batches run through the stages inside the task.
    task_options.pipeline = GptPipelineOptions{pp,
                                               stage_index,
                                               static_cast<int>(config.engine.accumulate_steps),
                                               hybrid->pipeline_prev(),
                                               hybrid->pipeline_next(),
                                               hybrid->embedding()};
  }
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<GptTask> task,
                         GptTask::Create(config.model, compute.backend.get(), kernels,
                                         std::move(train), std::move(eval), task_options));
  if (!config.engine.init_from.empty()) {
    // Every rank reads the weights itself (the loop then broadcasts rank 0's
    // anyway) and keeps its part; a checkpoint the loop resumes from
    // replaces them.
    FLEET_RETURN_IF_ERROR(
        LoadPretrainedPart(config, split, &task->model().arena()).WithContext("Engine.init_from"));
    if (progress != nullptr && rank == 0) {
      *progress << "gpt_pretrain: parameters from " << config.engine.init_from << std::endl;
    }
  }
  const bool lora = config.model.lora.enabled();
  if (lora) {
    // Every rank checks what it resumes from; rank 0 writes the manifest.
    FLEET_RETURN_IF_ERROR(PrepareLoraCheckpoints(config, rank == 0));
    if (progress != nullptr && rank == 0) {
      *progress << "gpt_pretrain: LoRA rank " << config.model.lora.rank << ", alpha "
                << config.model.lora.alpha << ": " << GptLoraParamCount(config.model)
                << " adapter parameters train, " << GptParamCount(config.model)
                << " stay frozen" << std::endl;
    }
  }

  const LrSchedule schedule(config.lr);
  const config::SaveLoadConfig& save = config.engine.save_load;
  TrainLoopOptions loop;
  loop.epochs = static_cast<int>(config.engine.num_train_epochs);
  loop.batch_size = static_cast<int>(config.global.local_batch_size);
  // With pipeline stages the task runs the micro-batches (gpt_pipeline.h).
  loop.micro_batches = pp > 1 ? 1 : static_cast<int>(config.engine.accumulate_steps);
  loop.shuffle_seed = static_cast<uint64_t>(config.global.seed);
  // Megatron's dataset is shuffled by its own indices; its sampler reads it in order.
  loop.shuffle = config.data.train.dataset.kind != config::DatasetKind::kMegatron;
  loop.max_steps = config.engine.max_steps;
  loop.log_every_steps = static_cast<int>(config.engine.logging_freq);
  loop.evaluate = false;  // FleetX evaluates by step (eval_freq), not per epoch
  loop.eval_every_steps =
      task->num_train_samples() > 0 && config.engine.eval_freq > 0 && config.data.eval.present
          ? config.engine.eval_freq
          : 0;
  loop.checkpoint_dir = save.output_dir;
  loop.resume_dir = save.ckpt_dir;
  loop.checkpoint_every_steps = save.save_steps.value_or(0);
  loop.data_parallel.timeout = 2 * options.collective_timeout;
  if (dist.reduce_bucket_size > 0) {
    loop.data_parallel.bucket_bytes = static_cast<size_t>(dist.reduce_bucket_size) * sizeof(float);
  }
  loop.learning_rate_at = [schedule](int64_t step) { return schedule.At(step); };
  loop.writes_data_position = lead;
  const AdamWConfig adamw = config.optimizer;
  ShardedAdamWOptions updater_options;
  updater_options.sharding.degree = static_cast<int>(config.distributed.sharding_degree);
  updater_options.sharding.stage = static_cast<int>(config.distributed.sharding_stage);
  updater_options.data_parallel = loop.data_parallel;
  updater_options.data_parallel.measure_resident_bytes = options.measure_memory;
  // Stage 3's units (refused with LoRA, whose arena is the adapters').
  if (!lora) updater_options.param_units = task->model().ParamUnits();
  updater_options.offload = config.distributed.sharding_offload;
  updater_options.offload_threads = options.cpu_threads;
  updater_options.tensor_parallel = split;
  if (precision == Precision::kFp16 && compute.backend->device().is_cuda()) {
    const config::MixPrecisionConfig& mp = config.engine.mix_precision;
    LossScalerConfig scaler;
    scaler.init_scale = mp.scale_loss;
    scaler.dynamic = mp.dynamic_loss_scaling;
    scaler.incr_every_n_steps = mp.incr_every_n_steps;
    scaler.decr_every_n_overflows = mp.decr_every_n_nan_or_inf;
    scaler.min_scale = mp.min_loss_scale;
    scaler.max_scale = std::max(scaler.max_scale, mp.scale_loss);
    updater_options.loss_scaler = scaler;
  }
  const float first_lr = schedule.At(0);
  // `hybrid` outlives the loop's updater, which reduces over its groups.
  const DataParallelGroups groups = hybrid->groups();
  GptModel* model = &task->model();
  const std::string task_name = task->name();  // the checkpoint's name: gpt or gpt_lora
  loop.make_updater = [kernels, adamw, updater_options, first_lr, groups, model, task_name](
                          ParamArena* arena,
                          Collective*) -> Result<std::unique_ptr<GradientUpdater>> {
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<ShardedAdamWUpdater> updater,
                           ShardedAdamWUpdater::Create(groups, arena, kernels, adamw, first_lr,
                                                       updater_options, task_name));
    // Stage 3: the model fetches its parameters through the updater.
    model->set_param_hooks(updater->param_hooks());
    return std::unique_ptr<GradientUpdater>(std::move(updater));
  };
  const int64_t tokens_per_sample = task->seq_len();
  // Engine.wall_clock_breakdown: the model's kernel times by kind, one line
  // per progress line (what the window's steps spent).
  std::shared_ptr<GptProfile> profile;
  if (config.engine.wall_clock_breakdown) {
    profile = std::make_shared<GptProfile>();
    model->set_profile(profile.get());
  }
  loop.progress_line = [tokens_per_sample, profile](const ProgressWindow& w) {
    std::string line = GptTrainLine(w, tokens_per_sample);
    if (profile != nullptr) {
      absl::StrAppend(&line, "\n", GptTimeLine(*profile, w));
      profile->Reset();
    }
    return line;
  };
  loop.eval_line = GptEvalLine;
  std::unique_ptr<tensorboard::EventWriter> events;
  if (!options.tensorboard_dir.empty() && rank == 0) {
    FLEET_ASSIGN_OR_RETURN(events, tensorboard::EventWriter::Create(options.tensorboard_dir));
  }
  tensorboard::ScalarTee curves({events.get(), options.figures});
  if (events != nullptr || options.figures != nullptr) {
    loop.scalars = &curves;
    loop.progress_scalars = [tokens_per_sample](const ProgressWindow& w,
                                                tensorboard::ScalarSink& s) {
      if (w.seconds <= 0) return Status::OK();
      return s.Scalar("train/tokens_per_sec", w.step,
                      static_cast<double>(w.steps * w.global_batch * tokens_per_sample) /
                          w.seconds);
    };
    loop.eval_scalars = [](const EvalWindow& w, tensorboard::ScalarSink& s) {
      return s.Scalar("eval/ppl", w.step, std::exp(w.metric));
    };
  }
  loop.after_step = options.after_step;
  Result<TrainReport> trained = RunTrainLoop(loop, *task, data_world, progress);
  // The updater (and its hooks) is gone; the loop left every parameter in
  // the arena.
  model->set_param_hooks(nullptr);
  model->set_profile(nullptr);
  FLEET_ASSIGN_OR_RETURN(TrainReport report, std::move(trained));
  if (split != nullptr) {
    // The report holds the whole model, as one process's would.
    FLEET_RETURN_IF_ERROR(GatherWholeParams(*split, model->arena().params().data(),
                                            compute.backend.get(), &report.params));
  }

  // The Test part after training: every rank evaluates all test_iters
  // batches itself (the same number everywhere, no data-parallel collective
  // needed once the loop's group is done with; a tensor-parallel group runs
  // the same batches together); rank 0's line is the one shown.
  if (config.data.test.present && config.engine.test_iters > 0) {
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<data::GptSamples> test,
                           data::OpenConfiguredSamples(config, data::DataPart::kTest));
    FLEET_ASSIGN_OR_RETURN(std::vector<float> sums,
                           task->LossSums(*test, config.engine.test_iters, 0, 1));
    report.test_metric = task->EvalMetric(sums);
    if (progress != nullptr) {
      *progress << absl::StrFormat("[test] step: %d, loss: %.6f, ppl: %.4f", report.end_step,
                                   *report.test_metric, std::exp(*report.test_metric))
                << std::endl;
    }
  }
  return report;
}

}  // namespace fleet::trainer::collective
