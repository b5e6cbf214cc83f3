// A seed's own command line, run as it is (issue 40): DeepSpeed's Megatron
// GPT-2 10B run, `python -m torch.distributed.launch ... pretrain_gpt2.py
// --deepspeed --deepspeed_config ds.json ... --train-data data.json
// --lazy-loader`, with the launcher and program names changed to fleetrun
// and gpt_pretrain and its sizes shrunk (2 layers, hidden 64, 4 heads,
// sequence 64, batch 2, 20 iterations), on 2 CPU ranks; DeepSpeed's JSON is
// the example's ZeRO-2 + CPU offload config. Its losses equal those of the
// same model started from a FleetPS YAML under fleetrun, step for step, and
// it prints the notes and warnings for what is accepted differently.
//
// Needs GPT-2's vocabulary (the --vocab-file / --merge-file of the command;
// scripts/setup.sh fetches it), else it skips saying so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.h"
#include "tests/child_process.h"
#include "tests/data/test_util.h"

namespace fleet {
namespace {

using std::chrono::milliseconds;
using testing::BinDir;
using testing::Child;
using testing::ChildOptions;
using testing::Exit;
using testing::ReadAll;
namespace fs = std::filesystem;

// Loose JSON, one {"text": ...} document a line, each long enough (~100 GPT-2
// tokens) that the 949,50,1 split's test part (1 of 1000 documents) holds a
// sample of 65 tokens.
void WriteLooseJson(const fs::path& path) {
  const char* words[] = {"the",  "model", "trains", "on",    "many",  "ranks",   "with",
                         "data", "split", "across", "nodes", "and",   "each",    "step",
                         "loss", "falls", "slowly", "while", "large", "batches", "fit"};
  std::mt19937 rng(40);
  std::ofstream out(path);
  for (int d = 0; d < 1000; ++d) {
    out << "{\"text\": \"";
    for (int w = 0; w < 90; ++w) out << (w ? " " : "") << words[rng() % std::size(words)];
    out << ".\"}\n";
  }
}

// DeepSpeedExamples' Megatron-LM ZeRO-2 + CPU-offload config (the 10B run's),
// its batch sizes shrunk to 2 ranks x 2.
constexpr char kDeepSpeedConfig[] = R"({
  "train_batch_size": 4,
  "train_micro_batch_size_per_gpu": 2,
  "steps_per_print": 1,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 2,
    "allgather_partitions": true,
    "reduce_scatter": true,
    "allgather_bucket_size": 50000000,
    "reduce_bucket_size": 50000000,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "cpu_offload": true
  },
  "optimizer": {
    "type": "Adam",
    "params": {"lr": 0.00015, "max_grad_norm": 1.0, "betas": [0.9, 0.95]}
  },
  "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2,
           "min_loss_scale": 1},
  "activation_checkpointing": {"partition_activations": true,
                               "contiguous_memory_optimization": true,
                               "cpu_checkpointing": true},
  "wall_clock_breakdown": true,
  "zero_allow_untested_optimizer": false
}
)";

// The same job as a FleetPS YAML: what the flags and the JSON say, with
// Megatron's and DeepSpeed's defaults written out.
std::string YamlJob(const fs::path& dir) {
  const std::string data = (dir / "data.json").string();
  std::string dataset = "name: TextDataset, input_files: " + data +
                        ", text_format: jsonl, split: [949, 50, 1], max_seq_len: 64, "
                        "tokenizer: gpt2, vocab_file: " +
                        (dir / "gpt2-vocab.json").string() +
                        ", merge_file: " + (dir / "gpt2-merges.txt").string();
  // The YAML as written, its three data sections one line each.
  // clang-format off
  return R"(Global: {device: cpu, seed: 1234, micro_batch_size: 2, local_batch_size: 2}
Engine:
  max_steps: 20
  logging_freq: 1
  eval_freq: 1000
  eval_iters: 10
  test_iters: 10
  wall_clock_breakdown: True
  mix_precision: {enable: True, dtype: float16}
  save_load: {save_steps: 10000, output_dir: )" +
         (dir / "yaml_out").string() + R"(}
Model: {vocab_size: 50257, vocab_size_divisible_unit: 128, num_layers: 2, hidden_size: 64,
        num_attention_heads: 4, max_position_embeddings: 64, hidden_dropout_prob: 0.1,
        attention_probs_dropout_prob: 0.1, initializer_range: 0.02, use_recompute: True}
Data:
  Train: {dataset: {)" + dataset + R"(}}
  Eval: {dataset: {)" + dataset + R"(}}
  Test: {dataset: {)" + dataset + R"(}}
Optimizer:
  name: AdamW
  weight_decay: 0.01
  beta1: 0.9
  beta2: 0.95
  epsilon: 1.0e-8
  lr: {name: CosineAnnealingWithWarmupDecay, max_lr: 0.00015, min_lr: 0.0, decay_steps: 20,
       warmup_rate: 0.01}
  grad_clip: {clip_norm: 1.0}
Distributed:
  dp_degree: 1
  reduce_bucket_size: 50000000
  sharding: {sharding_degree: 2, sharding_stage: 2, sharding_offload: True}
)";
  // clang-format on
}

