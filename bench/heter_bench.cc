// heter_bench: the CTR simulation through the real programs (fleetrun,
// ps_server, ps_worker, heter_worker), samples/s of training:
//   (ref) without heter workers: each CPU worker runs the whole step;
//   (a)   with --heter_workers heter workers, pipeline depth 1;
//   (b)   the same at pipeline depth 4;
// plus each CPU worker's idle fraction: the share of its training time it
// spent blocked on the dense side (HeterClient::blocked_seconds). The cases
// run interleaved, --repeats times each, in the same run.
//
// On a machine with fewer cores than processes no speed-up is expected (the
// dense side competes with the CPU workers for the same cores); what depth 4
// must show is that the round trip is hidden: a much smaller idle fraction
// than depth 1.
//
//   heter_bench [--lines=200000] [--epochs=1] [--repeats=3] [--mode=async]
//               [--workers=2] [--heter_workers=2] [--micro_batches=1] [--hidden=64,32]
//               [--config=...]
#include <gflags/gflags.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"

DEFINE_int32(lines, 200000,
             "Synthetic CTR training lines (two files); a quarter as many held out.");
DEFINE_int32(epochs, 1, "Epochs per job.");
DEFINE_int32(repeats, 3, "Jobs per case (interleaved).");
DEFINE_string(mode, "async", "Distributed.mode of every case.");
DEFINE_int32(workers, 2, "CPU workers.");
DEFINE_int32(heter_workers, 2, "Heter workers of cases (a) and (b).");
DEFINE_int32(micro_batches, 1,
             "Distributed.heter.micro_batches of cases (a) and (b). Sync mode sends a step's "
             "micro-batches at once whatever the depth: compare --micro_batches=1 and 4 there.");
DEFINE_string(
    hidden, "64,32",
    "FC widths of the tower. The default keeps the dense side about as costly as the "
    "sparse side, where hiding the round trip is what matters; configs/ctr_dnn_heter.yaml "
    "uses 400,400,400.");
DEFINE_string(bin_dir, "", "Where fleetrun and the programs are; default: this program's folder.");
DEFINE_string(config, FLEET_SOURCE_DIR "/configs/ctr_dnn_heter.yaml",
              "Job config; the cases override the data, mode, depth, tower and epochs.");

