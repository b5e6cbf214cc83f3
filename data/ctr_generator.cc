#include "data/ctr_generator.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <numbers>

#include "comm/splitmix.h"
#include "data/ctr_reader.h"
#include "comm/file_io.h"
#include "data/metrics.h"

namespace fleet::data {
namespace {

namespace fs = std::filesystem;

// Lines drawn to solve for the bias; enough to put the mean CTR within
// ~0.003 of the target.
constexpr int kCalibrationLines = 20000;
constexpr size_t kFlushBytes = size_t{1} << 20;

// Random stream ids: one for the model, one for calibration, one per file.
constexpr uint64_t kModelStream = 0;
constexpr uint64_t kCalibrationStream = 1;
constexpr uint64_t kTrainStreamBase = uint64_t{1} << 32;
constexpr uint64_t kTestStreamBase = uint64_t{2} << 32;


// MurmurHash3's 32-bit finaliser: a bijection on uint32.
uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  h ^= h >> 16;
  return h;
}

// One independent stream of the generator per (seed, stream) pair.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream)
      : bits_(Mix64(seed) ^ Mix64(stream + 0x632BE59BD9B4E019ULL)) {}
  uint64_t Next() { return bits_.Next(); }
  double Uniform() { return bits_.UniformDouble(); }  // [0, 1)
  double Normal() {                     // Box-Muller, one value per call
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  SplitMix64 bits_;
};

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct HiddenModel {
  std::array<std::vector<double>, kCriteoSlots> weights;  // [slot][id]
  std::array<double, kCriteoSlots> missing_weight{};
  std::array<uint32_t, kCriteoSlots> hex_salt{};
  std::vector<double> factor0, factor1;  // interaction factors of slots 0 and 1, [id]
  std::array<double, kCriteoDense> dense_mu{};
  std::array<double, kCriteoDense> dense_weight{};
  std::vector<double> zipf_cdf;  // [vocab], last element 1
  double bias = 0;
};

// One drawn line before formatting.
struct Draw {
  std::array<int, kCriteoSlots> ids{};        // -1 = missing
  std::array<int64_t, kCriteoDense> dense{};  // -1 = missing
  double logit_without_bias = 0;
};

HiddenModel BuildModel(const CtrGeneratorOptions& o) {
  Rng rng(o.seed, kModelStream);
  HiddenModel m;
  for (int s = 0; s < kCriteoSlots; ++s) {
    const double sigma = o.weight_scale * std::pow(o.slot_decay, s);
    m.weights[s].resize(o.vocab);
    for (double& w : m.weights[s]) w = sigma * rng.Normal();
    m.missing_weight[s] = sigma * rng.Normal();
    m.hex_salt[s] = static_cast<uint32_t>(rng.Next());
  }
  m.factor0.resize(o.vocab);
  m.factor1.resize(o.vocab);
  for (double& f : m.factor0) f = rng.Normal();
  for (double& f : m.factor1) f = rng.Normal();
  for (int j = 0; j < kCriteoDense; ++j) {
    m.dense_mu[j] = 3.0 * rng.Uniform();
    m.dense_weight[j] = o.dense_weight_scale * rng.Normal();
  }
  m.zipf_cdf.resize(o.vocab);
  double total = 0;
  for (int k = 0; k < o.vocab; ++k) {
    total += std::pow(k + 1.0, -o.zipf);
    m.zipf_cdf[k] = total;
  }
  for (double& c : m.zipf_cdf) c /= total;
  m.zipf_cdf.back() = 1.0;
  return m;
}

void DrawLine(const CtrGeneratorOptions& o, const HiddenModel& m, Rng& rng, Draw* d) {
  double logit = 0;
  for (int s = 0; s < kCriteoSlots; ++s) {
    if (rng.Uniform() < o.missing_rate) {
      d->ids[s] = -1;
      logit += m.missing_weight[s];
      continue;
    }
    const double u = rng.Uniform();
    const int id = static_cast<int>(std::upper_bound(m.zipf_cdf.begin(), m.zipf_cdf.end() - 1, u) -
                                    m.zipf_cdf.begin());
    d->ids[s] = id;
    logit += m.weights[s][id];
  }
  if (d->ids[0] >= 0 && d->ids[1] >= 0) {
    logit += o.interaction_scale * m.factor0[d->ids[0]] * m.factor1[d->ids[1]];
  }
  for (int j = 0; j < kCriteoDense; ++j) {
    const double g = rng.Normal();  // drawn even when missing, keeping streams aligned
    if (rng.Uniform() < o.missing_rate) {
      d->dense[j] = -1;
      continue;
    }
    const int64_t x = static_cast<int64_t>(std::floor(std::exp(m.dense_mu[j] + g)));
    d->dense[j] = x;
    logit += m.dense_weight[j] * (std::log1p(static_cast<double>(x)) - m.dense_mu[j]);
  }
  d->logit_without_bias = logit;
}

void AppendLine(const HiddenModel& m, const Draw& d, int label, std::string* out) {
  char buf[32];
  out->push_back(label ? '1' : '0');
  for (int j = 0; j < kCriteoDense; ++j) {
    out->push_back('\t');
    if (d.dense[j] >= 0) out->append(buf, std::to_chars(buf, buf + sizeof(buf), d.dense[j]).ptr);
  }
  for (int s = 0; s < kCriteoSlots; ++s) {
    out->push_back('\t');
    if (d.ids[s] < 0) continue;
    const uint32_t hex = Fmix32(static_cast<uint32_t>(d.ids[s]) ^ m.hex_salt[s]);
    std::snprintf(buf, sizeof(buf), "%08x", hex);
    out->append(buf, 8);
  }
  out->push_back('\n');
}

// Solves mean(sigmoid(bias + z)) == target over calibration draws by
// bisection (the mean is increasing in bias).
double SolveBias(const CtrGeneratorOptions& o, const HiddenModel& m) {
  Rng rng(o.seed, kCalibrationStream);
  std::vector<double> z(kCalibrationLines);
  Draw d;
  for (double& v : z) {
    DrawLine(o, m, rng, &d);
    v = d.logit_without_bias;
  }
  double lo = -30, hi = 30;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    double mean = 0;
    for (double v : z) mean += Sigmoid(mid + v);
    mean /= z.size();
    (mean < o.target_ctr ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::string PartName(int index, const char* ext) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "part-%05d.%s", index, ext);
  return buf;
}

// Writes one data file (and, when prob_path is non-empty, its parallel file
// of true probabilities). Appends each line's probability and label to
// *probs / *labels when they are non-null.
Status WriteDataFile(const CtrGeneratorOptions& o, const HiddenModel& m, uint64_t stream,
                     const std::string& path, const std::string& prob_path,
                     std::vector<float>* probs, std::vector<float>* labels, double* clicks) {
  Rng rng(o.seed, stream);
  FLEET_ASSIGN_OR_RETURN(auto data, AtomicFileWriter::Create(path));
  std::unique_ptr<AtomicFileWriter> prob_file;
  if (!prob_path.empty()) {
    FLEET_ASSIGN_OR_RETURN(prob_file, AtomicFileWriter::Create(prob_path));
  }
  std::string text, prob_text;
  Draw d;
  char buf[32];
  for (int64_t i = 0; i < o.lines_per_file; ++i) {
    DrawLine(o, m, rng, &d);
    const float p = static_cast<float>(Sigmoid(m.bias + d.logit_without_bias));
    const int label = rng.Uniform() < p ? 1 : 0;
    *clicks += label;
    AppendLine(m, d, label, &text);
    if (prob_file != nullptr) {
      prob_text.append(buf, std::to_chars(buf, buf + sizeof(buf), p).ptr);
      prob_text.push_back('\n');
    }
    if (probs != nullptr) probs->push_back(p);
    if (labels != nullptr) labels->push_back(static_cast<float>(label));
    if (text.size() >= kFlushBytes || i + 1 == o.lines_per_file) {
      FLEET_RETURN_IF_ERROR(data->Append(text));
      text.clear();
      if (prob_file != nullptr) {
        FLEET_RETURN_IF_ERROR(prob_file->Append(prob_text));
        prob_text.clear();
      }
    }
  }
  FLEET_RETURN_IF_ERROR(data->Commit());
  if (prob_file != nullptr) FLEET_RETURN_IF_ERROR(prob_file->Commit());
  return Status::OK();
}

Status CheckOptions(const CtrGeneratorOptions& o) {
  auto bad = [](const std::string& what) { return Status::InvalidArgument(what); };
  if (o.out_dir.empty()) return bad("out_dir is required");
  if (o.train_files < 1) return bad("train_files must be >= 1");
  if (o.test_files < 1) return bad("test_files must be >= 1 (the oracle AUC needs test lines)");
  if (o.lines_per_file < 1) return bad("lines_per_file must be >= 1");
  if (o.vocab < 1 || o.vocab > (1 << 28)) return bad("vocab must be in [1, 2^28]");
  if (!(o.zipf >= 0 && o.zipf <= 10)) return bad("zipf must be in [0, 10]");
  if (!(o.target_ctr > 0 && o.target_ctr < 1)) return bad("target_ctr must be in (0, 1)");
  if (!(o.weight_scale >= 0 && o.weight_scale <= 100))
    return bad("weight_scale must be in [0, 100]");
  if (!(o.slot_decay >= 0 && o.slot_decay <= 1)) return bad("slot_decay must be in [0, 1]");
  if (!(o.interaction_scale >= 0 && o.interaction_scale <= 100)) {
    return bad("interaction_scale must be in [0, 100]");
  }
  if (!(o.dense_weight_scale >= 0 && o.dense_weight_scale <= 100)) {
    return bad("dense_weight_scale must be in [0, 100]");
  }
  if (!(o.missing_rate >= 0 && o.missing_rate < 1)) return bad("missing_rate must be in [0, 1)");
  return Status::OK();
}

// Removes oracle.txt and our part-* files so a re-run leaves nothing stale.
Status ClearOldOutput(const fs::path& root, const std::array<fs::path, 3>& dirs) {
  std::error_code ec;
  fs::remove(root / "oracle.txt", ec);
  if (ec)
    return Status::IOError("cannot remove (" + ec.message() + ")", (root / "oracle.txt").string());
  for (const fs::path& dir : dirs) {
    fs::create_directories(dir, ec);
    if (ec) return Status::IOError("cannot create directory (" + ec.message() + ")", dir.string());
    for (const auto& de : fs::directory_iterator(dir, ec)) {
      if (de.is_regular_file() && de.path().filename().string().starts_with("part-")) {
        fs::remove(de.path(), ec);
        if (ec) return Status::IOError("cannot remove (" + ec.message() + ")", de.path().string());
      }
    }
    if (ec) return Status::IOError("cannot list directory (" + ec.message() + ")", dir.string());
  }
  return Status::OK();
}

std::string FormatNumber(double v) {
  char buf[64];
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

}  // namespace

Result<CtrGeneratorReport> GenerateCtrData(const CtrGeneratorOptions& o) {
  FLEET_RETURN_IF_ERROR(CheckOptions(o));
  const fs::path root(o.out_dir);
  const std::array<fs::path, 3> dirs = {root / "train", root / "test", root / "test_prob"};
  FLEET_RETURN_IF_ERROR(ClearOldOutput(root, dirs));

  HiddenModel model = BuildModel(o);
  model.bias = SolveBias(o, model);

  CtrGeneratorReport r;
  r.bias = model.bias;
  double train_clicks = 0;
  for (int i = 0; i < o.train_files; ++i) {
    r.train_paths.push_back((dirs[0] / PartName(i, "txt")).string());
    FLEET_RETURN_IF_ERROR(WriteDataFile(o, model, kTrainStreamBase + i, r.train_paths.back(), "",
                                        nullptr, nullptr, &train_clicks));
  }
  std::vector<float> probs, labels;
  double test_clicks = 0;
  for (int i = 0; i < o.test_files; ++i) {
    r.test_paths.push_back((dirs[1] / PartName(i, "txt")).string());
    r.prob_paths.push_back((dirs[2] / PartName(i, "prob")).string());
    FLEET_RETURN_IF_ERROR(WriteDataFile(o, model, kTestStreamBase + i, r.test_paths.back(),
                                        r.prob_paths.back(), &probs, &labels, &test_clicks));
  }
  r.train_lines = o.train_files * o.lines_per_file;
  r.test_lines = o.test_files * o.lines_per_file;
  r.train_ctr = train_clicks / r.train_lines;
  r.test_ctr = test_clicks / r.test_lines;
  r.oracle_auc = ExactAuc(probs, labels);
  r.oracle_logloss = LogLossSum(probs, labels) / r.test_lines;

  std::string text =
      "# FleetPS synthetic CTR data written by gen_ctr_data. oracle_auc is the AUC of the\n"
      "# true click probabilities (test_prob/) against the test labels: the best any model\n"
      "# can reach on test/.\n";
  const std::pair<const char*, std::string> values[] = {
      {"oracle_auc", FormatNumber(r.oracle_auc)},
      {"oracle_logloss", FormatNumber(r.oracle_logloss)},
      {"train_ctr", FormatNumber(r.train_ctr)},
      {"test_ctr", FormatNumber(r.test_ctr)},
      {"train_lines", std::to_string(r.train_lines)},
      {"test_lines", std::to_string(r.test_lines)},
      {"bias", FormatNumber(r.bias)},
      {"seed", std::to_string(o.seed)},
      {"vocab", std::to_string(o.vocab)},
      {"zipf", FormatNumber(o.zipf)},
      {"target_ctr", FormatNumber(o.target_ctr)},
      {"weight_scale", FormatNumber(o.weight_scale)},
      {"slot_decay", FormatNumber(o.slot_decay)},
      {"interaction_scale", FormatNumber(o.interaction_scale)},
      {"dense_weight_scale", FormatNumber(o.dense_weight_scale)},
      {"missing_rate", FormatNumber(o.missing_rate)},
  };
  for (const auto& [key, value] : values) text += std::string(key) + " " + value + "\n";
  FLEET_RETURN_IF_ERROR(WriteFileAtomically((root / "oracle.txt").string(), text));
  return r;
}

Result<OracleInfo> ReadOracleFile(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(auto file, InputFile::Open(path));
  LineReader lines(std::move(file));
  std::map<std::string, double, std::less<>> kv;
  std::string_view line;
  for (;;) {
    FLEET_ASSIGN_OR_RETURN(const bool got, lines.Next(&line));
    if (!got) break;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    double v = 0;
    const std::string_view value =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (space == std::string_view::npos || ec != std::errc() ||
        end != value.data() + value.size()) {
      return Status::Corruption(
          "line " + std::to_string(lines.line_number()) + " is not 'key number'", path);
    }
    kv[std::string(line.substr(0, space))] = v;
  }
  auto get = [&kv](std::string_view key) {
    const auto it = kv.find(key);
    return it == kv.end() ? 0.0 : it->second;
  };
  if (kv.find("oracle_auc") == kv.end()) return Status::Corruption("no oracle_auc line", path);
  OracleInfo info;
  info.oracle_auc = get("oracle_auc");
  info.oracle_logloss = get("oracle_logloss");
  info.train_ctr = get("train_ctr");
  info.test_ctr = get("test_ctr");
  info.train_lines = static_cast<int64_t>(get("train_lines"));
  info.test_lines = static_cast<int64_t>(get("test_lines"));
  return info;
}

}  // namespace fleet::data
