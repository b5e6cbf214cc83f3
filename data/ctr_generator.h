// Synthetic CTR data in the Criteo format (see ctr_reader.h) drawn from a
// hidden model, so the best achievable AUC ("oracle AUC") is known.
//
// Hidden model, all of it drawn from `seed`:
//   slot s (0..25): each of `vocab` ids has a weight ~ N(0, sigma_s^2),
//     sigma_s = weight_scale * slot_decay^s (early slots matter most, late
//     ones barely); a missing value has its own weight with the same spread.
//   interaction: each id of slot 0 and of slot 1 has a factor ~ N(0, 1);
//     when both are present the logit gains interaction_scale * u0 * u1.
//   dense j (0..12): raw count x = floor(exp(N(mu_j, 1))) with mu_j in
//     [0, 3]; its logit term is a_j * (log(1 + x) - mu_j) with
//     a_j ~ N(0, dense_weight_scale^2).
//   logit = bias + the sums above; bias is solved so the mean click
//     probability is target_ctr. Label ~ Bernoulli(sigmoid(logit)).
// Each line draws every slot's id from a Zipf law over ranks 0..vocab-1
// (P(rank k) ~ 1 / (k + 1)^zipf) and misses each slot and each dense value
// with probability missing_rate. An id is written as 8 hex digits, a per-slot
// bijective scramble of the id, like Criteo's hashed values.
//
// Output (under out_dir; every file written to a hidden temporary name and
// renamed, oracle.txt last, so its presence means the set is complete):
//   train/part-NNNNN.txt      train_files files of lines_per_file lines
//   test/part-NNNNN.txt       test_files files of lines_per_file lines
//   test_prob/part-NNNNN.prob one true click probability per line of the
//                             test file of the same number (float text)
//   oracle.txt                "key value" lines, see ReadOracleFile()
// Before writing, oracle.txt and any part-* files already in those three
// folders are removed, so a smaller re-run leaves no stale parts.
//
// Deterministic: the same options give byte-identical files. Each file
// draws from its own random stream, so test files do not depend on
// train_files, and train file i does not depend on test_files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/status.h"

namespace fleet::data {

struct CtrGeneratorOptions {
  std::string out_dir;  // required; created when absent
  int train_files = 4;
  int test_files = 1;
  int64_t lines_per_file = 50000;
  uint64_t seed = 1;
  int vocab = 100;            // ids per slot; more ids need more data to learn
  double zipf = 1.1;          // 0 = uniform; larger = fewer ids carry the data
  double target_ctr = 0.25;   // mean click probability
  double weight_scale = 0.6;  // spread of slot 0's id weights; sets the oracle AUC
  double slot_decay = 0.9;    // sigma_s = weight_scale * slot_decay^s
  double interaction_scale = 0.3;
  double dense_weight_scale = 0.15;
  double missing_rate = 0.02;  // per slot and per dense value
};

struct CtrGeneratorReport {
  double oracle_auc = 0;      // ExactAuc of the true probabilities on the test lines
  double oracle_logloss = 0;  // mean log loss of the true probabilities on the test lines
  double train_ctr = 0;       // mean label of the training lines
  double test_ctr = 0;        // mean label of the test lines
  double bias = 0;            // the solved bias of the hidden model
  int64_t train_lines = 0;
  int64_t test_lines = 0;
  std::vector<std::string> train_paths;
  std::vector<std::string> test_paths;
  std::vector<std::string> prob_paths;  // parallel to test_paths
};

// Writes the data set. InvalidArgument for an option out of range (the
// message names it), IOError when a directory or file cannot be written. On
// error oracle.txt is absent, so the set reads as incomplete.
// Blocks for roughly 1-2 s per million lines on one core.
Result<CtrGeneratorReport> GenerateCtrData(const CtrGeneratorOptions& options);

// Values of oracle.txt. NotFound when absent; Corruption (naming the file and
// line) for a line that is not "key number" or a missing oracle_auc.
struct OracleInfo {
  double oracle_auc = 0;
  double oracle_logloss = 0;
  double train_ctr = 0;
  double test_ctr = 0;
  int64_t train_lines = 0;
  int64_t test_lines = 0;
};
Result<OracleInfo> ReadOracleFile(const std::string& path);

}  // namespace fleet::data
