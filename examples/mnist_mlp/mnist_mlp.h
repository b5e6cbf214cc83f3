// The MNIST-MLP example as a library: data-parallel training of a tanh MLP
// (784-128-128-10 on MNIST; the input width comes from the data) (softmax cross-entropy, Adam) on MNIST-format IDX
// files, over any Collective (Gloo on CPUs, NCCL on GPUs) or none (one
// process). TrainMnist is the collective training loop
// (collective/train_loop.h, where sample order, checkpoints,
// resuming and the output lines are described) over the MLP classifier task
// (collective/mlp_classifier.h) with this example's defaults. The
// mnist_mlp program (mnist_app.h) is a thin layer over TrainMnist; tests
// drive TrainMnist in-process.
//
// Thread safety: TrainMnist may run on several threads at once (one per
// rank, each with its own Collective and Backend); MnistData is read-only.
#pragma once

#include <ostream>
#include <vector>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/backend.h"
#include "collective/train_loop.h"
#include "data/mnist.h"
#include "trainer/models/mlp.h"

namespace fleet::examples {

// The loop's options (epochs, batch_size, checkpoint_dir, ...) with the
// program's defaults, and the model.
struct MnistOptions : trainer::collective::TrainLoopOptions {
  // 5 epochs of batch 64 per rank with Adam at lr 1e-3 (the loop's default
  // optimizer) reach ~0.88 test accuracy on Fashion-MNIST; lr 1e-2 (the
  // PaddlePaddle example's) plateaus near 0.79.
  MnistOptions() { epochs = 5; }
  // Layer widths (input first: the image's pixel count; MlpForData makes
  // them for the data) and the seed of the parameter initialisation.
  trainer::MlpConfig model;
};

// The MLP for `data`: input width = the images' pixel count (784 for
// MNIST's 28x28, 64 for sklearn's 8x8 digits), then `hidden` (each >= 1;
// none: a linear classifier), then the 10 classes. Errors: InvalidArgument
// when the training and test images differ in size or a width is < 1.
Result<trainer::MlpConfig> MlpForData(const data::MnistData& data, const std::vector<int>& hidden);

// Per-step losses and times, the test accuracy after each epoch
// (eval_metric), the final parameters.
using MnistReport = trainer::collective::TrainReport;

// Trains as collective/train_loop.h describes. `collective` is null
// for a single process, else this rank's group (not owned); `backend` (not
// owned) is where the model lives; `progress` (may be null) receives the
// loss and accuracy lines:
//   epoch: E, step: S, train_loss: L, speed: X steps/s
//   epoch: E, test_accuracy: A
// Every rank must call it with the same options and data. Errors: those of
// MlpClassifierTask::Create (a model that does not fit the images) and of
// RunTrainLoop.
Result<MnistReport> TrainMnist(const MnistOptions& options, const data::MnistData& data,
                               Collective* collective, trainer::Backend* backend,
                               std::ostream* progress);

}  // namespace fleet::examples
