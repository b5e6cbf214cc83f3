// gen_ctr_data: writes a synthetic Criteo-format CTR data set with known
// oracle AUC. The generator and its output layout are described in
// data/ctr_generator.h; this file only maps flags onto it.
//
//   build/bin/gen_ctr_data --out_dir=data/ctr
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cstdio>
#include <iostream>
#include <optional>

#include "comm/program_help.h"

#include "data/ctr_generator.h"

DEFINE_string(out_dir, "",
              "Directory to write train/, test/, test_prob/ and oracle.txt into "
              "(required; created when absent; old part-* files there are replaced).");
DEFINE_int32(train_files, 4, "Number of training files.");
DEFINE_int32(test_files, 1,
             "Number of held-out files (each with a .prob file of true "
             "probabilities).");
DEFINE_int64(lines_per_file, 50000,
             "Lines in every file. The defaults give 200k training "
             "lines, enough for a CTR-DNN to come close to the oracle AUC.");
DEFINE_uint64(seed, 1, "Seed of the hidden model and of every file; same seed, same bytes.");
DEFINE_int32(vocab, 100,
             "Distinct ids per categorical slot. More ids need more data: with "
             "200k training lines a logistic regression lands ~0.008 AUC below its ceiling at "
             "100 ids but ~0.03 below at 1000.");
DEFINE_double(zipf, 1.1,
              "Zipf exponent of the id distribution; 0 = uniform, larger "
              "concentrates the data on fewer ids (easier to learn).");
DEFINE_double(target_ctr, 0.25, "Mean click probability.");
DEFINE_double(weight_scale, 0.6,
              "Spread of the hidden per-id weights of slot 0; larger "
              "raises the oracle AUC.");
DEFINE_double(slot_decay, 0.9, "Weight spread of slot s is weight_scale * slot_decay^s.");
DEFINE_double(interaction_scale, 0.3, "Strength of the slot 0 x slot 1 interaction term.");
DEFINE_double(dense_weight_scale, 0.15, "Spread of the hidden weights of the dense features.");
DEFINE_double(missing_rate, 0.02, "Probability that a slot or dense value is left empty.");

int main(int argc, char** argv) {
  const fleet::ProgramHelp help{
      "gen_ctr_data --out_dir=DIR [flags]",
      "Writes synthetic Criteo-format CTR data from a hidden model, with the oracle AUC.",
      {{"Output",
        {fleet::GflagsHelpFlag("out_dir", "DIR"), fleet::GflagsHelpFlag("train_files", "N"),
         fleet::GflagsHelpFlag("test_files", "N"), fleet::GflagsHelpFlag("lines_per_file", "N"),
         fleet::GflagsHelpFlag("seed", "N")}},
       {"The hidden model",
        {fleet::GflagsHelpFlag("vocab", "N"), fleet::GflagsHelpFlag("zipf", "X"),
         fleet::GflagsHelpFlag("target_ctr", "P"), fleet::GflagsHelpFlag("weight_scale", "X"),
         fleet::GflagsHelpFlag("slot_decay", "X"), fleet::GflagsHelpFlag("interaction_scale", "X"),
         fleet::GflagsHelpFlag("dense_weight_scale", "X"),
         fleet::GflagsHelpFlag("missing_rate", "P")}}}};
  if (std::optional<int> done = fleet::ParseFlagsOrHelp(help, &argc, &argv, std::cout)) {
    return *done;
  }
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  fleet::data::CtrGeneratorOptions o;
  o.out_dir = FLAGS_out_dir;
  o.train_files = FLAGS_train_files;
  o.test_files = FLAGS_test_files;
  o.lines_per_file = FLAGS_lines_per_file;
  o.seed = FLAGS_seed;
  o.vocab = FLAGS_vocab;
  o.zipf = FLAGS_zipf;
  o.target_ctr = FLAGS_target_ctr;
  o.weight_scale = FLAGS_weight_scale;
  o.slot_decay = FLAGS_slot_decay;
  o.interaction_scale = FLAGS_interaction_scale;
  o.dense_weight_scale = FLAGS_dense_weight_scale;
  o.missing_rate = FLAGS_missing_rate;

  const auto report = fleet::data::GenerateCtrData(o);
  if (!report.ok()) {
    LOG(ERROR) << "gen_ctr_data: " << report.status().ToString();
    return report.status().IsInvalidArgument() ? fleet::kExitUsage : 1;
  }
  // The program's result, for people and scripts: one line on stdout.
  std::printf(
      "gen_ctr_data: %lld train lines, %lld test lines in %s; oracle_auc %.4f, "
      "train_ctr %.4f, test_ctr %.4f\n",
      static_cast<long long>(report->train_lines), static_cast<long long>(report->test_lines),
      o.out_dir.c_str(), report->oracle_auc, report->train_ctr, report->test_ctr);
  return 0;
}
