// GptTensorParallel: Megatron-LM's tensor (model) parallelism of GptModel
// (Shoeybi et al. 2019) over a group of M ranks that see the same tokens.
//
// What rank r of M holds (its arena's table, ShardTable(), same names as
// GptParamTable with the shard's shapes):
//   wte        rows [r Vs, r Vs + rows_r) of [V, C], Vs = ceil(V / M) (the
//              last rank may hold fewer rows: no padding rows exist)
//   qkv        the q, k and v rows of heads [r NH/M, (r+1) NH/M): [3 C/M, C]
//              laid out [q | k | v] as AttentionForward wants, and their bias
//   proj       the input columns of those heads: [C, C/M]; bias whole
//   fc         rows [r F/M, (r+1) F/M) of [F, C] and of its bias
//   mlp.proj   the matching input columns: [C, F/M]; bias whole
//   wpe, the LayerNorms, ln_f   whole
//
// The passes (GptModel does them when given a context):
//   embedding  each rank looks up the tokens in its rows (others give 0),
//              the lead rank adds wpe; all-reduce (sum).
//   block      ln_1 (whole) -> qkv (column parallel, no communication) ->
//              attention over this rank's heads -> proj (row parallel:
//              partial sums, the lead rank adding the residual and the
//              bias once, all-reduce). The MLP likewise (fc column
//              parallel, GELU, mlp.proj row parallel, all-reduce).
//   head       logits [N, rows_r] against this rank's wte rows (tied); the
//              cross-entropy all-reduces the row max, then the sum of
//              exponentials and the target's logit: the logits are never
//              gathered.
//   backward   the conjugates: the input gradient of each column-parallel
//              GEMM (qkv, fc, the head) is all-reduced before the
//              LayerNorm's backward; row-parallel layers pass the residual
//              gradient on unchanged.
// Replicated parameters get identical gradients on every rank (they see the
// same inputs), so data-parallel reductions of them never involve this
// group. split() maps every rank's arena onto the whole table: checkpoints
// are written and read in the whole layout, so they load under any degree.
//
// Errors: the first failed collective call is kept (status()); later calls
// do nothing, so a pass finishes with garbage and the caller reports the
// status (GptModel::comm_status()).
//
// Thread safety: used by the one thread that drives the model.
#pragma once

#include <cstddef>
#include <memory>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/models/gpt.h"
#include "trainer/param_split.h"

namespace fleet::trainer {

class GptTensorParallel {
 public:
  // `group` (not owned, outlives this; null for degree 1) is the
  // model-parallel group: its size is the degree M, its rank this rank's
  // index. InvalidArgument naming Distributed.mp_degree when M does not
  // divide the heads or the MLP width, or exceeds the vocabulary.
  // `stage` (null: the whole model): the pipeline stage whose tensors the
  // ranks split (GptStage).
  static Result<std::unique_ptr<GptTensorParallel>> Create(const GptConfig& config,
                                                           Collective* group,
                                                           const GptStage* stage = nullptr);

  int degree() const { return degree_; }
  int rank() const { return rank_; }
  // The lead rank adds what must be added once: wpe, the row-parallel biases
  // and the residual.
  bool lead() const { return rank_ == 0; }
  int heads() const;            // NH / M
  int attention_width() const;  // C / M: q, k, v and the attention output per rank
  int ffn() const;              // F / M
  int vocab_begin() const { return vocab_begin_; }
  int vocab_rows() const { return vocab_rows_; }
  // This stage's split over the group (the whole model's without stages).
  const ParamSplit& split() const { return split_; }
  const GptStage& stage() const { return stage_; }
  ParamTable ShardTable() const;

  // In place over the group, device memory (no-ops after a failure).
  void AllReduceSum(float* data, size_t n) { AllReduce(data, n, ReduceOp::kSum); }
  void AllReduceMax(float* data, size_t n) { AllReduce(data, n, ReduceOp::kMax); }
  const Status& status() const { return status_; }

 private:
  GptTensorParallel(const GptConfig& config, Collective* group, const GptStage& stage);
  void AllReduce(float* data, size_t n, ReduceOp op);

  const GptConfig config_;
  Collective* const group_;
  const int degree_, rank_;
  const GptStage stage_;
  int vocab_begin_ = 0, vocab_rows_ = 0;
  ParamSplit split_;
  Status status_;
};

// The shard of `config` rank `rank` of `degree` holds (the shapes of
// ShardTable and the segments of its ParamSplit), for planning. REQUIRES:
// a degree Create accepts.
ParamSplit GptParamSplit(const GptConfig& config, int degree, int rank);

// The parts of a model split over pipeline stages and, within each, over
// tensor-parallel ranks: part r = stage r / mp_degree, tensor-parallel rank
// r mod mp_degree (the rank in the model group of pp x mp ranks). Each
// tensor of the whole table is owned by exactly one part (its other copies,
// the tensor-parallel ranks' replicated tensors and the last stage's wte,
// are marked replicated): what checkpoints gather and the clipping norm
// counts. `group` is left null for the caller to set. REQUIRES: degrees
// GptPipelineStage and Create accept.
ParamSplit GptModelSplit(const GptConfig& config, int mp_degree, int pp_degree, int rank);

}  // namespace fleet::trainer
