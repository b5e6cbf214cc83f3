// WorkerConfig: the sections of the job YAML that ps_worker reads (the
// servers read `Distributed`, `server` and `tables` of the same file; see
// ps/job_config.h), read by the one config reader (comm/yaml_config.h).
// Unknown keys in these sections are refused, naming the key and the file
// or -o that set it, so a typo never falls back to a default silently.
// This block is where the workers' keys are documented.
//
//   model:
//     kind: deepfm           # the model (worker/task.h lists them: WorkerTaskTypes).
//                            # Required. The CTR models (trainer/models/ctr_model.h):
//                            #   dnn (also ctr_dnn)  pooled embeddings into an MLP
//                            #   wide_deep  + a linear part over the sparse features
//                            #   deepfm     + first-order weights and FM's pairwise term
//                            #   dcn        + DCN-v2 cross layers beside the MLP
//                            # and mlp (an MLP classifier over IDX images).
//     sparse_table: 0        # CTR models: id of the sparse table holding the
//                            # embeddings; the embedding width is what a pull
//                            # returns: the table's `dim` (accessor: plain) or
//                            # ctr.embed_dim + dim (accessor: ctr, which also
//                            # gets a show and a click per key). wide_deep and
//                            # deepfm read each field's first float as its
//                            # first-order weight and deepfm the rest as its
//                            # FM embedding: with accessor ctr, embed_dim 1
//                            # (embed_w is the weight, embedx the embedding).
//                            # Default 0.
//     dense_table: 1         # id of the dense table holding every dense
//                            # parameter of the model: its `dim` must equal
//                            # the model's parameter count (the error says
//                            # the exact number). Default: the model's
//                            # (WorkerTaskType::default_dense_table): 1 for
//                            # ctr_dnn, 0 for mlp.
//     hidden: [400, 400, 400]  # CTR models: FC widths (ReLU after each).
//     cross_layers: 3        # dcn: cross layers (each a [in, in] matrix over the
//                            # whole input row), 1..16. Default 3; more learn
//                            # higher-order feature crosses at in^2 parameters
//                            # each. Other kinds ignore it.
//     sizes: [784, 128, 128, 10]  # mlp: layer widths, input first.
//                            # hidden and sizes: each width 1..65536, at most
//                            # 64 layers, at most 2^30 weights between them.
//     seed: 1                # initialisation of the dense parameters (worker 0
//                            # writes it to the dense table unless the servers
//                            # loaded a checkpoint, i.e. server.load_dir is set).
//   data:
//     train: data/ctr/train  # CTR models: file spec (files, dirs, globs; see
//                            # comm/file_io.h ExpandFileSpec). Required.
//     test: data/ctr/test    # CTR models: held-out files. Optional (no held-out metric).
//     oracle: ""             # CTR models: oracle.txt of gen_ctr_data; its AUC is
//                            # printed beside the held-out AUC. Optional.
//     field_buckets: 0       # CTR models: how categorical values become keys
//                            # (data/ctr_reader.h). 0 (default): every field
//                            # hashed into one key space, as PaddleRec does; each
//                            # distinct value gets its own row. N > 0: a table of
//                            # N + 1 rows per field (DLRM's per-field tables),
//                            # values hashed into N buckets, missing values the
//                            # last: the table's size is bounded by 26 (N + 1)
//                            # rows whatever the data. At most 2^40 - 1.
//     train_images / train_labels / test_images / test_labels: mlp IDX files
//                            # (gzip or not). train_* required, test_* optional.
//   train:
//     batch_size: 512        # samples per worker per step. Default 512, at most
//                            # 2^20. The global batch of a sync step is
//                            # batch_size * workers.
//     epochs: 1              # passes over the training data. Default 1, at most
//                            # 10^6; 0 only evaluates (e.g. a loaded checkpoint).
//     log_interval: 50       # steps between progress lines. Default 50; 0 = none.
//     blas_threads: 1        # OpenBLAS threads per worker. Default 1: on a
//                            # small machine several workers share the cores.
//                            # Keep workers x blas_threads (+ servers) <= cores
//                            # (the policy in trainer/kernels/cpu_kernels.h); a
//                            # worker alone on a machine takes every core. At
//                            # most 256.
//     save_dir: ""           # worker 0 asks the servers to save a checkpoint in
//                            # <save_dir>/epoch_<E> after epoch E when due (below)
//                            # and after the last epoch. Default empty (no saves).
//                            # Worker 0 checks at start that it can create it
//                            # and write a file in it (the servers write it: a
//                            # shared file system, or one machine).
//     save_every_epochs: 0   # also save after every N-th epoch; 0 = only the last.
//
// Relative paths are taken from the worker's working directory.
//
// A worker whose training loss turns NaN or Inf fails the job (ps_worker
// exits 1 naming the worker, epoch and step) instead of training on and
// saving a diverged model.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "comm/status.h"
#include "ps/job_config.h"

