// gpt_bench: GPT-2 training throughput on CPU, and its model FLOPs
// utilisation against the sgemm rate OpenBLAS reaches in the same run on the
// model's own GEMM shapes with the same number of threads.
//
//   step = ZeroGrad + Forward + Backward + AdamW step (clipping on), one
//          micro-batch of B x T tokens, GptModel on CpuGptKernels.
//   MFU  = (model FLOPs per token x tokens per step / p50 step time)
//          / (sgemm reference GFLOP/s)
//   model FLOPs per token = 6 N' + 12 L T C (PaLM's, see gpt_plan.h);
//   sgemm reference = total FLOPs of one step's matmuls (forward, input
//          gradients, weight gradients, the tied head's three) / the p50
//          time of a round of cblas_sgemm calls on those shapes (each once,
//          weighted by its count), OpenBLAS running its own threads (as many
//          as the model uses). One round runs between every two timed steps,
//          so both see the same load from other processes.
//
// Presets: "tiny" (L 4, C 256, NH 4, T 128, B 8) and "124m" (GPT-2 small's
// shape: L 12, C 768, NH 12, T 256, B 4); vocabulary 50304 for both (FleetX's
// padded GPT-2 vocabulary). Each case runs in a child process (so that its
// peak RSS is its own), with recompute off and then on, and the run ends with
// a table of both.
//
// Before timing, each case verifies itself: the loss at initialisation is
// within 0.05 of ln V + r^2 C / 2 (GPT-2's small initial weights give
// near-uniform logits), every gradient is finite, and the CPU twin's matmul
// on the model's qkv shape agrees with the naive reference.
//
//   gpt_bench [--preset=all|tiny|124m] [--threads=0] [--seconds=20]
//             [--recompute=both|off|on] [--batch=0] [--seq=0] [--vocab=50304]
//
// On a GPU (--device=cuda:K, a build with CUDA): the same step on
// CudaGptKernels in --precision (bf16 by default); presets 124m (B 16 x T
// 1024, the shape of issue #21's PyTorch comparison), 345m (L 24, C 1024,
// NH 16, B 8 x T 1024) and 1.3b (L 24, C 2048, NH 16, B 4 x T 1024), "all"
// meaning those three. MFU is against the best rate of an 8192^3 cuBLAS
// GEMM with bf16 inputs and float32 accumulation measured in the same
// process before and after the timed steps; the time by kernel kind comes
// from CUDA events around each GptKernels call (3 extra steps, not the
// timed ones); memory is the device memory in use after the steps (the
// model allocates everything up front, so that is the high-water mark).
// One more step runs between cudaProfilerStart / Stop for
// `ncu --profile-from-start off` (scripts/gpu_check.sh, GPU_CHECK_NCU=1).
//   gpt_bench --device=cuda:0 [--preset=124m|345m|1.3b|all] [--precision=bf16|fp16|fp32]
//             [--attention=mma|wmma|mma_ldmatrix]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cblas.h>
#include <gflags/gflags.h>
#include <glog/logging.h>

#include "bench/bench_util.h"
#include "comm/splitmix.h"
#include "trainer/models/adamw.h"
#include "trainer/backend.h"
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/gpt_ref_kernels.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_plan.h"
#ifdef FLEET_BENCH_CUDA
#include "bench/gpt_bench_cuda.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#endif

DEFINE_string(preset, "all", "Model shape: tiny, 124m or all.");
DEFINE_int32(threads, 0, "Worker threads (pool + caller; OpenBLAS for the reference). 0 = cores.");
DEFINE_double(seconds, 20.0, "Target seconds of timed steps per case (at least 5 steps).");
DEFINE_string(recompute, "both", "Activation recompute: off, on, or both (to compare memory).");
DEFINE_int32(batch, 0, "Sequences per step; 0 = the preset's.");
DEFINE_int32(seq, 0, "Tokens per sequence; 0 = the preset's.");
DEFINE_int32(vocab, 50304, "Vocabulary size.");
DEFINE_string(device, "cpu", "cpu, or cuda:K (a build with CUDA).");
DEFINE_string(precision, "bf16", "On a GPU: bf16, fp16 or fp32 (the CPU computes in fp32).");
DEFINE_string(gemm_operands, "rounded",
              "On a GPU in bf16 / fp16: rounded (16-bit copies of the GEMM operands) or "
              "in_kernel (float32 operands, cuBLAS's FAST_16BF compute type).");
