// ParamUseHooks: lets a model's parameters live somewhere else between uses
// (ZeRO stage 3: each rank keeps only its shard and gathers a unit's full
// parameters just before the model reads them). The model knows nothing of
// where they live; it only says when it needs which tensors.
//
// A model that supports it cuts its ParamTable into units: consecutive
// ranges of whole tensors, e.g. GptModel's embeddings, each transformer
// block, and the final LayerNorm (GptModel::ParamUnits). Around every use of
// a unit's parameters it calls
//   Acquire(unit, next)  the unit's parameters must be in the arena when this
//                        returns; `next` is the unit the model will acquire
//                        after this one (empty when none or unknown), so the
//                        parameters can be fetched while this unit computes;
//   Release(unit)        the model will not read the unit's parameters again
//                        until it acquires it anew; they may be dropped.
// Gradients are reported as before (GradReadyFn). Every rank's model calls
// the hooks in the same order (same model, same calls), which is what lets an
// implementation issue collective calls from them.
//
// Errors: the hooks cannot fail the model's pass. An implementation that
// cannot provide the parameters (a failed collective call) records the error
// and reports it at its next fallible call (e.g. the optimizer step); the
// pass then computes on whatever the arena held.
//
// Thread safety: called from the thread that drives the model.
#pragma once

#include <cstddef>

namespace fleet::trainer {

// Tensors [first, end) of a ParamTable; empty when first == end.
struct TensorRange {
  size_t first = 0;
  size_t end = 0;
  bool empty() const { return first == end; }
};

class ParamUseHooks {
 public:
  virtual ~ParamUseHooks() = default;
  virtual void Acquire(TensorRange unit, TensorRange next) = 0;
  virtual void Release(TensorRange unit) = 0;
};

}  // namespace fleet::trainer
