#include "worker/heter_protocol.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace fleet::heter {
namespace {

void ToProto(const MicroBatchId& id, pb::MicroBatchId* out) {
  out->set_worker_rank(id.worker_rank);
  out->set_mini_batch(id.mini_batch);
  out->set_micro_batch(id.micro_batch);
  out->set_micro_batches(id.micro_batches);
}

MicroBatchId FromProto(const pb::MicroBatchId& p) {
  return {p.worker_rank(), p.mini_batch(), p.micro_batch(), p.micro_batches()};
}

// Frame i as floats with exactly `count` elements.
Result<SArray<float>> FloatFrame(const Message& m, int i, size_t count, const char* what) {
  FLEET_ASSIGN_OR_RETURN(SArray<float> frame, m.Frame<float>(i));
  if (frame.size() != count) {
    return Status::InvalidArgument(
        absl::StrCat(what, " has ", frame.size(), " floats, expected ", count));
  }
  return frame;
}

}  // namespace

std::string DenseShape::ToString() const {
  return absl::StrCat(slots, " slots x ", embedding_dim, " + ", dense_features, " dense features");
}

std::string MicroBatchId::ToString() const {
  return absl::StrCat("micro-batch ", micro_batch, "/", micro_batches, " of worker ", worker_rank,
                      " step ", mini_batch);
}

Message EncodeTrainRequest(const TrainRequest& r, const DenseShape& shape) {
  CHECK_EQ(r.pooled.size(), shape.pooled_floats(r.batch()));
  CHECK_EQ(r.dense.size(), shape.dense_floats(r.batch()));
  pb::HeterTrainMeta meta;
  ToProto(r.id, meta.mutable_id());
  meta.set_num_workers(r.num_workers);
  meta.set_batch(static_cast<int32_t>(r.batch()));
  meta.set_slots(shape.slots);
  meta.set_embedding_dim(shape.embedding_dim);
  meta.set_dense_features(shape.dense_features);
  meta.set_dense_grad_scale(r.dense_grad_scale);
  meta.set_attempt(r.attempt);
  Message m;
  m.header.set_command(pb::HETER_TRAIN);
  m.header.set_table_id(-1);
  m.header.set_meta(meta.SerializeAsString());
  m.AddFrame(r.pooled);
  m.AddFrame(r.dense);
  m.AddFrame(r.labels);
  return m;
}

Result<TrainRequest> DecodeTrainRequest(const Message& m, const DenseShape& expected) {
  const std::string from =
      absl::StrCat("from ", m.header.sender().empty() ? "?" : m.header.sender());
  pb::HeterTrainMeta meta;
  if (m.header.command() != pb::HETER_TRAIN || !meta.ParseFromString(m.header.meta())) {
    return Status::InvalidArgument("not a heter train request (metadata does not parse)", from);
  }
  TrainRequest r;
  r.id = FromProto(meta.id());
  r.num_workers = meta.num_workers();
  r.dense_grad_scale = meta.dense_grad_scale();
  r.attempt = meta.attempt();
  const std::string which = absl::StrCat(r.id.ToString(), " ", from);
  const MicroBatchId& id = r.id;
  if (r.num_workers < 1 || id.worker_rank < 0 || id.worker_rank >= r.num_workers ||
      id.micro_batches < 1 || id.micro_batch < 0 || id.micro_batch >= id.micro_batches ||
      id.mini_batch < 0 || r.attempt < 0) {
    return Status::InvalidArgument(
        absl::StrCat("unknown micro-batch id: worker ", id.worker_rank, " of ", r.num_workers,
                     ", micro-batch ", id.micro_batch, " of ", id.micro_batches, ", step ",
                     id.mini_batch, ", attempt ", r.attempt),
        from);
  }
  const DenseShape declared{meta.slots(), meta.embedding_dim(), meta.dense_features()};
  if (!(declared == expected)) {
    return Status::InvalidArgument(
        absl::StrCat("the CPU worker's dense section has ", declared.ToString(),
                     " but this heter worker's model has ", expected.ToString(),
                     ": both must read the same job config"),
        which);
  }
  if (meta.batch() < 0) {
    return Status::InvalidArgument(absl::StrCat("batch of ", meta.batch(), " samples"), which);
  }
  if (!std::isfinite(r.dense_grad_scale) || r.dense_grad_scale < 0) {
    return Status::InvalidArgument(absl::StrCat("dense_grad_scale ", r.dense_grad_scale), which);
  }
  if (m.header.frames_size() != 3) {
    return Status::InvalidArgument(absl::StrCat("carries ", m.header.frames_size(),
                                                " frames, expected 3 (pooled, dense, labels)"),
                                   which);
  }
  const int64_t B = meta.batch();
  auto pooled = FloatFrame(m, 0, expected.pooled_floats(B), "pooled embeddings");
  if (!pooled.ok()) return pooled.status().WithContext(which);
  auto dense = FloatFrame(m, 1, expected.dense_floats(B), "dense features");
  if (!dense.ok()) return dense.status().WithContext(which);
  auto labels = FloatFrame(m, 2, static_cast<size_t>(B), "labels");
  if (!labels.ok()) return labels.status().WithContext(which);
  for (size_t i = 0; i < pooled->size(); ++i) {
    if (!std::isfinite((*pooled)[i])) {
      return Status::InvalidArgument(
          absl::StrCat("non-finite pooled embedding at slot ", i / (B * expected.embedding_dim),
                       ", sample ", (i / expected.embedding_dim) % B),
          which);
    }
  }
  r.pooled = std::move(pooled).value();
  r.dense = std::move(dense).value();
  r.labels = std::move(labels).value();
  return r;
}