DEFINE_string(attention, "mma",
              "On a GPU in bf16 / fp16 (sm_80+): mma (the default tensor-core flash attention: "
              "scores in registers on mma.sync), wmma (the earlier, slower one) or mma_ldmatrix "
              "(mma reading transposed operands with ldmatrix; not yet run on a GPU).");

namespace fleet::bench {
namespace {

using trainer::GptConfig;
using trainer::GptLayerKind;
using trainer::GptProfile;

struct Preset {
  std::string name;
  int layers, hidden, heads, seq, batch;
};

// What a child reports to the parent for the final table.
struct CaseResult {
  double tokens_per_s = 0, mfu = 0, sgemm_gflops = 0, step_ms = 0;
  double activation_mib = 0, peak_rss_mib = 0;
  bool ok = false;
};

struct GemmShape {
  bool ta, tb;
  int M, N, K;
  int count;  // occurrences per step
  double flops() const { return 2.0 * M * N * K * count; }
};

// Every matmul GEMM of one training step, as CpuGptKernels issues them (one
// per layer and direction, before its blocking): forward out = x W^T, input
// gradient dx = dy W, weight gradient dW = dy^T x.
std::vector<GemmShape> TrainingGemms(const GptConfig& c, int B, int T) {
  const int N = B * T, C = c.hidden_size, F = c.ffn(), L = c.num_layers;
  std::vector<GemmShape> out;
  auto linear = [&](int IC, int OC, int count) {
    out.push_back({false, true, N, OC, IC, count});   // forward
    out.push_back({false, false, N, IC, OC, count});  // input gradient
    out.push_back({true, false, OC, IC, N, count});   // weight gradient
  };
  linear(C, 3 * C, L);
  linear(C, C, L);
  linear(C, F, L);
  linear(F, C, L);
  linear(C, c.vocab_size, 1);  // the tied head
  return out;
}

// The sgemm reference: OpenBLAS with its own `threads` threads on one
// step's matmul shapes. Run() does one round (each shape once) between two
// timed steps, so that the reference and the model see the same load from
// whatever else runs on the machine; the reference rate is the step's GEMM
// FLOPs over the p50 of the rounds' times weighted by each shape's count.
class SgemmReference {
 public:
  SgemmReference(std::vector<GemmShape> shapes, int threads)
      : shapes_(std::move(shapes)), threads_(threads), seconds_(shapes_.size()) {
    size_t max_a = 0, max_b = 0, max_c = 0;
    for (const GemmShape& s : shapes_) {
      max_a = std::max(max_a, size_t(s.M) * s.K);
      max_b = std::max(max_b, size_t(s.K) * s.N);
      max_c = std::max(max_c, size_t(s.M) * s.N);
      flops_ += s.flops();
    }
    a_.assign(max_a, 0.5f);
    b_.assign(max_b, 0.25f);
    c_.assign(max_c, 0.0f);
  }

  void Run() {
    trainer::kernels::SetBlasThreads(threads_);
    double weighted = 0;
    for (size_t i = 0; i < shapes_.size(); ++i) {
      const GemmShape& s = shapes_[i];
      const auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                  s.M, s.N, s.K, 1.0f, a_.data(), s.ta ? s.M : s.K, b_.data(), s.tb ? s.K : s.N,
                  0.0f, c_.data(), s.N);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      seconds_[i].push_back(t);
      weighted += t * s.count;
    }
    rounds_.push_back(weighted);
    trainer::kernels::SetBlasThreads(1);
  }

  // GFLOP/s over the p50 round.
  double Gflops() const { return flops_ / (Summarize(std::vector<double>(rounds_)).p50) * 1e-9; }

  void Print() const {
    for (size_t i = 0; i < shapes_.size(); ++i) {
      const GemmShape& s = shapes_[i];
      const double t = Summarize(seconds_[i]).p50;
      std::printf("    sgemm %c%c M %6d N %6d K %6d  x%-3d %8.1f GFLOP/s\n", s.ta ? 'T' : 'N',
                  s.tb ? 'T' : 'N', s.M, s.N, s.K, s.count, 2.0 * s.M * s.N * s.K / t * 1e-9);
    }
  }

