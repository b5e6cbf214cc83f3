// The CPU worker <-> heter worker messages (worker/heter.proto) as C++
// values, and the checks each side makes on what it receives.
//
// Who owns which buffer:
//  * Request, CPU worker side: the worker allocates pooled, dense and labels
//    (SArrays) for each micro-batch and keeps them until that micro-batch's
//    reply was accepted, because a resend needs them. EncodeTrainRequest
//    shares them with the message (no copy) and ZeroMQ keeps a reference
//    until its bytes are sent, which may be after a call failed: once
//    encoded, they must not be written again.
//  * Request, heter worker side: DecodeTrainRequest returns views of the
//    received frames (no copy unless ZeroMQ handed them over misaligned, see
//    Message::Frame); they live while the TrainRequest does. The dense
//    section copies them into its own (device) buffers.
//  * Reply: the heter worker allocates pooled_grad and probs per micro-batch
//    and hands them to the transport (no copy). DecodeTrainReply returns
//    views of the received frames, valid while the TrainReply lives.
//
// Thread safety: plain functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "comm/message.h"
#include "worker/heter.pb.h"
#include "comm/sarray.h"
#include "comm/status.h"

namespace fleet::heter {

// The widths of the dense section's inputs; both sides derive them from the
// same job config and the heter worker refuses micro-batches of another shape.
struct DenseShape {
  int slots = 0;           // S: pooled sparse slots
  int embedding_dim = 0;   // D: floats per pooled slot (the sparse table's pull dim)
  int dense_features = 0;  // F

  size_t pooled_floats(int64_t batch) const {
    return static_cast<size_t>(batch) * slots * embedding_dim;
  }
  size_t dense_floats(int64_t batch) const { return static_cast<size_t>(batch) * dense_features; }
  bool operator==(const DenseShape&) const = default;
  // "26 slots x 9 + 13 dense features"
  std::string ToString() const;
};

struct MicroBatchId {
  int worker_rank = 0;
  int64_t mini_batch = 0;
  int micro_batch = 0;
  int micro_batches = 1;

  bool operator==(const MicroBatchId&) const = default;
  // "micro-batch 1/4 of worker 3 step 17"
  std::string ToString() const;
  // Sync mode: which of the step's contributions to the dense table this
  // micro-batch's is, in the order the servers sum them (worker, then
  // micro-batch), and how many a step has.
  int contributor() const { return worker_rank * micro_batches + micro_batch; }
  int contributors(int num_workers) const { return num_workers * micro_batches; }
};

struct TrainRequest {
  MicroBatchId id;
  int num_workers = 1;
  float dense_grad_scale = 1.0f;
  int attempt = 0;
  SArray<float> pooled;  // [S][B][D]
  SArray<float> dense;   // [B][F]
  SArray<float> labels;  // [B], in [0, 1]

  int64_t batch() const { return static_cast<int64_t>(labels.size()); }
};

struct TrainReply {
  MicroBatchId id;
  float loss = 0.0f;          // mean over the micro-batch
  SArray<float> pooled_grad;  // [S][B][D]
  SArray<float> probs;        // [B]
};

// Builds the HETER_TRAIN request. REQUIRES: the arrays have the sizes of
// `shape` for labels.size() samples (the CPU worker made them so).
Message EncodeTrainRequest(const TrainRequest& request, const DenseShape& shape);

// Heter worker side. InvalidArgument, naming the sender and the micro-batch,
// when: the meta does not parse; an id is out of range (worker rank not in
// [0, num_workers), micro-batch not in [0, micro_batches), a negative step);
// the declared shape differs from `expected` (the message says both); the
// frames are not three float arrays of S*B*D, B*F and B floats (B >= 0);
// dense_grad_scale is negative or not finite; a pooled value is not finite.
// (Labels and dense features are checked by the model, which refuses
// labels outside [0, 1] and non-finite features.)
Result<TrainRequest> DecodeTrainRequest(const Message& message, const DenseShape& expected);

// Builds the reply. REQUIRES: pooled_grad and probs sized for the request.
Message EncodeTrainReply(const TrainReply& reply);
// A reply saying the heter worker's own work for `id` (or a flush) failed
// with `why` (HeterReplyMeta.error_code): an answer, never resent.
// REQUIRES: !why.ok().
Message EncodeFailureReply(const MicroBatchId& id, const Status& why);
// The failure a HETER_TRAIN / HETER_FLUSH reply carries (OK when none, or
// when its meta does not parse: DecodeTrainReply then says so).
Status ReplyFailure(const Message& reply);

// CPU worker side: checks that `message` answers `request`: the same
// micro-batch id and batch, pooled_grad of request.pooled.size() floats and
// probs of B floats, a finite loss. InvalidArgument naming `from` (the heter
// worker) and both ids otherwise; the failure it carries (ReplyFailure),
// with `from`, when it carries one.
Result<TrainReply> DecodeTrainReply(const Message& message, const TrainRequest& request,
                                    std::string_view from);

}  // namespace fleet::heter
