#include "examples/gpt/pretrain_app.h"

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/cluster.h"
#include "comm/program_help.h"
#include "comm/progress_report.h"
#include "comm/yaml_config.h"
#include "trainer/backend.h"
#include "collective/gpt_pretrain.h"
#include "collective/rank_setup.h"
#include "collective/config/gpt_config.h"
#include "collective/config/megatron_args.h"
#include "trainer/models/gpt_plan.h"
#include "data/tensorboard/event_writer.h"
#include "trainer/kernels/backend_factory.h"

DEFINE_bool(dry_run, false, "Print the plan (as Engine.dry_run) and exit without training.");
DEFINE_int32(cpu_threads, 0,
             "CPU threads of this rank's kernels; 0 = the machine's cores / ranks on this node. "
             "More than the cores this rank may use slows every step.");
DEFINE_int32(collective_timeout_ms, 60000,
             "Bound on rendezvous and each collective call (ms). A dead or stalled rank is "
             "reported after this long; raise it only for very slow steps between collectives.");

DEFINE_string(tensorboard_dir, "",
              "Rank 0 writes TensorBoard event files here. Default: <log_dir>/tb when fleetrun "
              "gives a log dir and Engine.tensorboard is true (its default); none otherwise.");

namespace fleet::examples::gpt {
namespace {

constexpr int kExitFailed = 1;

int Fail(std::ostream& err, const ClusterSpec& spec, const Status& st, int code) {
  const std::string text =
      absl::StrCat("gpt_pretrain rank ", spec.rank, " of ", spec.world_size, ": ", st.ToString());
  // Once, on `err` (under fleetrun the process's log): a glog line too
  // would print it twice.
  err << text << std::endl;
  return code;
}

ProgramHelp PretrainHelp() {
  ProgramHelp help{
      "gpt_pretrain -c CONFIG [-o Section.key=value ...] [flags]\n"
      "       gpt_pretrain --num-layers L --hidden-size H ... [--deepspeed --deepspeed_config "
      "ds.json] [flags]",
      "GPT pretraining from a FleetX-style YAML config (configs/gpt/; see "
      "examples/gpt/README.md),\n"
      "or from Megatron-LM's pretrain_gpt2.py flags and DeepSpeed's JSON "
      "(collective/config/megatron_args.h).\n"
      "Several ranks: fleetrun --nproc_per_node=N build/bin/gpt_pretrain -c CONFIG ...",
      {{"Config",
        {{"-c", "FILE", "the job's YAML config (configs/gpt/*.yaml; _base_ files are merged in)",
          ""},
         {"-o", "Section.key=value",
          "override one key of the config (repeatable), e.g. -o Engine.max_steps=20", ""},
         GflagsHelpFlag("dry_run")}},
       {"Performance and progress",
        {GflagsHelpFlag("cpu_threads", "N"), GflagsHelpFlag("collective_timeout_ms", "MS"),
         GflagsHelpFlag("progress_every_s", "S")}},
       trainer::collective::RankSetupHelpGroup()}};
  for (HelpGroup& g : ClusterHelpGroups()) help.groups.push_back(std::move(g));
  return help;
}

}  // namespace

int GptPretrainMain(const std::string& program, std::vector<std::string> args, std::ostream& out,
                    std::ostream& err) {
  ClusterSpec spec;
  // Megatron's flags (a seed's script) instead of -c FILE: the program's own
  // flags are what is left of them.
  const bool megatron = trainer::config::IsMegatronCommandLine(args);
  Result<std::vector<std::string>> own = std::vector<std::string>(args);
  if (megatron) own = trainer::config::NonMegatronArgs(args);
  if (!own.ok()) return Fail(err, spec, own.status(), kExitUsage);
  Result<ConfigArgs> config_args = ParseConfigArgs(*own);
  if (!config_args.ok()) return Fail(err, spec, config_args.status(), kExitUsage);
  if (megatron && (!config_args->config.empty() || !config_args->overrides.empty())) {
    return Fail(err, spec,
                Status::InvalidArgument("Megatron's flags describe the whole job: give them or "
                                        "-c FILE [-o ...], not both"),
                kExitUsage);
  }
  // gflags takes what is not -c / -o.
  std::vector<char*> argv = {const_cast<char*>(program.c_str())};
  for (std::string& a : config_args->rest) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  char** argv_ptr = argv.data();
  if (std::optional<int> done = ParseFlagsOrHelp(PretrainHelp(), &argc, &argv_ptr, out)) {
    return *done;
  }
  if (argc > 1) {
    return Fail(err, spec, Status::InvalidArgument("unexpected argument", argv_ptr[1]), kExitUsage);
  }
  google::InitGoogleLogging(program.c_str());
  FLAGS_logtostderr = true;
  if (config_args->config.empty() && !megatron) {
    return Fail(err, spec, Status::InvalidArgument("no config: give -c FILE (or Megatron's flags)"),
                kExitUsage);
  }

  Result<std::unique_ptr<ProcessContext>> context =
      trainer::collective::CollectiveRankContext("gpt_pretrain");
  if (!context.ok()) return Fail(err, spec, context.status(), kExitUsage);
  spec = (*context)->spec();
  const EnvLookup& env = (*context)->env();
  if (FLAGS_dry_run) config_args->overrides.push_back("Engine.dry_run=true");

  Result<trainer::config::GptJobConfig> config = Status::Internal("unset");
  if (megatron) {
    // Megatron's layout comes from the job: its ranks and devices.
    const std::optional<std::string> assigned = (*context)->assigned_device();
    trainer::config::MegatronTarget target;
    target.world_size = spec.world_size;
    target.gpu = assigned ? assigned->starts_with("cuda") : trainer::CudaDeviceCount() > 0;
    Result<trainer::config::MegatronCommand> command =
        trainer::config::ParseMegatronCommandLine(args, target);
    if (!command.ok()) return Fail(err, spec, command.status(), kExitUsage);
    if (spec.rank == 0) {
      for (const std::string& note : command->notes) out << "gpt_pretrain: " << note << std::endl;
    }
    config = std::move(command->config);
    if (FLAGS_dry_run) config->engine.dry_run = true;
  } else {
    // A dry run sizes the config as written (e.g. 6.7B on 16 ranks) on
    // whatever machine it runs; training takes the job's world.
    Result<trainer::config::GptJobConfig> dry = trainer::config::LoadGptJobConfig(
        config_args->config, config_args->overrides, /*world_size=*/0);
    if (!dry.ok()) return Fail(err, spec, dry.status(), kExitUsage);
    config = dry->engine.dry_run
                 ? std::move(dry)
                 : trainer::config::LoadGptJobConfig(config_args->config, config_args->overrides,
                                                     spec.world_size);
  }
  if (!config.ok()) return Fail(err, spec, config.status(), kExitUsage);
  if (config->engine.dry_run) {
    Result<trainer::GptPlan> plan = trainer::collective::PlanGptJob(*config, env);
    if (!plan.ok()) return Fail(err, spec, plan.status(), kExitUsage);
    if (spec.rank == 0) out << plan->ToString() << std::endl;
    return 0;
  }
  if (spec.rank == 0) {
    for (const std::string& note : config->notes) out << "gpt_pretrain: " << note << std::endl;
  }

  // The rank's device: fleetrun's (or --device's) GPU, or cuda:0 for a
  // single process started by hand (ResolveRankDevice says which and why).
  Result<std::string> device_text = trainer::collective::ResolveRankDevice(
      config->global.device != trainer::config::Device::kCpu, (*context)->assigned_device(),
      spec.world_size, trainer::CudaDeviceCount());
  if (!device_text.ok()) return Fail(err, spec, device_text.status(), kExitUsage);
  Result<trainer::Device> device = trainer::ParseDevice(*device_text);
  if (!device.ok()) return Fail(err, spec, device.status(), kExitUsage);
  Result<int> threads = trainer::collective::CpuThreadsPerRank(env, FLAGS_cpu_threads);
  if (!threads.ok()) return Fail(err, spec, threads.status(), kExitUsage);
  if (FLAGS_collective_timeout_ms <= 0) {
    return Fail(err, spec, Status::InvalidArgument("--collective_timeout_ms must be > 0"),
                kExitUsage);
  }
  LOG(INFO) << "gpt_pretrain " << spec.ToString() << ", device " << device->ToString() << ", "
            << *threads << " CPU thread(s)";

  Result<trainer::collective::RankGroupOptions> group_options =
      trainer::collective::RankGroupOptionsFromFlags(env);
  if (!group_options.ok()) return Fail(err, spec, group_options.status(), kExitUsage);
  trainer::collective::RankGroupOptions& group = *group_options;
  group.group = "gpt_pretrain";
  group.timeout = std::chrono::milliseconds(FLAGS_collective_timeout_ms);
  Result<std::unique_ptr<Collective>> collective =
      trainer::collective::CreateRankCollective(spec, *device, group);
  if (!collective.ok()) return Fail(err, spec, collective.status(), kExitFailed);

  trainer::collective::GptPretrainOptions options;
  options.gpu_device = device->ToString();
  options.cpu_threads = *threads;
  options.collective_timeout = group.timeout;
  options.join_group = trainer::collective::RankGroupFactory(spec, *device, group);
  options.tensorboard_dir = tensorboard::TensorBoardDir(FLAGS_tensorboard_dir, spec.log_dir,
                                                        config->engine.tensorboard);
  // Every rank says how far it is and when it will be done (FleetX runs by
  // steps: Engine.max_steps is the job).
  const int64_t max_steps = config->engine.max_steps;
  ProgressReporterOptions progress_options =
      ProgressOptionsFor(spec, absl::StrCat("gpt_pretrain rank ", spec.rank), max_steps, max_steps,
                         config->global.local_batch_size);
  if (max_steps <= 0) progress_options.interval = std::chrono::milliseconds(0);
  ProgressReporter progress(std::move(progress_options));
  options.after_step = [&progress](int64_t step) {
    progress.Step(step);
    return Status::OK();
  };
  // Rank 0's curves (loss, tokens/s, eval loss) as figures of its progress
  // reports, for fleetrun's job page and metrics.
  tensorboard::ScalarFunction figures(
      [&progress](std::string_view tag, int64_t, double value) { progress.Figure(tag, value); });
  options.figures = &figures;
  Result<trainer::collective::TrainReport> report = trainer::collective::RunGptPretrain(
      *config, collective->get(), options, spec.rank == 0 ? &out : nullptr);
  if (!report.ok()) return Fail(err, spec, report.status(), kExitFailed);
  progress.Finish(report->end_step);
  if (spec.rank == 0) {
    constexpr double kMiB = 1024.0 * 1024.0;
    out << absl::StrFormat(
               "gpt_pretrain: done at step %d; eval loss %s; checkpoint in %s; per rank between "
               "steps: gradients %.1f MiB, optimizer states %.1f MiB",
               report->end_step,
               report->eval_metric.empty() ? std::string("not measured")
                                           : absl::StrFormat("%.4f", report->eval_metric.back()),
               config->engine.save_load.output_dir, report->memory.gradient_bytes / kMiB,
               report->memory.optimizer_bytes / kMiB)
        << std::endl;
  }
  return 0;
}

}  // namespace fleet::examples::gpt