 private:
  const std::vector<GemmShape> shapes_;
  const int threads_;
  std::vector<float> a_, b_, c_;
  double flops_ = 0;
  std::vector<std::vector<double>> seconds_;  // per shape, per round
  std::vector<double> rounds_;
};

double PeakRssMib() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

// Checks the model before timing it; false (with a message) on failure.
bool Verify(trainer::GptModel* model, const std::vector<int32_t>& tokens,
            const std::vector<int32_t>& targets, int B, int T, trainer::GptKernels* kernels) {
  const GptConfig& c = model->config();
  model->arena().ZeroGrad();
  auto loss = model->Forward(tokens, targets, B, T);
  if (!loss.ok()) {
    std::printf("VERIFY FAILED: %s\n", loss.status().ToString().c_str());
    return false;
  }
  model->Backward();
  // Logits at initialisation are ln_f(x) wte^T: sums of C products of a unit
  // normal and an N(0, r^2) weight, so N(0, r^2 C), and the expected loss is
  // about ln V + r^2 C / 2.
  const double r = c.initializer_range;
  const double expect = std::log(static_cast<double>(c.vocab_size)) + 0.5 * r * r * c.hidden_size;
  const auto grads = model->arena().GradsToHost();
  const bool finite =
      std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); });
  // The CPU twin's matmul on the qkv shape (16 rows) against the oracle.
  const int N = 16, C = c.hidden_size;
  std::vector<float> x(size_t(N) * C), w(size_t(3) * C * C), bias(3 * C), got(size_t(N) * 3 * C),
      want(size_t(N) * 3 * C);
  SplitMix64 rng(3);
  for (auto* v : {&x, &w, &bias})
    for (float& f : *v) f = rng.UniformFloat() - 0.5f;
  kernels->MatmulForward(got.data(), x.data(), w.data(), bias.data(), N, C, 3 * C, false);
  trainer::RefGptKernels ref;
  ref.MatmulForward(want.data(), x.data(), w.data(), bias.data(), N, C, 3 * C, false);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(double{got[i]} - want[i]));
    scale = std::max(scale, std::fabs(double{want[i]}));
  }
  worst /= scale;
  std::printf(
      "verify: loss at init %.4f (expected ln V + r^2 C / 2 = %.4f), gradients %s, "
      "matmul vs reference max error %.1e of the largest value\n",
      *loss, expect, finite ? "finite" : "NOT FINITE", worst);
  if (std::fabs(*loss - expect) > 0.05 || !finite || worst > 1e-5) {
    std::printf("VERIFY FAILED\n");
    return false;
  }
  return true;
}

