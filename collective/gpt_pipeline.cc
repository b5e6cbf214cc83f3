#include "collective/gpt_pipeline.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fleet::trainer::collective {

std::vector<PipeStep> OneFOneB(int stages, int stage, int micro_batches) {
  CHECK(stage >= 0 && stage < stages && micro_batches >= 1) << stage << " of " << stages;
  const bool first = stage == 0, last = stage == stages - 1;
  const int m = micro_batches;
  const int warmup = std::min(stages - stage - 1, m);
  const int steady = m - warmup;
  std::vector<PipeStep> steps;
  for (int i = 0; i < warmup; ++i) {
    if (!first) steps.push_back({PipeOp::kRecvAct, i});
    steps.push_back({PipeOp::kForward, i});
    if (!last) steps.push_back({PipeOp::kSendAct, i});
  }
  if (steady > 0 && !first) steps.push_back({PipeOp::kRecvAct, warmup});
  for (int i = 0; i < steady; ++i) {
    steps.push_back({PipeOp::kForward, warmup + i});
    if (!last) steps.push_back({PipeOp::kSendActRecvGrad, warmup + i, i});
    steps.push_back({PipeOp::kBackward, -1, i});
    if (first) continue;
    if (i == steady - 1) {
      steps.push_back({PipeOp::kSendGrad, -1, i});
    } else {
      steps.push_back({PipeOp::kSendGradRecvAct, warmup + i + 1, i});
    }
  }
  for (int i = steady; i < m; ++i) {
    if (!last) steps.push_back({PipeOp::kRecvGrad, -1, i});
    steps.push_back({PipeOp::kBackward, -1, i});
    if (!first) steps.push_back({PipeOp::kSendGrad, -1, i});
  }
  return steps;
}

int PipelineSlots(int stages, int stage, int micro_batches) {
  return std::min(stages - stage, micro_batches);
}

double PipelineBubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

PipeLink::PipeLink(Collective* group) : group_(group) {
  CHECK(group != nullptr && group->size() == 2) << "a pipeline link is a group of 2";
}

Status PipeLink::Exchange(float* up, size_t n_up, float* down, size_t n_down, const char* what) {
  // Over two ranks a broadcast is a send and a receive: the root's buffer
  // is read, the other's written.
  if (n_up > 0) {
    FLEET_RETURN_IF_ERROR(
        group_->Broadcast(up, n_up, 0)
            .WithContext(absl::StrCat("pipeline: ", what, " (to the next stage)")));
    if (lower()) bytes_sent_ += static_cast<int64_t>(n_up * sizeof(float));
  }
  if (n_down > 0) {
    FLEET_RETURN_IF_ERROR(
        group_->Broadcast(down, n_down, 1)
            .WithContext(absl::StrCat("pipeline: ", what, " (to the previous stage)")));
    if (!lower()) bytes_sent_ += static_cast<int64_t>(n_down * sizeof(float));
  }
  return Status::OK();
}

Result<std::unique_ptr<GptPipeline>> GptPipeline::Create(GptModel* model,
                                                         const GptPipelineOptions& options) {
  CHECK(model != nullptr);
  const int P = options.stages, s = options.stage;
  if (P < 1 || s < 0 || s >= P || options.micro_batches < 1) {
    return Status::InvalidArgument(
        absl::StrCat("stage ", s, " of ", P, " with ", options.micro_batches, " micro-batches"),
        "Distributed.pp_degree");
  }
  FLEET_ASSIGN_OR_RETURN(GptStage stage, GptPipelineStage(model->config(), P, s));
  if (!(model->stage() == stage)) {
    return Status::InvalidArgument(absl::StrCat("the model is not stage ", s, " of ", P),
                                   "Distributed.pp_degree");
  }
  const bool ends = P > 1 && (s == 0 || s == P - 1);
  auto pair = [](Collective* g) { return g != nullptr && g->size() == 2; };
  if ((s > 0) != pair(options.prev) || (s < P - 1) != pair(options.next) ||
      ends != pair(options.embedding)) {
    return Status::InvalidArgument(
        absl::StrCat("stage ", s, " of ", P,
                     " needs 2-rank links to exactly its neighbours and, on the first and last "
                     "stage, the group of the two"),
        "Distributed.pp_degree");
  }
  model->set_activation_slots(PipelineSlots(P, s, options.micro_batches));
  return std::unique_ptr<GptPipeline>(new GptPipeline(model, options));
}

GptPipeline::GptPipeline(GptModel* model, const GptPipelineOptions& options)
    : model_(model), options_(options) {
  if (options.prev != nullptr) prev_ = std::make_unique<PipeLink>(options.prev);
  if (options.next != nullptr) next_ = std::make_unique<PipeLink>(options.next);
}

int64_t GptPipeline::bytes_sent() const {
  return (prev_ ? prev_->bytes_sent() : 0) + (next_ ? next_->bytes_sent() : 0);
}