// Every "[train] ... loss: L" of a log, in order.
std::vector<std::string> Losses(const std::string& log) {
  std::vector<std::string> out;
  const std::regex re(R"(\[train\] epoch: \d+, batch: \d+, loss: ([0-9.]+),)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

Exit RunIn(const std::vector<std::string>& args, const fs::path& dir, const fs::path& log) {
  ChildOptions options{
      .env = {"PATH=/usr/bin:/bin"}, .stdout_file = log.string(), .stderr_file = log.string()};
  // The token cache goes under the job's own directory.
  const std::string cwd = dir.string();
  options.in_child = [cwd] {
    if (::chdir(cwd.c_str()) != 0) _exit(127);
  };
  Child run(args, std::move(options));
  return run.Wait(milliseconds(240000));
}

TEST(MegatronCommandTest, TheSeedsTenBillionCommandLineRunsAsItIs) {
  auto vocab = data::FindGpt2VocabDir(data::ProcessGpt2VocabSearch());
  if (!vocab.ok()) GTEST_SKIP() << "no GPT-2 vocabulary: " << vocab.status().ToString();
  const fs::path dir =
      fs::temp_directory_path() / ("megatron_command_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(*vocab + "/encoder.json", dir / "gpt2-vocab.json");
  fs::copy_file(*vocab + "/vocab.bpe", dir / "gpt2-merges.txt");
  WriteLooseJson(dir / "data.json");
  std::ofstream(dir / "ds.json") << kDeepSpeedConfig;
  std::ofstream(dir / "job.yaml") << YamlJob(dir);

  // python -m torch.distributed.launch --nproc_per_node 8 --nnodes 1 --node_rank 0
  //   --master_addr A --master_port P pretrain_gpt2.py <the seed's flags>
  // Flags grouped as the seed's script groups them.
  // clang-format off
  const std::vector<std::string> seed = {
      BinDir() + "/fleetrun", "--nproc_per_node", "2", "--nnodes", "1", "--node_rank", "0",
      "--master_addr", "127.0.0.1", "--master_port", "0", "--log_dir", (dir / "log").string(),
      BinDir() + "/gpt_pretrain",
      "--deepspeed", "--deepspeed_config", "ds.json",
      "--model-parallel-size", "1",
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
      "--batch-size", "2", "--seq-length", "64", "--max-position-embeddings", "64",
      "--train-iters", "20", "--save", (dir / "checkpoints").string(),
      "--train-data", "data.json", "--lazy-loader",
      "--vocab-file", "gpt2-vocab.json", "--merge-file", "gpt2-merges.txt",
      "--tokenizer-type", "GPT2BPETokenizer", "--split", "949,50,1",
      "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style", "cosine",
      "--weight-decay", "1e-2", "--clip-grad", "1.0", "--warmup", ".01",
      "--log-interval", "1", "--save-interval", "10000", "--eval-interval", "1000",
      "--eval-iters", "10", "--fp16", "--cpu-optimizer", "--checkpoint-activations"};
  // clang-format on
  const Exit megatron = RunIn(seed, dir, dir / "megatron.log");
  const std::string megatron_log = ReadAll(dir / "megatron.log");
  ASSERT_TRUE(megatron.exited && megatron.code == 0) << megatron_log;

  const Exit yaml = RunIn({BinDir() + "/fleetrun", "--nproc_per_node=2", "--http_port=0",
                           "--log_dir=" + (dir / "log_yaml").string(), BinDir() + "/gpt_pretrain",
                           "-c", (dir / "job.yaml").string()},
                          dir, dir / "yaml.log");
  const std::string yaml_log = ReadAll(dir / "yaml.log");
  ASSERT_TRUE(yaml.exited && yaml.code == 0) << yaml_log;

  const std::vector<std::string> got = Losses(megatron_log), want = Losses(yaml_log);
  ASSERT_EQ(got.size(), 20u) << megatron_log;
  EXPECT_EQ(got, want) << megatron_log << "\n---- the YAML job ----\n" << yaml_log;
  // What the command line and the JSON say that FleetPS does otherwise.
  for (const char* said :
       {"gpt_pretrain: --distributed-backend nccl: accepted",
        "gpt_pretrain: --lazy-loader: accepted", "gpt_pretrain: no GPU for this job",
        "gpt_pretrain: warning: DeepSpeed key 'optimizer.params.max_grad_norm'",
        "gpt_pretrain: warning: DeepSpeed key 'zero_allow_untested_optimizer'",
        "[time] ms per step: embedding "}) {
    EXPECT_NE(megatron_log.find(said), std::string::npos) << said << "\n" << megatron_log;
  }
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "gpt.ckpt"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fleet