CaseResult RunCase(const Preset& p, bool recompute, int threads) {
  CaseResult result;
  GptConfig c;
  c.vocab_size = FLAGS_vocab;
  c.max_position_embeddings = 1024;
  c.hidden_size = p.hidden;
  c.num_layers = p.layers;
  c.num_attention_heads = p.heads;
  c.use_recompute = recompute;
  const int B = p.batch, T = p.seq, tokens_per_step = B * T;
  std::printf(
      "== %s: L %d, C %d, NH %d, V %d, B %d x T %d = %d tokens/step, %d threads, "
      "recompute %s\n",
      p.name.c_str(), p.layers, p.hidden, p.heads, c.vocab_size, B, T, tokens_per_step, threads,
      recompute ? "on" : "off");
  auto pool = trainer::SetUpGptCpuThreads(threads);
  trainer::CpuGptKernels kernels(pool.get());
  trainer::CpuBackend backend;
  auto model_or = trainer::GptModel::Create(c, &backend, &kernels);
  if (!model_or.ok()) {
    std::printf("model: %s\n", model_or.status().ToString().c_str());
    return result;
  }
  trainer::GptModel& model = **model_or;
  trainer::AdamW adamw(&model.arena(), &kernels, trainer::AdamWConfig{}, 1e-4f);

  // Random next-token data (fixed seed).
  std::vector<int32_t> stream(size_t(tokens_per_step) + 1);
  SplitMix64 rng(42);
  for (int32_t& t : stream) t = static_cast<int32_t>(rng.Next() % c.vocab_size);
  const std::vector<int32_t> tokens(stream.begin(), stream.end() - 1);
  const std::vector<int32_t> targets(stream.begin() + 1, stream.end());
  if (!Verify(&model, tokens, targets, B, T, &kernels)) return result;

  GptProfile profile;
  double optimizer_s = 0;
  auto step = [&] {
    model.arena().ZeroGrad();
    CHECK(model.Forward(tokens, targets, B, T).ok());
    model.Backward();
    const auto t0 = std::chrono::steady_clock::now();
    adamw.Step();
    optimizer_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const int iterations = IterationsFor(step, FLAGS_seconds);
  // Before the reference allocates its own matrices.
  result.peak_rss_mib = PeakRssMib();
  SgemmReference reference(TrainingGemms(c, B, T), threads);
  reference.Run();  // warm-up
  model.set_profile(&profile);
  optimizer_s = 0;
  std::vector<double> step_us;
  for (int i = 0; i < iterations; ++i) {
    step_us.push_back(TimeEach(step, 1)[0]);
    model.set_profile(nullptr);
    reference.Run();
    model.set_profile(&profile);
  }
  model.set_profile(nullptr);
  const Summary s = Summarize(step_us);

  auto plan = trainer::PlanGpt(c, {.micro_batch_size = B, .seq_len = T}, &kernels);
  CHECK(plan.ok()) << plan.status().ToString();
  const double step_s = s.p50 * 1e-6;
  result.tokens_per_s = tokens_per_step / step_s;
  const double model_gflops = plan->flops_per_token * result.tokens_per_s * 1e-9;

  PrintHeader();
  PrintRow("train step", s, 0);
  std::printf(
      "  tokens/s at p50: %.0f   model FLOPs/token %.4g (6N' %.4g + 12LTC %.4g): %.1f "
      "GFLOP/s\n",
      result.tokens_per_s, plan->flops_per_token, plan->matmul_flops_per_token,
      plan->attention_flops_per_token, model_gflops);
  std::printf("  time by layer kind (share of the summed step time over %d steps):\n", iterations);
  double total = 0;
  for (double v : profile.seconds) total += v;
  total += optimizer_s;
  for (size_t k = 0; k < GptProfile::kKinds; ++k) {
    std::printf("    %-11s %6.1f%%  %8.1f ms/step\n",
                std::string(GptProfile::Name(static_cast<GptLayerKind>(k))).c_str(),
                100.0 * profile.seconds[k] / total, 1e3 * profile.seconds[k] / iterations);
  }
  std::printf("    %-11s %6.1f%%  %8.1f ms/step\n", "optimizer", 100.0 * optimizer_s / total,
              1e3 * optimizer_s / iterations);

  std::printf(
      "  sgemm reference, OpenBLAS with %d threads on this step's matmul shapes, one "
      "round between timed steps:\n",
      threads);
  reference.Print();
  result.sgemm_gflops = reference.Gflops();
  result.mfu = model_gflops / result.sgemm_gflops;
  result.step_ms = step_s * 1e3;
  result.activation_mib = model.activation_bytes() / (1024.0 * 1024.0);
  std::printf("  sgemm reference %.1f GFLOP/s; MFU (model GFLOP/s / sgemm GFLOP/s) = %.1f%%\n",
              result.sgemm_gflops, 100.0 * result.mfu);
  std::printf(
      "  activations %.1f MiB (plan %.1f MiB), peak RSS %.1f MiB (before the reference)\n\n",
      result.activation_mib, plan->activation_bytes / (1024.0 * 1024.0), result.peak_rss_mib);
  result.ok = true;
  return result;
}

#ifdef FLEET_BENCH_CUDA
// A case on the GPU: CaseResult's sgemm_gflops is the cuBLAS bf16 GEMM rate,
// peak_rss_mib the device memory in use.
CaseResult RunCudaCase(const Preset& p, bool recompute) {
  CaseResult result;
  GptConfig c;
  c.vocab_size = FLAGS_vocab;
  c.max_position_embeddings = std::max(1024, p.seq);
  c.hidden_size = p.hidden;
  c.num_layers = p.layers;
  c.num_attention_heads = p.heads;
  c.use_recompute = recompute;
  const int B = p.batch, T = p.seq, tokens_per_step = B * T;
  auto precision = trainer::ParsePrecision(FLAGS_precision);
  if (!precision.ok()) {
    std::printf("--precision: %s\n", precision.status().ToString().c_str());
    return result;
  }
  std::printf(
      "== %s on %s, %s (GEMM operands %s, attention %s): L %d, C %d, NH %d, V %d, B %d x T %d = "
      "%d tokens/step, recompute %s\n",
      p.name.c_str(), FLAGS_device.c_str(), FLAGS_precision.c_str(), FLAGS_gemm_operands.c_str(),
      FLAGS_attention.c_str(), p.layers, p.hidden, p.heads, c.vocab_size, B, T, tokens_per_step,
      recompute ? "on" : "off");
  auto compute = trainer::CreateGptCompute(FLAGS_device, *precision, 1);
  if (!compute.ok()) {
    std::printf("device: %s\n", compute.status().ToString().c_str());
    return result;
  }
  if (!SetGemmOperands(compute->kernels.get(), FLAGS_gemm_operands)) {
    std::printf("--gemm_operands must be rounded or in_kernel, got %s\n",
                FLAGS_gemm_operands.c_str());
    return result;
  }
  if (!SetAttentionKernel(compute->kernels.get(), FLAGS_attention)) {
    std::printf("--attention must be mma, wmma or mma_ldmatrix, got %s\n", FLAGS_attention.c_str());
    return result;
  }
  KernelTimer timer(compute->kernels.get(), *compute->backend);
  auto model_or = trainer::GptModel::Create(c, compute->backend.get(), &timer);
  if (!model_or.ok()) {
    std::printf("model: %s\n", model_or.status().ToString().c_str());
    return result;
  }
  trainer::GptModel& model = **model_or;
  trainer::AdamW adamw(&model.arena(), &timer, trainer::AdamWConfig{}, 1e-4f);
  std::vector<int32_t> stream(size_t(tokens_per_step) + 1);
  SplitMix64 rng(42);
  for (int32_t& t : stream) t = static_cast<int32_t>(rng.Next() % c.vocab_size);
  const std::vector<int32_t> tokens(stream.begin(), stream.end() - 1);
  const std::vector<int32_t> targets(stream.begin() + 1, stream.end());

  // The loss at initialisation (see Verify) and finite gradients; the
  // kernels themselves are checked by trainer_gpt_cuda_kernels_test.
  model.arena().ZeroGrad();
  auto loss = model.Forward(tokens, targets, B, T);
  if (!loss.ok()) {
    std::printf("VERIFY FAILED: %s\n", loss.status().ToString().c_str());
    return result;
  }
  model.Backward();
  const double r = c.initializer_range;
  const double expect = std::log(static_cast<double>(c.vocab_size)) + 0.5 * r * r * c.hidden_size;
  const auto grads = model.arena().GradsToHost();
  const bool finite =
      std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); });
  std::printf("verify: loss at init %.4f (expected %.4f), gradients %s\n", *loss, expect,
              finite ? "finite" : "NOT FINITE");
  if (std::fabs(*loss - expect) > 0.05 || !finite) {
    std::printf("VERIFY FAILED\n");
    return result;
  }

  auto step = [&] {
    model.arena().ZeroGrad();
    CHECK(model.Forward(tokens, targets, B, T).ok());
    model.Backward();
    adamw.Step();
    SynchronizeDevice();
  };
  step();  // warm-up: cuBLAS plans, first-touch
  const double peak_before = CublasBf16GemmTflops(8192, 10);
  const int iterations = IterationsFor(step, FLAGS_seconds);
  const Summary s = Summarize(TimeEach(step, iterations));
  const double peak_tflops = std::max(peak_before, CublasBf16GemmTflops(8192, 10));
  constexpr int kTimedSteps = 3;
  timer.set_enabled(true);
  for (int i = 0; i < kTimedSteps; ++i) step();
  timer.set_enabled(false);
  const std::array<double, kKernelKinds> kind_ms = timer.Collect();
  RunProfiledStep(step);

  auto plan = trainer::PlanGpt(c, {.micro_batch_size = B, .seq_len = T}, &timer);
  CHECK(plan.ok()) << plan.status().ToString();
  const double step_s = s.p50 * 1e-6;
  result.tokens_per_s = tokens_per_step / step_s;
  const double model_tflops = plan->flops_per_token * result.tokens_per_s * 1e-12;
  result.sgemm_gflops = peak_tflops * 1e3;
  result.mfu = model_tflops / peak_tflops;
  result.step_ms = step_s * 1e3;
  result.activation_mib = model.activation_bytes() / (1024.0 * 1024.0);
  result.peak_rss_mib = DeviceMemoryUsedMib();
  PrintHeader();
  PrintRow("train step", s, 0);
  std::printf("  tokens/s at p50: %.0f   model FLOPs/token %.4g: %.1f TFLOP/s\n",
              result.tokens_per_s, plan->flops_per_token, model_tflops);
  std::printf("  cuBLAS bf16 GEMM (8192^3, float32 accumulation) %.1f TFLOP/s; MFU %.1f%%\n",
              peak_tflops, 100.0 * result.mfu);
  double total = 0;
  for (double v : kind_ms) total += v;
  std::printf("  GPU time by kernel kind (CUDA events, %d steps):\n", kTimedSteps);
  for (size_t k = 0; k < kKernelKinds; ++k) {
    std::printf("    %-11s %6.1f%%  %8.2f ms/step\n",
                std::string(KernelKindName(static_cast<KernelKind>(k))).c_str(),
                total > 0 ? 100.0 * kind_ms[k] / total : 0.0, kind_ms[k] / kTimedSteps);
  }
  std::printf("  activations %.1f MiB (plan %.1f MiB), device memory in use %.1f MiB\n\n",
              result.activation_mib, plan->activation_bytes / (1024.0 * 1024.0),
              result.peak_rss_mib);
  result.ok = true;
  return result;
}
#endif  // FLEET_BENCH_CUDA