Result<float> GptPipeline::Train(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                                 int B, int T, const GptForwardOptions& options,
                                 const GradReadyFn& grad_ready) {
  const int m = options_.micro_batches;
  if (B < 1 || B % m != 0) {
    return Status::InvalidArgument(absl::StrCat(m, " micro-batches do not divide the batch of ", B),
                                   "Engine.accumulate_steps");
  }
  const int micro = B / m;
  const size_t ids = size_t(micro) * T;
  if (tokens.size() != size_t(B) * T || targets.size() != tokens.size() ||
      (!options.dropout_streams.empty() && options.dropout_streams.size() != size_t(B))) {
    return Status::InvalidArgument(absl::StrCat("a batch of ", B, " x ", T, " got ", tokens.size(),
                                                " tokens, ", targets.size(), " targets and ",
                                                options.dropout_streams.size(), " streams"));
  }
  model_->PrepareActivations(micro, T);
  const size_t n = ids * model_->config().hidden_size;  // floats of one activation
  const int slots = model_->activation_slots();
  // wte's gradient is final only once summed with the other end's.
  const int wte = options_.embedding != nullptr ? model_->wte_index() : -1;
  const GradReadyFn last_ready = [&](size_t first, size_t end) {
    if (!grad_ready) return;
    if (wte < 0 || size_t(wte) < first || size_t(wte) >= end) return grad_ready(first, end);
    if (first < size_t(wte)) grad_ready(first, wte);
    if (size_t(wte) + 1 < end) grad_ready(wte + 1, end);
  };
  GptForwardOptions pass = options;
  pass.grad_scale = options.grad_scale / static_cast<float>(m);
  std::vector<float> losses(m, 0.0f);
  for (const PipeStep& step : OneFOneB(options_.stages, options_.stage, m)) {
    const int a = step.act, g = step.grad;
    switch (step.op) {
      case PipeOp::kForward: {
        pass.slot = a % slots;
        if (!options.dropout_streams.empty()) {
          pass.dropout_streams = options.dropout_streams.subspan(size_t(a) * micro, micro);
        }
        FLEET_ASSIGN_OR_RETURN(
            losses[a], model_->Forward(tokens.subspan(a * ids, ids), targets.subspan(a * ids, ids),
                                       micro, T, pass));
        break;
      }
      case PipeOp::kBackward:
        model_->Backward(g == m - 1 ? last_ready : GradReadyFn{}, g % slots);
        FLEET_RETURN_IF_ERROR(model_->comm_status());
        break;
      case PipeOp::kRecvAct:
        FLEET_RETURN_IF_ERROR(
            prev_->Exchange(model_->StageInput(a % slots), n, nullptr, 0, "activations"));
        break;
      case PipeOp::kSendAct:
        FLEET_RETURN_IF_ERROR(
            next_->Exchange(model_->StageOutput(a % slots), n, nullptr, 0, "activations"));
        break;
      case PipeOp::kSendActRecvGrad:
        FLEET_RETURN_IF_ERROR(next_->Exchange(model_->StageOutput(a % slots), n,
                                              model_->OutputGrad(), n,
                                              "activations and gradients"));
        break;
      case PipeOp::kSendGradRecvAct:
        FLEET_RETURN_IF_ERROR(prev_->Exchange(model_->StageInput(a % slots), n, model_->InputGrad(),
                                              n, "activations and gradients"));
        break;
      case PipeOp::kRecvGrad:
        FLEET_RETURN_IF_ERROR(next_->Exchange(nullptr, 0, model_->OutputGrad(), n, "gradients"));
        break;
      case PipeOp::kSendGrad:
        FLEET_RETURN_IF_ERROR(prev_->Exchange(nullptr, 0, model_->InputGrad(), n, "gradients"));
        break;
    }
  }
  if (wte >= 0) {
    FLEET_RETURN_IF_ERROR(SumEmbeddingGrad());
    if (grad_ready) grad_ready(wte, wte + 1);
  }
  float loss = 0.0f;
  for (float l : losses) loss += l / static_cast<float>(m);
  FLEET_RETURN_IF_ERROR(ShareLoss(&loss));
  return loss;
}

Result<float> GptPipeline::Evaluate(std::span<const int32_t> tokens,
                                    std::span<const int32_t> targets, int B, int T) {
  model_->PrepareActivations(B, T);
  const size_t n = size_t(B) * T * model_->config().hidden_size;
  if (!first()) {
    FLEET_RETURN_IF_ERROR(prev_->Exchange(model_->StageInput(0), n, nullptr, 0, "activations"));
  }
  GptForwardOptions pass;
  pass.for_backward = false;
  FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(tokens, targets, B, T, pass));
  if (!last()) {
    FLEET_RETURN_IF_ERROR(next_->Exchange(model_->StageOutput(0), n, nullptr, 0, "activations"));
  }
  FLEET_RETURN_IF_ERROR(ShareLoss(&loss));
  return loss;
}

Status GptPipeline::ShareLoss(float* loss) {
  // Down the pipeline: from the stage above, then to the stage below.
  if (!last()) FLEET_RETURN_IF_ERROR(next_->Exchange(nullptr, 0, loss, 1, "the loss"));
  if (!first()) FLEET_RETURN_IF_ERROR(prev_->Exchange(nullptr, 0, loss, 1, "the loss"));
  return Status::OK();
}

Status GptPipeline::SumEmbeddingGrad() {
  ParamArena& arena = model_->arena();
  const int wte = model_->wte_index();
  const size_t begin = arena.offset(wte), end = arena.offset(wte + 1);
  return options_.embedding->AllReduce(arena.grads().data() + begin, end - begin, ReduceOp::kSum)
      .WithContext("pipeline: summing wte's gradient between the first and last stage");
}

}  // namespace fleet::trainer::collective
