#include "examples/mnist_mlp/mnist_app.h"

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/cluster.h"
#include "comm/program_help.h"
#include "comm/progress_report.h"
#include "examples/mnist_mlp/mnist_mlp.h"
#include "collective/rank_setup.h"
#include "data/tensorboard/event_writer.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/kernels/backend_factory.h"

DEFINE_int32(epochs, 5, "Passes over the training set.");
DEFINE_string(hidden, "128,128",
              "Hidden layer widths, comma-separated (empty: none, a linear classifier). The "
              "input width is the images' pixel count (784 for 28x28, 64 for 8x8), the output "
              "the 10 classes.");
DEFINE_int32(batch_size, 64,
             "Samples per step on each rank (global batch = batch_size x ranks). Larger batches "
             "run more samples/s but need more epochs or a larger --lr for the same accuracy.");
DEFINE_double(lr, 0.001,
              "Adam learning rate. 0.001 reaches ~0.88 test accuracy in 5 epochs; 0.01 "
              "plateaus near 0.79.");
DEFINE_string(data_dir, fleet::data::kDefaultMnistDir,
              "Folder with train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
              "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (Fashion-MNIST from the "
              "Debian package by default; any MNIST-format IDX files work).");
DEFINE_string(train_images, "", "IDX image file for training (plain or .gz); overrides --data_dir.");
DEFINE_string(train_labels, "", "IDX label file for training; overrides --data_dir.");
DEFINE_string(test_images, "", "IDX image file for testing; overrides --data_dir.");
DEFINE_string(test_labels, "", "IDX label file for testing; overrides --data_dir.");
DEFINE_int64(max_train_samples, 0, "Train on the first N samples only (0 = all); for quick runs.");
DEFINE_string(checkpoint_dir, "",
              "Save to and resume from this folder (rank 0 reads and writes it). Empty = no "
              "checkpoints. A run started on a folder holding a checkpoint continues from it.");
DEFINE_int64(checkpoint_every_steps, 0,
             "Also save every N steps (0 = only at the end of each epoch and of the run).");
DEFINE_int64(max_steps, 0, "Stop at this global step (0 = run every epoch).");
DEFINE_int32(log_every_steps, 200, "Print the loss line every N steps (0 = never).");
DEFINE_uint64(seed, 1, "Seed of the parameter initialisation.");
DEFINE_uint64(shuffle_seed, 1, "Seed of the per-epoch sample order (same on every rank).");
DEFINE_int32(bucket_kb, 1024,
             "Gradient bucket size in KiB: smaller starts the all-reduce earlier in backward but "
             "makes more calls. The default makes this MLP one bucket, measured fastest on "
             "2 cores (see collective/data_parallel.h); try 64 for two buckets with overlap.");
DEFINE_int32(collective_timeout_ms, 30000,
             "Bounds the rendezvous and every collective operation: a dead or stalled rank makes "
             "the others fail after at most this long.");
DEFINE_int32(blas_threads, 0,
             "OpenBLAS threads per process. 0 = cores / FLEET_NPROC_PER_NODE (at least 1), so "
             "ranks sharing a machine do not oversubscribe it.");
DEFINE_int64(debug_crash_at_step, -1,
             "Testing only: the rank given by --debug_crash_rank kills itself (SIGKILL) after "
             "this step, to show how the other ranks and fleetrun react. -1 = never.");
DEFINE_int32(debug_crash_rank, 0, "Testing only: see --debug_crash_at_step.");
DEFINE_string(tensorboard_dir, "",
              "Rank 0 writes TensorBoard event files here (loss, learning rate, samples/s, test "
              "accuracy). Default: <log_dir>/tb when fleetrun gives a log dir; none otherwise.");