bool OnGpu() { return FLAGS_device != "cpu"; }

// Runs a case in a child process and returns what it reported.
CaseResult RunInChild(const Preset& p, bool recompute, int threads) {
  int fds[2];
  PCHECK(pipe(fds) == 0);
  std::fflush(stdout);
  const pid_t pid = fork();
  PCHECK(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
#ifdef FLEET_BENCH_CUDA
    const CaseResult r = OnGpu() ? RunCudaCase(p, recompute) : RunCase(p, recompute, threads);
#else
    const CaseResult r = RunCase(p, recompute, threads);
#endif
    std::fflush(stdout);
    PCHECK(write(fds[1], &r, sizeof(r)) == static_cast<ssize_t>(sizeof(r)));
    _exit(r.ok ? 0 : 1);
  }
  close(fds[1]);
  CaseResult r;
  if (read(fds[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r))) r.ok = false;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return r;
}

int Main() {
  PrintEnvironment("gpt_bench");
  const int threads =
      FLAGS_threads > 0 ? FLAGS_threads : static_cast<int>(std::thread::hardware_concurrency());
  std::vector<Preset> presets;
  const bool all = FLAGS_preset == "all";
  if (OnGpu()) {
#ifndef FLEET_BENCH_CUDA
    std::fprintf(stderr, "--device=%s: this build has no CUDA\n", FLAGS_device.c_str());
    return 2;
#endif
    if (FLAGS_preset == "124m" || all) presets.push_back({"124m", 12, 768, 12, 1024, 16});
    if (FLAGS_preset == "345m" || all) presets.push_back({"345m", 24, 1024, 16, 1024, 8});
    if (FLAGS_preset == "1.3b" || all) presets.push_back({"1.3b", 24, 2048, 16, 1024, 4});
  } else {
    if (FLAGS_preset == "tiny" || all) presets.push_back({"tiny", 4, 256, 4, 128, 8});
    if (FLAGS_preset == "124m" || all) presets.push_back({"124m", 12, 768, 12, 256, 4});
  }
  if (presets.empty()) {
    std::fprintf(stderr, "--preset must be %s or all, got %s\n",
                 OnGpu() ? "124m, 345m, 1.3b" : "tiny, 124m", FLAGS_preset.c_str());
    return 2;
  }
  std::vector<bool> modes;
  if (FLAGS_recompute != "on") modes.push_back(false);
  if (FLAGS_recompute != "off") modes.push_back(true);
  struct Row {
    std::string name;
    bool recompute;
    CaseResult r;
  };
  std::vector<Row> rows;
  bool ok = true;
  for (Preset p : presets) {
    if (FLAGS_batch > 0) p.batch = FLAGS_batch;
    if (FLAGS_seq > 0) p.seq = FLAGS_seq;
    for (bool recompute : modes) {
      rows.push_back({p.name, recompute, RunInChild(p, recompute, threads)});
      ok = ok && rows.back().r.ok;
    }
  }
  std::printf("%-6s %-9s %10s %9s %11s %8s %12s %12s\n", "model", "recompute", "tokens/s",
              "step ms", OnGpu() ? "bf16 GF/s" : "sgemm GF/s", "MFU", "activ. MiB",
              OnGpu() ? "device MiB" : "peak RSS MiB");
  for (const Row& row : rows) {
    std::printf("%-6s %-9s %10.0f %9.0f %11.1f %7.1f%% %12.1f %12.1f\n", row.name.c_str(),
                row.recompute ? "on" : "off", row.r.tokens_per_s, row.r.step_ms, row.r.sgemm_gflops,
                100.0 * row.r.mfu, row.r.activation_mib, row.r.peak_rss_mib);
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return fleet::bench::Main();
}
