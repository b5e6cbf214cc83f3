// gpt_pretrain: GPT pretraining from a FleetX-style config, on one process
// or as one rank of a collective job.
//
//   build/bin/gpt_pretrain -c configs/gpt/pretrain_gpt_tiny.yaml                       # 1 CPU process
//   fleetrun --nproc_per_node=2 build/bin/gpt_pretrain -c configs/gpt/pretrain_gpt_tiny.yaml
//   fleetrun --gpus=0,1,2,3,4,5,6,7 build/bin/gpt_pretrain -c configs/gpt/pretrain_gpt_1.3B_dp8.yaml
//   build/bin/gpt_pretrain -c configs/gpt/pretrain_gpt_6.7B_sharding16.yaml -o Engine.dry_run=true
//
// -c FILE and repeatable -o Section.key=value are the config
// (collective/config/gpt_config.h documents every key); the flags below are the
// process's. Rank, world size, KV store, job id and device come from
// fleetrun's FLEET_* environment (comm/cluster.h; its flags win). With
// Engine.dry_run (or --dry_run) it prints the plan (parameters, memory per
// rank under the sharding stage and precision, FLOPs per token) and exits
// without allocating the model; the world size is then the config's.
//
// Output: the FleetX-style [train] and [eval] lines of
// collective/gpt_pretrain.h on stdout (rank 0's are what fleetrun
// shows), and a last line "gpt_pretrain: done at step S; eval loss L;
// checkpoint in DIR; per rank between steps: gradients G MiB, optimizer
// states O MiB" (what the sharding stage keeps).
//
// Exit status: 0 done; 1 training failed (the error, naming the rank and
// what failed, on stderr and in the log); 2 bad command line, config or
// environment.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace fleet::examples::gpt {

// The whole program; main() only calls this with argv[0] and the rest.
int GptPretrainMain(const std::string& program, std::vector<std::string> args, std::ostream& out,
                    std::ostream& err);

}  // namespace fleet::examples::gpt