namespace fleet::bench {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Case {
  Case(std::string n, int h, int d) : name(std::move(n)), heter_workers(h), depth(d) {}
  std::string name;
  int heter_workers = 0;
  int depth = 1;
  std::vector<double> samples_per_sec, idle;
};

// One job of `c`; false (with the output printed) when it failed.
bool RunJob(const std::string& bin, const fs::path& dir, Case& c, double* auc) {
  // Dense dim of the tower: (26 * 9 + 13) * h0 + h0 + ... + h_last + 1.
  std::vector<int> hidden;
  std::stringstream hs(FLAGS_hidden);
  for (std::string w; std::getline(hs, w, ',');) hidden.push_back(std::stoi(w));
  int64_t dim = 0, in = 26 * 9 + 13;
  for (int h : hidden) dim += int64_t{in} * h + h, in = h;
  dim += in + 1;
  std::string hidden_yaml = "[";
  for (size_t i = 0; i < hidden.size(); ++i)
    hidden_yaml += (i ? ", " : "") + std::to_string(hidden[i]);
  hidden_yaml += "]";
  const fs::path logs = dir / "log";
  fs::remove_all(logs);
  const fs::path data = dir / "data";
  std::string cmd = bin + "/fleetrun --server_num=2 --worker_num=" + std::to_string(FLAGS_workers) +
                    " --heter_worker_num=" + std::to_string(c.heter_workers) +
                    " --http_port=0 --log_dir=" + logs.string() + " --config=" + FLAGS_config;
  for (const std::string& o :
       {"data.train=" + (data / "train").string(), "data.test=" + (data / "test").string(),
        "data.oracle=" + (data / "oracle.txt").string(), "Distributed.mode=" + FLAGS_mode,
        "Distributed.heter.pipeline_depth=" + std::to_string(c.depth),
        "Distributed.heter.micro_batches=" + std::to_string(FLAGS_micro_batches),
        "train.epochs=" + std::to_string(FLAGS_epochs), "'model.hidden=" + hidden_yaml + "'",
        "tables.1.dim=" + std::to_string(dim), std::string("train.log_interval=0")}) {
    cmd += " -o " + o;
  }
  const fs::path out = dir / "out.txt";
  const int rc = std::system((cmd + " > " + out.string() + " 2>&1").c_str());
  const std::string text = ReadFile(out);
  std::smatch m;
  if (rc != 0 ||
      !std::regex_search(
          text, m, std::regex(R"(summary: held-out auc ([0-9.]+).*?, ([0-9]+) train samples/s)"))) {
    std::printf("%s: job failed (%d):\n%s\n", c.name.c_str(), rc, text.c_str());
    return false;
  }
  *auc = std::stod(m[1]);
  c.samples_per_sec.push_back(std::stod(m[2]));
  for (int w = 0; w < FLAGS_workers && c.heter_workers > 0; ++w) {
    const std::string log = ReadFile(logs / ("workerlog." + std::to_string(w)));
    if (std::regex_search(log, m, std::regex(R"(waited for the heter workers ([0-9.]+)%)"))) {
      c.idle.push_back(std::stod(m[1]) / 100.0);
    }
  }
  return true;
}

int Main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  PrintEnvironment("heter_bench");
  std::string bin = FLAGS_bin_dir;
  if (bin.empty()) bin = fs::canonical("/proc/self/exe").parent_path().string();
  const fs::path dir =
      fs::temp_directory_path() / ("fleet_heter_bench_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string gen =
      bin + "/gen_ctr_data --out_dir=" + (dir / "data").string() +
      " --train_files=2 --test_files=1 --lines_per_file=" + std::to_string(FLAGS_lines / 2) +
      " > " + (dir / "gen.txt").string() + " 2>&1";
  if (std::system(gen.c_str()) != 0) {
    std::printf("gen_ctr_data failed:\n%s\n", ReadFile(dir / "gen.txt").c_str());
    return 1;
  }
  std::printf(
      "%s mode, 2 servers, %d CPU workers, tower [%s], %d lines x %d epochs, %d micro-batches a "
      "batch, %d jobs per case\n\n",
      FLAGS_mode.c_str(), FLAGS_workers, FLAGS_hidden.c_str(), FLAGS_lines, FLAGS_epochs,
      FLAGS_micro_batches, FLAGS_repeats);
  const std::string h = std::to_string(FLAGS_heter_workers);
  std::vector<Case> cases = {Case("cpu workers only (ref)", 0, 1),
                             Case(h + " heter, depth 1", FLAGS_heter_workers, 1),
                             Case(h + " heter, depth 4", FLAGS_heter_workers, 4)};
  // Verified once: every job must finish and learn (held-out AUC above chance).
  for (int r = 0; r < FLAGS_repeats; ++r) {
    for (Case& c : cases) {
      double auc = 0;
      if (!RunJob(bin, dir, c, &auc)) return 1;
      if (auc < 0.6) {
        std::printf("%s: held-out AUC %.4f: the job did not learn\n", c.name.c_str(), auc);
        return 1;
      }
    }
  }
  fs::remove_all(dir);
  const double ref = Summarize(cases[0].samples_per_sec).p50;
  std::printf("%-24s %32s %10s   %s\n", "", "train samples/s: min / p50 / max", "p50 / ref",
              "CPU-worker idle (waiting for the dense side): min / p50 / max");
  for (const Case& c : cases) {
    const Summary s = Summarize(c.samples_per_sec);
    std::printf("%-24s %10.0f / %8.0f / %8.0f %10.2f", c.name.c_str(), s.min, s.p50, s.max,
                ref > 0 ? s.p50 / ref : 0.0);
    if (!c.idle.empty()) {
      const Summary i = Summarize(c.idle);
      std::printf("   %5.1f%% / %5.1f%% / %5.1f%%", 100 * i.min, 100 * i.p50, 100 * i.max);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) { return fleet::bench::Main(argc, argv); }
