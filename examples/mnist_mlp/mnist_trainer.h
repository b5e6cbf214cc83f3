// The MNIST-MLP example as a library: data-parallel training of the
// 784-128-128-10 tanh MLP (softmax cross-entropy, Adam) on MNIST-format IDX
// files, over any Collective (Gloo on CPUs, NCCL on GPUs) or none (one
// process). The mnist_mlp program (mnist_app.h) is a thin layer over
// TrainMnist; tests and benchmarks drive TrainMnist in-process.
//
// Sample order. Epoch e visits the training set in one permutation drawn
// from (shuffle_seed, e), identical on every rank. Step s of the epoch uses
// the global batch order[s*G, (s+1)*G), G = batch_size * world_size, and
// rank r takes its slice order[s*G + r*B, s*G + (r+1)*B). So W ranks with
// batch B see exactly the samples (and, after the mean all-reduce, the
// gradient) of one rank with batch W*B. The last N mod G samples of each
// epoch are skipped.
//
// Data position and checkpoints. The position in the data is a function of
// the global step alone (epoch = step / steps_per_epoch, batch = step mod
// steps_per_epoch) once the data layout is fixed: number of training
// samples, global batch and shuffle seed. Rank 0 saves into checkpoint_dir
//   mlp.ckpt        params + Adam state + step (trainer/checkpoint.h)
//   data_position   the data layout and the position reached (text)
// data_position is written (atomically) first, then mlp.ckpt; a crash in
// between leaves the older checkpoint, whose step the unchanged layout still
// places exactly. On start, rank 0 loads both when mlp.ckpt exists, refuses
// a layout that differs from the run's (FailedPrecondition naming the key),
// and SyncFromRoot gives every rank the params, optimizer state and step: a
// resumed run continues with exactly the losses of an uninterrupted one.
// Only rank 0 needs to see checkpoint_dir.
//
// Thread safety: TrainMnist may run on several threads at once (one per
// rank, each with its own Collective and Backend); MnistData is read-only.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/data/idx_reader.h"
#include "trainer/data_parallel.h"

namespace fleet::examples {

// Where the Debian package fashion-mnist puts the data.
inline constexpr char kDefaultMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct MnistFiles {
  std::string train_images;
  std::string train_labels;
  std::string test_images;
  std::string test_labels;
};

// The four standard file names (train-images-idx3-ubyte.gz, ...) in `dir`.
MnistFiles MnistFilesIn(const std::string& dir);

struct MnistData {
  data::IdxDataset train;
  data::IdxDataset test;
};

// Reads the four files (plain or gzip). `max_train_samples` > 0 keeps only
// the first that many training samples (for short runs). Errors are those
// of ReadIdxDataset (NotFound, IOError, Corruption naming the file, or a
// label >= 10). TrainMnist checks the image size against the model.
Result<MnistData> LoadMnistData(const MnistFiles& files, int64_t max_train_samples = 0);

struct MnistOptions {
  // Layer widths (input first). Must start with the image size (784).
  std::vector<int> sizes = {784, 128, 128, 10};
  // Passes over the training set. The run stops earlier at max_steps.
  int epochs = 5;
  // Samples per step on each rank; the global batch is batch_size x ranks.
  int batch_size = 64;
  // Adam step size. 1e-3 reaches ~0.88 test accuracy on Fashion-MNIST in 5
  // epochs; 1e-2 (the PaddlePaddle example's) plateaus near 0.79.
  float lr = 1e-3f;
  // Seed of the parameter initialisation and of the sample order.
  uint64_t model_seed = 1;
  uint64_t shuffle_seed = 1;
  // Stop once the global step reaches this; 0 = run every epoch.
  int64_t max_steps = 0;
  // Print the loss line every this many steps (0 = never).
  int log_every_steps = 200;
  // Evaluate test accuracy after each epoch.
  bool evaluate = true;
  // Save/resume here (see the top of this file); empty = no checkpoints.
  std::string checkpoint_dir;
  // Also save every this many steps (0 = only at the end of each epoch and
  // of the run).
  int64_t checkpoint_every_steps = 0;
  trainer::DataParallelOptions data_parallel;
  // Called after every completed step with the global step reached; a
  // non-OK status ends the run with it. For tests and fault injection.
  std::function<Status(int64_t step)> after_step;
};

struct MnistReport {
  int64_t start_step = 0;  // step resumed from (0 for a fresh run)
  int64_t end_step = 0;    // step reached
  int64_t steps_per_epoch = 0;
  // This rank's loss of each step run, steps start_step+1 .. end_step.
  std::vector<float> step_losses;
  // Wall time of each of those steps (forward, backward, all-reduce,
  // update), microseconds.
  std::vector<double> step_micros;
  // Test accuracy over all ranks after each epoch completed in this run.
  std::vector<double> test_accuracy;
  // The final parameters (identical on every rank), host copy.
  std::vector<float> params;
};

// Trains as described at the top of this file. `collective` is null for a
// single process, else this rank's group (not owned); `backend` (not owned)
// is where the model lives; `progress` (may be null) receives the loss and
// accuracy lines:
//   epoch: E, step: S, train_loss: L, speed: X steps/s
//   epoch: E, test_accuracy: A
// (E counts from 0, S is the global step, L the mean loss over all ranks
// since the previous line). Every rank must call it with the same options
// and data. Returns InvalidArgument for bad options or too little data for
// one global batch, the checkpoint errors of trainer/checkpoint.h,
// FailedPrecondition for a checkpoint of another data layout, and any error
// of the data-parallel helper (naming the rank and operation).
Result<MnistReport> TrainMnist(const MnistOptions& options, const MnistData& data,
                               Collective* collective, trainer::Backend* backend,
                               std::ostream* progress);

}  // namespace fleet::examples
