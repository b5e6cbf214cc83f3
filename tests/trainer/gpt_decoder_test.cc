// GptDecoder: the KV-cache decoder's logits after the prompt and after every
// step equal GptModel::LastLogits over the whole prefix, on the oracle and
// the CPU twin (serial and threaded), with a chunked prefill and several
// sequences; the same for independent slots (continuous batching: each
// slot with its own prompt and position, joining and leaving between
// steps); slots with LoRA adapters of their own (several fine-tunes and
// the base in one step) equal the merged models, and the logits after
// every prompt position equal LastLogits of each prefix; and the errors a
// caller can cause, none of which changes the decoder's state.
#include "trainer/models/gpt_decoder.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/gpt_ref_kernels.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_lora.h"
#include "trainer/models/gpt_lora_files.h"

namespace fleet::trainer {
namespace {

using testing::AllClose;
using testing::IsInvalidArgumentNaming;
using testing::RandomVector;

GptConfig TinyConfig() {
  GptConfig c;
  c.vocab_size = 37;
  c.max_position_embeddings = 24;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.num_layers = 2;
  return c;
}

// A model whose parameters are large enough that attention is far from
// uniform and the logits spread over several units.
struct Model {
  Model(const GptConfig& config, int pool_threads) {
    if (pool_threads < 0) {
      kernels = std::make_unique<RefGptKernels>();
    } else {
      if (pool_threads > 0) pool = std::make_unique<ThreadPool>(pool_threads);
      kernels = std::make_unique<CpuGptKernels>(pool.get());
    }
    model = std::move(GptModel::Create(config, &backend, kernels.get()).value());
    const auto params = RandomVector(model->arena().size(), 77, -0.4f, 0.4f);
    CHECK(model->arena().ParamsFromHost(params).ok());
  }
  std::unique_ptr<ThreadPool> pool;
  CpuBackend backend;
  std::unique_ptr<GptKernels> kernels;
  std::unique_ptr<GptModel> model;
};

std::string TwinName(const ::testing::TestParamInfo<int>& info) {
  return info.param < 0 ? "Reference" : "CpuPool" + std::to_string(info.param);
}

class GptDecoderTest : public ::testing::TestWithParam<int> {};

TEST_P(GptDecoderTest, EveryStepEqualsTheWholePrefixsLastLogits) {
  const GptConfig config = TinyConfig();
  Model m(config, GetParam());
  const int B = 3, V = config.vocab_size, maxT = config.max_position_embeddings;
  auto decoder = GptDecoder::Create(m.model.get(), {.batch = B, .prefill_chunk = 2});
  ASSERT_TRUE(decoder.ok()) << decoder.status().ToString();
  GptDecoder& d = **decoder;

  const std::vector<int32_t> prompt = {3, 36, 0, 17, 17};  // 3 chunks of 2, 2, 1
  std::vector<std::vector<int32_t>> seqs(B, prompt);
  auto logits = d.Prefill(prompt);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  int checked = 0;
  for (;;) {
    ASSERT_EQ(logits->size(), size_t(B) * V);
    for (int b = 0; b < B; ++b) {
      const int T = static_cast<int>(seqs[b].size());
      auto want = m.model->LastLogits(seqs[b], 1, T);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      const std::vector<float> got(logits->begin() + b * V, logits->begin() + (b + 1) * V);
      ASSERT_TRUE(AllClose("sequence " + std::to_string(b) + " at " + std::to_string(T) + " tokens",
                           got, *want, 2e-5, 2e-5));
      ++checked;
    }
    if (d.position() == maxT) break;
    // Different tokens per sequence, so a mixed-up cache row would show.
    std::vector<int32_t> next(B);
    for (int b = 0; b < B; ++b) {
      next[b] = (d.position() * 7 + b * 11) % V;
      seqs[b].push_back(next[b]);
    }
    logits = d.Step(next);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  }
  EXPECT_EQ(checked, B * (maxT - static_cast<int>(prompt.size()) + 1));

  // The context is full: an error naming the limit, nothing changed.
  const std::vector<float> before(logits->begin(), logits->end());
  auto over = d.Step(std::vector<int32_t>(B, 1));
  EXPECT_TRUE(IsInvalidArgumentNaming(over.status(), "Model.max_position_embeddings"));
  EXPECT_NE(over.status().message().find("24"), std::string::npos) << over.status().ToString();
  EXPECT_EQ(d.position(), maxT);

  // A new Prefill starts over: the same logits as the first time.
  auto again = d.Prefill(prompt);
  ASSERT_TRUE(again.ok());
  auto want = m.model->LastLogits(prompt, 1, static_cast<int>(prompt.size()));
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(AllClose("prefill again", std::vector<float>(again->begin(), again->begin() + V),
                       *want, 2e-5, 2e-5));
  EXPECT_EQ(d.position(), static_cast<int>(prompt.size()));
}

// Slots at different positions, stepped together in any order, joining
// (PrefillSlot) and leaving (ResetSlot, a full context) between steps: every
// row equals LastLogits over that slot's own prefix. Slots 0 and 1 start at
// one position, so a step also holds a run of consecutive slots sharing one
// attention call, next to slots alone.
TEST_P(GptDecoderTest, IndependentSlotsEqualTheirOwnPrefixsLastLogits) {
  const GptConfig config = TinyConfig();
  Model m(config, GetParam());
  const int B = 4, V = config.vocab_size, maxT = config.max_position_embeddings;
  auto decoder = GptDecoder::Create(m.model.get(), {.batch = B, .prefill_chunk = 3});
  ASSERT_TRUE(decoder.ok()) << decoder.status().ToString();
  GptDecoder& d = **decoder;
  std::vector<std::vector<int32_t>> seqs(B);
  int checked = 0;
  auto expect_row = [&](int slot, std::span<const float> row) {
    const int T = static_cast<int>(seqs[slot].size());
    ASSERT_EQ(d.position(slot), T);
    auto want = m.model->LastLogits(seqs[slot], 1, T);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_TRUE(AllClose("slot " + std::to_string(slot) + " at " + std::to_string(T) + " tokens",
                         std::vector<float>(row.begin(), row.end()), *want, 2e-5, 2e-5));
    ++checked;
  };
  auto prefill = [&](int slot, std::vector<int32_t> prompt) {
    seqs[slot] = prompt;
    auto logits = d.PrefillSlot(slot, prompt);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    ASSERT_EQ(logits->size(), size_t(V));
    expect_row(slot, *logits);
  };
  prefill(0, {5, 1, 9});
  prefill(1, {7, 7, 2});
  prefill(3, {30, 4, 4, 11, 8, 19, 2});  // 3 chunks
  int steps = 0;
  for (;;) {
    // Slot 2 joins after 3 steps; slot 0 leaves after 5 and comes back with
    // another prompt after 7; the others stay until their context is full.
    if (steps == 3) prefill(2, {12});
    if (steps == 5) {
      d.ResetSlot(0);
      seqs[0].clear();
      EXPECT_EQ(d.position(0), 0);
    }
    if (steps == 7) prefill(0, {3, 36});
    std::vector<int> slots;
    for (int slot : {3, 0, 1, 2}) {  // not in id order
      if (!seqs[slot].empty() && d.position(slot) < maxT) slots.push_back(slot);
    }
    if (slots.empty()) break;
    std::vector<int32_t> next;
    for (int slot : slots) {
      next.push_back((d.position(slot) * 5 + slot * 13) % V);
      seqs[slot].push_back(next.back());
    }
    auto logits = d.StepSlots(slots, next);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    ASSERT_EQ(logits->size(), slots.size() * V);
    for (size_t i = 0; i < slots.size(); ++i) expect_row(slots[i], logits->subspan(i * V, V));
    ++steps;
  }
  // 5 prefills; steps: slot 0 5 + 22, slot 1 21, slot 2 23, slot 3 17.
  EXPECT_EQ(checked, 5 + 5 + 22 + 21 + 23 + 17);

  // Errors change nothing.
  const std::vector<int> full = {1};
  EXPECT_TRUE(IsInvalidArgumentNaming(d.StepSlots(full, std::vector<int32_t>{1}).status(),
                                      "Model.max_position_embeddings"));
  d.ResetSlot(2);
  EXPECT_EQ(d.StepSlots(std::vector<int>{2}, std::vector<int32_t>{1}).status().code(),
            StatusCode::kFailedPrecondition);
  prefill(2, {6});
  EXPECT_TRUE(
      d.StepSlots(std::vector<int>{2, 2}, std::vector<int32_t>{1, 1}).status().IsInvalidArgument());
  EXPECT_TRUE(
      d.StepSlots(std::vector<int>{2}, std::vector<int32_t>{1, 1}).status().IsInvalidArgument());
  EXPECT_TRUE(IsInvalidArgumentNaming(
      d.StepSlots(std::vector<int>{2}, std::vector<int32_t>{V}).status(), "Model.vocab_size"));
  EXPECT_TRUE(IsInvalidArgumentNaming(d.PrefillSlot(0, std::vector<int32_t>(maxT + 1, 1)).status(),
                                      "Model.max_position_embeddings"));
  EXPECT_EQ(d.position(0), 0);
  EXPECT_EQ(d.position(2), 1);
  auto logits = d.StepSlots(std::vector<int>{2}, std::vector<int32_t>{9});
  ASSERT_TRUE(logits.ok());
  seqs[2].push_back(9);
  expect_row(2, *logits);
}

// Slots 0..2 run the base, adapters `a` (rank 2, every target) and `b`
// (rank 3, qkv and fc_proj) in the same prefills and steps; each row equals
// LastLogits of a model with that slot's adapters merged into its weights
// (MergeGptLora, gpt_convert --merge_lora's arithmetic), and slot 1's
// prompt logits equal its merged model's at every prefix.
TEST_P(GptDecoderTest, SlotsWithLoraAdaptersEqualTheirMergedModels) {
  const GptConfig config = TinyConfig();
  Model base(config, GetParam());
  const int V = config.vocab_size;
  struct Adapted {
    std::unique_ptr<GptLoraAdapters> adapters;
    std::unique_ptr<Model> merged;  // holds its backend: never moved
  };
  auto adapt = [&](int rank, std::array<bool, kLoraTargets> targets, uint64_t seed) {
    GptConfig c = config;
    c.lora = {.rank = rank, .alpha = 4.0f, .targets = targets};
    auto a = std::move(GptLoraAdapters::Create(c, &base.backend).value());
    // B nonzero (a fresh adapter's B is 0 and would change nothing).
    CHECK(a->arena().ParamsFromHost(RandomVector(a->arena().size(), seed, -0.3f, 0.3f)).ok());
    auto out = std::make_unique<Adapted>(
        Adapted{std::move(a), std::make_unique<Model>(config, GetParam())});
    std::vector<float> params = base.model->arena().ParamsToHost();
    MergeGptLora(c, out->adapters->arena().ParamsToHost(), params);
    CHECK(out->merged->model->arena().ParamsFromHost(params).ok());
    return out;
  };
  auto a = adapt(2, {true, true, true, true}, 5);
  auto b = adapt(3, {true, false, false, true}, 6);
  std::vector<GptModel*> reference = {base.model.get(), a->merged->model.get(),
                                      b->merged->model.get()};
  std::vector<GptLoraAdapters*> adapters = {nullptr, a->adapters.get(), b->adapters.get()};

  auto d =
      std::move(GptDecoder::Create(
                    base.model.get(),
                    {.batch = 3, .prefill_chunk = 2, .max_lora_rank = 3, .prompt_logits = true})
                    .value());
  std::vector<std::vector<int32_t>> seqs = {{4, 8, 15}, {16, 23, 4, 2, 9}, {11}};
  auto expect = [&](int slot, std::span<const float> row, const std::vector<int32_t>& prefix) {
    auto want = reference[slot]->LastLogits(prefix, 1, static_cast<int>(prefix.size()));
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_TRUE(AllClose(
        "slot " + std::to_string(slot) + " after " + std::to_string(prefix.size()) + " tokens",
        std::vector<float>(row.begin(), row.end()), *want, 5e-5, 5e-5));
  };
  int prompt_rows = 0;
  for (int slot = 0; slot < 3; ++slot) {
    PromptLogitsFn each = [&](int first, int rows, std::span<const float> logits) {
      for (int j = 0; j < rows; ++j) {
        expect(slot, logits.subspan(size_t(j) * V, V),
               std::vector<int32_t>(seqs[slot].begin(), seqs[slot].begin() + first + j + 1));
        ++prompt_rows;
      }
    };
    auto logits = d->PrefillSlot(slot, seqs[slot], adapters[slot], slot == 1 ? each : nullptr);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    expect(slot, *logits, seqs[slot]);
  }
  EXPECT_EQ(prompt_rows, 5);
  for (int step = 0; step < 6; ++step) {
    const std::vector<int> slots = {2, 0, 1};
    std::vector<int32_t> next;
    for (int slot : slots) {
      next.push_back((step * 7 + slot * 5 + 3) % V);
      seqs[slot].push_back(next.back());
    }
    auto logits = d->StepSlots(slots, next);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    for (size_t i = 0; i < slots.size(); ++i) {
      expect(slots[i], logits->subspan(i * V, V), seqs[slots[i]]);
    }
  }

  // Adapters of a rank above max_lora_rank, or prompt logits the decoder
  // was not made for, are refused and leave the slot empty.
  auto small =
      std::move(GptDecoder::Create(base.model.get(), {.batch = 1, .max_lora_rank = 2}).value());
  EXPECT_TRUE(small->PrefillSlot(0, seqs[2], b->adapters.get()).status().IsInvalidArgument());
  EXPECT_TRUE(small->PrefillSlot(0, seqs[2], nullptr, [](int, int, std::span<const float>) {})
                  .status()
                  .IsInvalidArgument());
  EXPECT_EQ(small->position(0), 0);
  EXPECT_TRUE(small->PrefillSlot(0, seqs[2], a->adapters.get()).ok());
}

INSTANTIATE_TEST_SUITE_P(Twins, GptDecoderTest, ::testing::Values(-1, 0, 2), TwinName);

TEST(GptDecoderErrors, BadCallsAreErrorsThatChangeNothing) {
  const GptConfig config = TinyConfig();
  Model m(config, 0);
  const int maxT = config.max_position_embeddings;
  EXPECT_TRUE(GptDecoder::Create(m.model.get(), {.batch = 0}).status().IsInvalidArgument());
  EXPECT_TRUE(GptDecoder::Create(m.model.get(), {.batch = 1, .prefill_chunk = 0})
                  .status()
                  .IsInvalidArgument());
  auto d = std::move(GptDecoder::Create(m.model.get(), {.batch = 2}).value());

  EXPECT_TRUE(d->Step(std::vector<int32_t>{1, 2}).status().code() ==
              StatusCode::kFailedPrecondition);
  EXPECT_TRUE(d->Prefill({}).status().IsInvalidArgument());
  auto too_long = d->Prefill(std::vector<int32_t>(maxT + 1, 5));
  EXPECT_TRUE(IsInvalidArgumentNaming(too_long.status(), "Model.max_position_embeddings"));
  EXPECT_NE(too_long.status().message().find("25 tokens"), std::string::npos);
  EXPECT_TRUE(IsInvalidArgumentNaming(d->Prefill(std::vector<int32_t>{1, 37}).status(),
                                      "Model.vocab_size"));
  EXPECT_EQ(d->position(), 0);

  // A prompt of exactly the context fits; no step is left.
  ASSERT_TRUE(d->Prefill(std::vector<int32_t>(maxT, 5)).ok());
  EXPECT_EQ(d->position(), maxT);
  EXPECT_TRUE(IsInvalidArgumentNaming(d->Step(std::vector<int32_t>{1, 2}).status(),
                                      "Model.max_position_embeddings"));

  ASSERT_TRUE(d->Prefill(std::vector<int32_t>{4}).ok());
  EXPECT_TRUE(d->Step(std::vector<int32_t>{1}).status().IsInvalidArgument());  // one per sequence
  EXPECT_TRUE(
      IsInvalidArgumentNaming(d->Step(std::vector<int32_t>{1, -1}).status(), "Model.vocab_size"));
  EXPECT_EQ(d->position(), 1);
  EXPECT_TRUE(d->Step(std::vector<int32_t>{1, 2}).ok());
  EXPECT_EQ(d->position(), 2);
}

}  // namespace
}  // namespace fleet::trainer
