// The mnist_mlp program: flags, the process's place in the job (from
// fleetrun's environment), the device, the collective, then TrainMnist.
//
//   fleetrun --nproc_per_node=2 build/bin/mnist_mlp --epochs 5      # 2 CPU ranks, Gloo
//   fleetrun --gpus=0,1 build/bin/mnist_mlp                          # 2 GPUs, NCCL
//   build/bin/mnist_mlp --epochs 1                                   # one process, no KV store
//
// Rank, world size, KV store, job id and device come from FLEET_RANK,
// FLEET_WORLD_SIZE, FLEET_KV_ENDPOINT, FLEET_JOB_ID and FLEET_DEVICE (or the
// same-named flags of comm/cluster.h, which win). FLEET_DEVICE=cpu trains on
// the CPU layers and all-reduces with Gloo; cuda:K uses the CUDA layers and
// NCCL. A world of 1 needs no KV store. The program's own flags are listed
// by --help (see mnist_app.cc for defaults and trade-offs).
//
// Exit status: 0 done, 1 training failed (the error is logged and printed
// to stderr, naming the rank and what failed), 2 bad flags or environment.
#pragma once

namespace fleet::examples {

// The whole program; main() only calls this. Parses and consumes flags.
int MnistMain(int argc, char** argv);

}  // namespace fleet::examples