namespace fleet::examples {
namespace {

// Exit codes (see mnist_app.h).
constexpr int kExitFailed = 1;

Result<MnistOptions> OptionsFromFlags() {
  if (FLAGS_bucket_kb <= 0) return Status::InvalidArgument("--bucket_kb must be > 0");
  if (FLAGS_collective_timeout_ms <= 0) {
    return Status::InvalidArgument("--collective_timeout_ms must be > 0");
  }
  if (!(FLAGS_lr > 0)) return Status::InvalidArgument("--lr must be > 0", absl::StrCat(FLAGS_lr));
  MnistOptions o;
  o.epochs = FLAGS_epochs;
  o.batch_size = FLAGS_batch_size;
  o.optimizer.lr = static_cast<float>(FLAGS_lr);
  o.model.seed = FLAGS_seed;
  o.shuffle_seed = FLAGS_shuffle_seed;
  o.max_steps = FLAGS_max_steps;
  o.log_every_steps = FLAGS_log_every_steps;
  o.checkpoint_dir = FLAGS_checkpoint_dir;
  o.checkpoint_every_steps = FLAGS_checkpoint_every_steps;
  o.data_parallel.bucket_bytes = static_cast<size_t>(FLAGS_bucket_kb) << 10;
  // The helper's own wait outlasts the collective's, which reports first.
  o.data_parallel.timeout = std::chrono::milliseconds(2 * int64_t{FLAGS_collective_timeout_ms});
  return o;
}

Result<std::vector<int>> HiddenFromFlag() {
  std::vector<int> widths;
  for (const std::string& part :
       std::vector<std::string>(absl::StrSplit(FLAGS_hidden, ',', absl::SkipWhitespace()))) {
    int width = 0;
    if (!absl::SimpleAtoi(part, &width) || width < 1) {
      return Status::InvalidArgument("--hidden: widths must be integers >= 1, comma-separated",
                                     FLAGS_hidden);
    }
    widths.push_back(width);
  }
  return widths;
}

data::MnistFiles FilesFromFlags() {
  data::MnistFiles files = data::MnistFilesIn(FLAGS_data_dir);
  if (!FLAGS_train_images.empty()) files.train_images = FLAGS_train_images;
  if (!FLAGS_train_labels.empty()) files.train_labels = FLAGS_train_labels;
  if (!FLAGS_test_images.empty()) files.test_images = FLAGS_test_images;
  if (!FLAGS_test_labels.empty()) files.test_labels = FLAGS_test_labels;
  return files;
}

// Once, on stderr (under fleetrun the process's log): a glog line too
// would print it twice. `where` is "mnist_mlp" before the process knows its
// rank, "mnist_mlp rank R of N" after.
int Fail(const std::string& where, const Status& st, int code) {
  std::cerr << where << ": " << st.ToString() << std::endl;
  return code;
}
int Fail(const ClusterSpec& spec, const Status& st, int code) {
  return Fail(absl::StrCat("mnist_mlp rank ", spec.rank, " of ", spec.world_size), st, code);
}

ProgramHelp MnistHelp() {
  ProgramHelp help{
      "mnist_mlp [flags]",
      "Data-parallel MLP classifier on MNIST-format IDX files (see examples/mnist_mlp/README.md).\n"
      "Several ranks: fleetrun --nproc_per_node=N build/bin/mnist_mlp [flags]",
      {{"Data",
        {GflagsHelpFlag("data_dir", "DIR"), GflagsHelpFlag("train_images", "FILE"),
         GflagsHelpFlag("train_labels", "FILE"), GflagsHelpFlag("test_images", "FILE"),
         GflagsHelpFlag("test_labels", "FILE"), GflagsHelpFlag("max_train_samples", "N")}},
       {"Model and training",
        {GflagsHelpFlag("hidden", "W,W,..."), GflagsHelpFlag("epochs", "N"), GflagsHelpFlag("batch_size", "N"), GflagsHelpFlag("lr", "LR"),
         GflagsHelpFlag("max_steps", "N"), GflagsHelpFlag("seed", "N"),
         GflagsHelpFlag("shuffle_seed", "N")}},
       {"Checkpoints and output",
        {GflagsHelpFlag("checkpoint_dir", "DIR"), GflagsHelpFlag("checkpoint_every_steps", "N"),
         GflagsHelpFlag("log_every_steps", "N"), GflagsHelpFlag("progress_every_s", "S")}},
       {"Performance",
        {GflagsHelpFlag("bucket_kb", "KIB"), GflagsHelpFlag("blas_threads", "N"),
         GflagsHelpFlag("collective_timeout_ms", "MS")}},
       trainer::collective::RankSetupHelpGroup(),
       {"Testing", {GflagsHelpFlag("debug_crash_at_step", "STEP"), GflagsHelpFlag("debug_crash_rank", "RANK")}}}};
  for (HelpGroup& g : ClusterHelpGroups()) help.groups.push_back(std::move(g));
  return help;
}

}  // namespace

int MnistMain(int argc, char** argv) {
  if (std::optional<int> done = ParseFlagsOrHelp(MnistHelp(), &argc, &argv, std::cout)) {
    return *done;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  Result<std::unique_ptr<ProcessContext>> context =
      trainer::collective::CollectiveRankContext("mnist_mlp");
  if (!context.ok()) return Fail("mnist_mlp", context.status(), kExitUsage);
  const ClusterSpec& spec = (*context)->spec();
  const EnvLookup& env = (*context)->env();
  Result<trainer::Device> device = trainer::ParseDevice((*context)->device());
  if (!device.ok()) return Fail(spec, device.status(), kExitUsage);
  Result<MnistOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(spec, options.status(), kExitUsage);
  if (FLAGS_debug_crash_at_step >= 0) {
    const int64_t crash_step = FLAGS_debug_crash_at_step;
    const bool me = spec.rank == FLAGS_debug_crash_rank;
    options->after_step = [crash_step, me](int64_t step) {
      if (me && step == crash_step) {
        LOG(ERROR) << "--debug_crash_at_step: killing this rank after step " << step;
        // A deliberate hard crash (no unwinding, no goodbye to peers), as a
        // segfault or OOM kill would be.
        std::raise(SIGKILL);
      }
      return Status::OK();
    };
  }

  if (device->is_cpu()) {
    Result<int> blas_threads = trainer::collective::CpuThreadsPerRank(env, FLAGS_blas_threads);
    if (!blas_threads.ok()) return Fail(spec, blas_threads.status(), kExitUsage);
    trainer::kernels::SetBlasThreads(*blas_threads);
  }
  LOG(INFO) << "mnist_mlp " << spec.ToString();

  Result<data::MnistData> data = data::LoadMnistData(FilesFromFlags(), FLAGS_max_train_samples);
  if (!data.ok()) return Fail(spec, data.status(), kExitUsage);
  Result<std::vector<int>> hidden = HiddenFromFlag();
  if (!hidden.ok()) return Fail(spec, hidden.status(), kExitUsage);
  Result<trainer::MlpConfig> model = MlpForData(*data, *hidden);
  if (!model.ok()) return Fail(spec, model.status(), kExitUsage);
  options->model.sizes = model->sizes;
  Result<std::unique_ptr<trainer::Backend>> backend = trainer::CreateBackend(*device, nullptr);
  if (!backend.ok()) return Fail(spec, backend.status(), kExitFailed);
  Result<trainer::collective::RankGroupOptions> group_options =
      trainer::collective::RankGroupOptionsFromFlags(env);
  if (!group_options.ok()) return Fail(spec, group_options.status(), kExitUsage);
  trainer::collective::RankGroupOptions& group = *group_options;
  group.group = "mnist_mlp";
  group.timeout = std::chrono::milliseconds(FLAGS_collective_timeout_ms);
  Result<std::unique_ptr<Collective>> collective =
      trainer::collective::CreateRankCollective(spec, *device, group);
  if (!collective.ok()) return Fail(spec, collective.status(), kExitFailed);

  // Every rank says how far it is and when it will be done.
  const int64_t global_batch = int64_t{options->batch_size} * spec.world_size;
  const int64_t steps_per_epoch = data->train.images.count / std::max<int64_t>(global_batch, 1);
  int64_t total_steps = steps_per_epoch * options->epochs;
  if (options->max_steps > 0) total_steps = std::min(total_steps, options->max_steps);
  ProgressReporter progress(ProgressOptionsFor(spec, absl::StrCat("mnist_mlp rank ", spec.rank),
                                               total_steps, steps_per_epoch, options->batch_size));
  options->after_step = [&progress, crash = std::move(options->after_step)](int64_t step) {
    progress.Step(step);
    return crash ? crash(step) : Status::OK();
  };
  std::unique_ptr<tensorboard::EventWriter> events;
  const std::string tb_dir = tensorboard::TensorBoardDir(FLAGS_tensorboard_dir, spec.log_dir, true);
  if (!tb_dir.empty() && spec.rank == 0) {
    Result<std::unique_ptr<tensorboard::EventWriter>> created =
        tensorboard::EventWriter::Create(tb_dir);
    if (!created.ok()) return Fail(spec, created.status(), kExitFailed);
    events = std::move(created).value();
  }
  // Rank 0's curves (loss, accuracy, samples/s) go to TensorBoard and, as
  // figures of its progress reports, to fleetrun's job page and metrics.
  tensorboard::ScalarFunction figures(
      [&progress](std::string_view tag, int64_t, double value) { progress.Figure(tag, value); });
  tensorboard::ScalarTee curves({events.get(), &figures});
  options->scalars = &curves;
  Result<MnistReport> report =
      TrainMnist(*options, *data, collective->get(), backend->get(), &std::cout);
  if (report.ok()) progress.Finish(report->end_step);
  // The loop's InvalidArguments are about what was given (too few samples for
  // one global batch, a checkpoint of another layout): exit 2, like bad data.
  if (!report.ok()) {
    return Fail(spec, report.status(),
                report.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailed);
  }
  return 0;
}

}  // namespace fleet::examples
