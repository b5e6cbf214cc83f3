// Pipeline parallelism for GPT (Distributed.pp_degree): Megatron-LM's
// non-interleaved 1F1B schedule (Narayanan et al. 2021, "Efficient
// Large-Scale Language Model Training on GPU Clusters", section 2.2.1).
//
// The model's blocks are cut into P stages of L / P consecutive blocks
// (GptStage; the first also holds the embeddings, the last ln_f and the
// head with its own copy of the tied wte). A step's batch is cut into m
// micro-batches (Engine.accumulate_steps). Stage s runs
//   warmup    min(P - s - 1, m) forwards,
//   steady    one forward and one backward in turn,
//   cooldown  the remaining backwards,
// so it holds the activations of at most min(P - s, m) micro-batches
// (PipelineSlots), and each stage idles for (P - 1) / (m + P - 1) of the
// step (PipelineBubble: the fill and drain).
//
// Point to point over the collective layer. Neighbouring stages share a
// 2-rank group (parallel_groups.h "pipe" links; the lower stage is rank
// 0). PipeLink::Exchange moves up to two payloads over it: the lower
// stage's (an activation going up) as a Broadcast from rank 0, then the
// upper stage's (a gradient going down) as a Broadcast from rank 1; over a
// group of two a broadcast is a send and a receive, so any Collective
// (shared memory, Gloo, NCCL) carries the pipeline without new operations.
// OneFOneB's steps pair a send with the opposite receive as Megatron's
// send_forward_recv_backward / send_backward_recv_forward do, and both
// sides of a link list the same exchanges in the same order (what the
// schedule's tests check), so the blocking broadcasts never wait in a
// cycle.
//
// The tied embedding. The first stage's wte (input embedding) and the last
// stage's copy (output head) start equal; after the step's backwards the
// two stages sum their wte gradients over their "embed" group (Megatron's
// embedding group), so both apply the same update and stay equal.
//
// Ownership: a GptPipeline borrows its model and groups, which outlive it.
// Thread safety: one thread drives a pipeline.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/models/gpt.h"

namespace fleet::trainer::collective {

// What one step of a stage's schedule does. `act` names the micro-batch
// whose activation is computed (kForward) or moves; `grad` the one whose
// gradient is computed (kBackward) or moves; -1 when the step has none.
enum class PipeOp {
  kForward,
  kBackward,
  kRecvAct,          // from the previous stage
  kSendAct,          // to the next stage
  kSendActRecvGrad,  // with the next stage: act up, grad down
  kSendGradRecvAct,  // with the previous stage: act up, grad down
  kRecvGrad,         // from the next stage
  kSendGrad,         // to the previous stage
};
struct PipeStep {
  PipeOp op;
  int act = -1;
  int grad = -1;
  bool operator==(const PipeStep&) const = default;
};

// Stage `stage` of `stages`' steps for `micro_batches` micro-batches, as
// described at the top. REQUIRES: 0 <= stage < stages, micro_batches >= 1.
std::vector<PipeStep> OneFOneB(int stages, int stage, int micro_batches);
// Micro-batches whose activations stage `stage` holds at once at most.
int PipelineSlots(int stages, int stage, int micro_batches);
// The fraction of a step each stage idles: (P - 1) / (m + P - 1).
double PipelineBubble(int stages, int micro_batches);

// One end of the link between two neighbouring stages (a 2-rank group,
// the lower stage rank 0; not owned, outlives this).
class PipeLink {
 public:
  explicit PipeLink(Collective* group);

  bool lower() const { return group_->rank() == 0; }
  // Moves `up` (n_up floats, the lower stage's to the upper's) and then
  // `down` (n_down floats, the upper's to the lower's); on each side the
  // buffer is what it sends or where it receives. A count of 0 moves
  // nothing; both sides must pass the same counts. Blocks for the
  // broadcasts (the group's timeout); their errors, naming `what`.
  Status Exchange(float* up, size_t n_up, float* down, size_t n_down, const char* what);
  // Bytes this end sent so far.
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  Collective* const group_;
  int64_t bytes_sent_ = 0;
};

struct GptPipelineOptions {
  int stages = 1;  // Distributed.pp_degree
  int stage = 0;   // this rank's
  // Micro-batches a training step's batch is cut into (Engine.accumulate_steps).
  int micro_batches = 1;
  // parallel_groups.h's links (null on the first / last stage) and the
  // first and last stage's group (null on the other stages).
  Collective* prev = nullptr;
  Collective* next = nullptr;
  Collective* embedding = nullptr;
};

class GptPipeline {
 public:
  // `model` is stage options.stage's (GptModel::Create with its GptStage);
  // the pipeline sets its activation slots. InvalidArgument for a model of
  // another stage or links missing where the stage needs them.
  static Result<std::unique_ptr<GptPipeline>> Create(GptModel* model,
                                                     const GptPipelineOptions& options);

  // One training step over a batch of B sequences of T tokens (every stage
  // passes the same tokens, targets and streams; only the first reads the
  // tokens and the last the targets): the 1F1B schedule over its
  // micro_batches parts. ADDS options.grad_scale times the gradient of the
  // mean of the micro-batches' losses to the model's gradients; calls
  // grad_ready as tensors become final during the last micro-batch's
  // backward (wte once summed between the first and last stage). Returns
  // that mean loss on every stage. InvalidArgument when micro_batches does
  // not divide B, or the model's; the links' errors.
  Result<float> Train(std::span<const int32_t> tokens, std::span<const int32_t> targets, int B,
                      int T, const GptForwardOptions& options, const GradReadyFn& grad_ready);
  // The mean loss of a batch, forward only, on every stage.
  Result<float> Evaluate(std::span<const int32_t> tokens, std::span<const int32_t> targets, int B,
                         int T);

  // Bytes this stage sent to its neighbours so far (activations,
  // gradients, losses; not the embedding group's sum).
  int64_t bytes_sent() const;
  const GptPipelineOptions& options() const { return options_; }

 private:
  GptPipeline(GptModel* model, const GptPipelineOptions& options);
  bool first() const { return options_.stage == 0; }
  bool last() const { return options_.stage == options_.stages - 1; }
  // The last stage's loss to every stage, down the links.
  Status ShareLoss(float* loss);
  // Sums wte's gradient with the other end of the embedding group.
  Status SumEmbeddingGrad();

  GptModel* const model_;
  const GptPipelineOptions options_;
  std::unique_ptr<PipeLink> prev_, next_;
};

}  // namespace fleet::trainer::collective