Message EncodeTrainReply(const TrainReply& reply) {
  pb::HeterReplyMeta meta;
  ToProto(reply.id, meta.mutable_id());
  meta.set_batch(static_cast<int32_t>(reply.probs.size()));
  meta.set_loss(reply.loss);
  Message m;
  m.header.set_meta(meta.SerializeAsString());
  m.AddFrame(reply.pooled_grad);
  m.AddFrame(reply.probs);
  return m;
}

Message EncodeFailureReply(const MicroBatchId& id, const Status& why) {
  CHECK(!why.ok());
  pb::HeterReplyMeta meta;
  ToProto(id, meta.mutable_id());
  meta.set_error_code(static_cast<int32_t>(why.code()));
  meta.set_error_message(why.message());
  Message m;
  m.header.set_meta(meta.SerializeAsString());
  return m;
}

Status ReplyFailure(const Message& reply) {
  pb::HeterReplyMeta meta;
  if (!meta.ParseFromString(reply.header.meta()) || meta.error_code() == 0) return Status::OK();
  return Status::FromWire(meta.error_code(), meta.error_message());
}

Result<TrainReply> DecodeTrainReply(const Message& m, const TrainRequest& request,
                                    std::string_view from) {
  const std::string which =
      absl::StrCat("reply of ", std::string(from), " to ", request.id.ToString());
  pb::HeterReplyMeta meta;
  if (!meta.ParseFromString(m.header.meta())) {
    return Status::InvalidArgument("metadata does not parse", which);
  }
  if (meta.error_code() != 0) {
    return Status::FromWire(meta.error_code(), meta.error_message()).WithContext(std::string(from));
  }
  TrainReply reply;
  reply.id = FromProto(meta.id());
  reply.loss = meta.loss();
  if (!(reply.id == request.id)) {
    return Status::InvalidArgument(
        absl::StrCat("answers unknown ", reply.id.ToString(), " instead"), which);
  }
  if (meta.batch() != request.batch()) {
    return Status::InvalidArgument(
        absl::StrCat("is for ", meta.batch(), " samples, the micro-batch has ", request.batch()),
        which);
  }
  if (!std::isfinite(reply.loss)) {
    return Status::InvalidArgument(absl::StrCat("loss is ", reply.loss), which);
  }
  if (m.header.frames_size() != 2) {
    return Status::InvalidArgument(absl::StrCat("carries ", m.header.frames_size(),
                                                " frames, expected 2 (pooled_grad, probs)"),
                                   which);
  }
  auto grad = FloatFrame(m, 0, request.pooled.size(), "pooled_grad");
  if (!grad.ok()) return grad.status().WithContext(which);
  auto probs = FloatFrame(m, 1, request.labels.size(), "probs");
  if (!probs.ok()) return probs.status().WithContext(which);
  reply.pooled_grad = std::move(grad).value();
  reply.probs = std::move(probs).value();
  return reply;
}

}  // namespace fleet::heter