namespace fleet::worker {

// Bounds of the count and size keys above.
inline constexpr int kMaxWidth = 1 << 16;
inline constexpr size_t kMaxLayers = 64;
inline constexpr int64_t kMaxLayerWeights = int64_t{1} << 30;
inline constexpr int kMaxBatchSize = 1 << 20;
inline constexpr int kMaxEpochs = 1'000'000;
inline constexpr int kMaxBlasThreads = 256;
inline constexpr int kMaxCrossLayers = 16;

struct WorkerModelConfig {
  std::string kind;  // a WorkerTaskType::kind
  uint32_t sparse_table = 0;
  uint32_t dense_table = 1;
  std::vector<int> hidden = {400, 400, 400};
  std::vector<int> sizes = {784, 128, 128, 10};
  int cross_layers = 3;
  uint64_t seed = 1;
};

struct WorkerDataConfig {
  std::string train, test, oracle;                   // CTR models
  uint64_t field_buckets = 0;                        // CTR models
  std::string train_images, train_labels;            // mlp
  std::string test_images, test_labels;              // mlp
};

struct WorkerTrainConfig {
  int batch_size = 512;
  int epochs = 1;
  int log_interval = 50;
  int blas_threads = 1;
  std::string save_dir;
  int save_every_epochs = 0;
};

struct WorkerConfig {
  WorkerModelConfig model;
  WorkerDataConfig data;
  WorkerTrainConfig train;
};

// Reads `model`, `data` and `train` of the job document and runs the
// model's WorkerTaskType::check_config. Errors: InvalidArgument naming the
// key ("train.batch_size: must be in [1, 1048576], got 0 (from job.yaml)")
// for a missing required section, an unknown key or model.kind, a wrong
// type or a value out of range.
Result<WorkerConfig> ParseWorkerConfig(const ConfigDocument& doc);
// The same for a tree built in code (JobConfig::root): errors name keys only.
Result<WorkerConfig> ParseWorkerConfig(const YAML::Node& root);

// Everything a PS job's processes read from its job file.
struct PsJobConfig {
  ps::JobConfig job;    // what the servers read (ps::LoadJobConfig)
  WorkerConfig worker;  // what the workers and heter workers read
};

// Loads `path` with `overrides` applied in order, as every process of the job
// will, so a launcher can refuse a bad config before starting anything.
// The file may name a `_base_` (ps::LoadJobDocument).
// Errors: NotFound (a file), InvalidArgument. An error that only appears
// once an override is applied names that override first ("-o
// train.batchsize=1: train.batchsize: unknown key; train takes ..."), so the
// user is not sent to a YAML file that is fine; otherwise the error names the
// file (the one of the `_base_` chain that set the key).
Result<PsJobConfig> LoadPsJobConfig(const std::string& path,
                                    const std::vector<std::string>& overrides);

}  // namespace fleet::worker
