// CtrModel (every kind) against a small double-precision reference: the
// reference computes the forward of the model's definition directly, with
// plain loops in double over the model's own parameters, and its gradients
// by central differences in double (errors ~1e-9); the float model must
// give the same loss, probabilities, parameter and pooled gradients.
#include "trainer/models/ctr_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_backend.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::RandomVector;

constexpr int kSlots = 3, kPull = 3, kDense = 2, kBatch = 4;

struct Case {
  std::string name;
  CtrModelConfig config;
};

CtrModelConfig Small(bool wide, bool fm, int cross, std::vector<int> hidden) {
  CtrModelConfig c;
  c.num_slots = kSlots;
  c.embedding_dim = kPull;
  c.num_dense = kDense;
  c.wide = wide;
  c.fm = fm;
  c.cross_layers = cross;
  c.hidden = std::move(hidden);
  c.seed = 9;
  return c;
}

// The model's definition in double, over host copies of its parameters:
// x0 = [pooled slots, dense]; deep h = relu(W h + b) per hidden layer;
// cross c = x0 * (W c + b) + c; logit = head([c_L, h]) + wide + fm.
class Reference {
 public:
  Reference(const CtrModelConfig& c, const ParamTable& table, std::vector<double> params)
      : c_(c), params_(std::move(params)) {
    size_t at = 0;
    for (const ParamSpec& p : table) {
      offset_[p.name] = at;
      at += static_cast<size_t>(p.shape.numel());
    }
  }
  std::vector<double>& params() { return params_; }

  // Mean BCE over the batch; probs (optional) gets sigmoid(logit).
  double Loss(const std::vector<double>& pooled, const std::vector<double>& dense,
              const std::vector<float>& labels, std::vector<double>* probs = nullptr) const {
    const int in = kSlots * kPull + kDense;
    double total = 0;
    if (probs != nullptr) probs->assign(kBatch, 0.0);
    for (int b = 0; b < kBatch; ++b) {
      std::vector<double> x0(in);
      for (int s = 0; s < kSlots; ++s)
        for (int d = 0; d < kPull; ++d) x0[s * kPull + d] = pooled[(s * kBatch + b) * kPull + d];
      for (int j = 0; j < kDense; ++j) x0[kSlots * kPull + j] = dense[b * kDense + j];
      std::vector<double> h = x0;
      for (size_t l = 0; l < c_.hidden.size(); ++l) {
        h = Affine("fc" + std::to_string(l + 1), h, c_.hidden[l]);
        for (double& v : h) v = std::max(v, 0.0);
      }
      std::vector<double> x = x0;
      for (int l = 0; l < c_.cross_layers; ++l) {
        const std::vector<double> u = Affine("cross" + std::to_string(l + 1), x, in);
        for (int i = 0; i < in; ++i) x[i] = x0[i] * u[i] + x[i];
      }
      std::vector<double> head_in;
      if (c_.cross_layers > 0) head_in = x;
      if (!c_.hidden.empty()) head_in.insert(head_in.end(), h.begin(), h.end());
      if (head_in.empty()) head_in = x0;
      double logit = Affine("fc" + std::to_string(c_.hidden.size() + 1), head_in, 1)[0];
      if (c_.wide) {
        for (int s = 0; s < kSlots; ++s) logit += x0[s * kPull];
      }
      if (c_.fm) {
        for (int f = 0; f < kSlots; ++f)
          for (int g = f + 1; g < kSlots; ++g)
            for (int d = 1; d < kPull; ++d) logit += x0[f * kPull + d] * x0[g * kPull + d];
      }
      const double p = 1.0 / (1.0 + std::exp(-logit));
      if (probs != nullptr) (*probs)[b] = p;
      total += -(labels[b] * std::log(p) + (1 - labels[b]) * std::log(1 - p));
    }
    return total / kBatch;
  }

 private:
  // W [out, in] x + b of the named Linear's parameters.
  std::vector<double> Affine(const std::string& name, const std::vector<double>& x, int out) const {
    const double* w = params_.data() + offset_.at(name + ".weight");
    const double* bias = params_.data() + offset_.at(name + ".bias");
    const int in = static_cast<int>(x.size());
    std::vector<double> y(out);
    for (int o = 0; o < out; ++o) {
      double s = bias[o];
      for (int i = 0; i < in; ++i) s += w[o * in + i] * x[i];
      y[o] = s;
    }
    return y;
  }

  const CtrModelConfig c_;
  std::vector<double> params_;
  std::map<std::string, size_t> offset_;
};

// d loss / d v[i] by central differences in double.
std::vector<float> NumericGrad(std::vector<double>& v, const std::function<double()>& loss) {
  std::vector<float> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double saved = v[i], eps = 1e-6;
    v[i] = saved + eps;
    const double up = loss();
    v[i] = saved - eps;
    const double down = loss();
    v[i] = saved;
    g[i] = static_cast<float>((up - down) / (2 * eps));
  }
  return g;
}

class CtrModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(CtrModelTest, MatchesADoublePrecisionReference) {
  const CtrModelConfig c = GetParam().config;
  CpuBackend backend;
  Result<std::unique_ptr<CtrModel>> made = CtrModel::Create(c, &backend);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  CtrModel& model = **made;
  // Inputs away from ReLU kinks are not needed: the reference's own
  // differences are taken on the same side of them at eps 1e-6.
  const std::vector<float> pooled = RandomVector(kSlots * kBatch * kPull, 3);
  const std::vector<float> dense = RandomVector(kBatch * kDense, 4, 0, 2);
  const std::vector<float> labels = {1, 0, 0, 1};

  model.arena().ZeroGrad();
  Result<float> loss = model.Forward(pooled, dense, labels);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  std::vector<std::pair<size_t, size_t>> reported;
  model.Backward([&](size_t first, size_t end) { reported.emplace_back(first, end); });
  std::vector<float> probs(kBatch), dpooled(pooled.size());
  model.ProbabilitiesToHost(probs);
  model.PooledGradToHost(dpooled);

  const std::span<const float> p(model.arena().params().data(), model.arena().size());
  Reference ref(c, model.param_table(), std::vector<double>(p.begin(), p.end()));
  std::vector<double> pin(pooled.begin(), pooled.end()), din(dense.begin(), dense.end());
  std::vector<double> ref_probs;
  const double ref_loss = ref.Loss(pin, din, labels, &ref_probs);
  EXPECT_NEAR(*loss, ref_loss, 1e-5 * (1 + std::fabs(ref_loss)));
  EXPECT_TRUE(
      AllClose("probs", probs, std::vector<float>(ref_probs.begin(), ref_probs.end()), 1e-6, 1e-5));

  auto ref_loss_fn = [&] { return ref.Loss(pin, din, labels); };
  const std::vector<float> ref_dparams = NumericGrad(ref.params(), ref_loss_fn);
  const std::span<const float> dparams(model.arena().grads().data(), model.arena().size());
  size_t at = 0;
  for (const ParamSpec& spec : model.param_table()) {
    const size_t n = static_cast<size_t>(spec.shape.numel());
    EXPECT_TRUE(AllClose("d" + spec.name, dparams.subspan(at, n),
                         std::span<const float>(ref_dparams).subspan(at, n), 2e-6, 1e-4));
    at += n;
  }
  EXPECT_TRUE(AllClose("dpooled", dpooled, NumericGrad(pin, ref_loss_fn), 2e-6, 1e-4));

  // Every parameter tensor reported ready exactly once.
  std::vector<int> times(model.param_table().size(), 0);
  for (auto [first, end] : reported)
    for (size_t t = first; t < end; ++t) ++times[t];
  for (size_t t = 0; t < times.size(); ++t) EXPECT_EQ(times[t], 1) << model.param_table()[t].name;
}

INSTANTIATE_TEST_SUITE_P(Kinds, CtrModelTest,
                         ::testing::Values(Case{"dnn", Small(false, false, 0, {5, 4})},
                                           Case{"wide_deep", Small(true, false, 0, {5, 4})},
                                           Case{"deepfm", Small(true, true, 0, {5})},
                                           Case{"dcn", Small(false, false, 2, {5, 4})},
                                           Case{"cross_only", Small(false, false, 3, {})},
                                           Case{"fm_only", Small(true, true, 0, {})},
                                           Case{"linear", Small(false, false, 0, {})}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(CtrModelKindsTest, KindsTurnOnTheirParts) {
  std::vector<std::string> names;
  for (const CtrModelKind& k : CtrModelKinds()) names.push_back(k.name);
  EXPECT_EQ(names, (std::vector<std::string>{"dnn", "wide_deep", "deepfm", "dcn"}));
  const CtrModelKind* deepfm = FindCtrModelKind("deepfm");
  ASSERT_NE(deepfm, nullptr);
  EXPECT_TRUE(deepfm->wide && deepfm->fm && deepfm->deep && !deepfm->cross);
  const CtrModelKind* dcn = FindCtrModelKind("dcn");
  ASSERT_NE(dcn, nullptr);
  EXPECT_TRUE(dcn->cross && dcn->deep && !dcn->wide && !dcn->fm);
  EXPECT_EQ(FindCtrModelKind("xdeepfm"), nullptr);
}

TEST(CtrModelConfigTest, RefusesWhatItCannotCompute) {
  CpuBackend backend;
  CtrModelConfig fm = Small(true, true, 0, {4});
  fm.embedding_dim = 1;  // no room for an embedding beside the weight
  Result<std::unique_ptr<CtrModel>> m = CtrModel::Create(fm, &backend);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().ToString().find("pull width must be >= 2"), std::string::npos)
      << m.status().ToString();
  CtrModelConfig deep = Small(false, false, 17, {4});
  EXPECT_FALSE(CtrModel::Create(deep, &backend).ok());
  // The dnn's parameter table is CTR-DNN's (configs and checkpoints keep
  // their dense dim): 26 x 9 + 13 inputs, [400, 400, 400].
  CtrModelConfig dnn;
  EXPECT_EQ(ParamArena::Create(CtrModelParamTable(dnn), &backend)->size(), 420401u);
}

}  // namespace
}  // namespace fleet::trainer
