#include "trainer/models/gpt_tensor_parallel.h"

#include <glog/logging.h>

#include <string>

namespace fleet::trainer {

namespace {

// Rows [begin, begin + rows) of the vocabulary on rank r of M.
std::pair<int, int> VocabRange(int V, int M, int r) {
  const int per = (V + M - 1) / M;
  const int begin = std::min(V, r * per);
  return {begin, std::min(V, begin + per) - begin};
}

// Walks a stage's tensors once for rank r of M: the shard's table and its
// segments. A tensor every rank of the tensor-parallel group holds whole is
// owned by rank 0 (the others' copies are marked replicated), and the
// head's wte copy by the first stage.
void BuildShard(const GptConfig& c, int M, int r, const GptStage& stage, ParamTable* table,
                std::vector<ArenaSegment>* segments, size_t* local_size) {
  const size_t C = c.hidden_size, F = c.ffn();
  const size_t Cl = C / M, Fl = F / M;
  const auto [v_begin, v_rows] = VocabRange(c.vocab_size, M, r);
  size_t local = 0, whole = 0;
  auto add = [&](size_t whole_offset, size_t size, bool replicated) {
    segments->push_back({local, whole + whole_offset, size, replicated});
    local += size;
  };
  auto copy_of_wte = [&](GptTensor t, int layer) {
    return t == GptTensor::kWte && layer < 0 && stage.wte_copy() && !table->empty();
  };
  ForEachStageTensor(
      c, stage,
      [&](GptTensor t, int layer, int64_t rows, int64_t cols, size_t, size_t whole_offset) {
        const size_t numel = static_cast<size_t>(rows * (cols ? cols : 1));
        Shape shape = cols ? Shape{rows, cols} : Shape{rows};
        whole = whole_offset;
        switch (t) {
          case GptTensor::kWte:
            shape = Shape{v_rows, int64_t(C)};
            add(size_t(v_begin) * C, size_t(v_rows) * C, copy_of_wte(t, layer));
            break;
          case GptTensor::kQkvW:
          case GptTensor::kQkvB: {
            // q, k and v of this rank's heads: three runs of rows.
            const size_t width = t == GptTensor::kQkvW ? C : 1;
            shape =
                t == GptTensor::kQkvW ? Shape{int64_t(3 * Cl), int64_t(C)} : Shape{int64_t(3 * Cl)};
            for (size_t part = 0; part < 3; ++part)
              add((part * C + r * Cl) * width, Cl * width, false);
            break;
          }
          case GptTensor::kProjW:
          case GptTensor::kFcProjW: {
            // Row parallel: this rank's input columns, a run per output row.
            const size_t in = t == GptTensor::kProjW ? C : F, in_local = in / M;
            shape = Shape{int64_t(C), int64_t(in_local)};
            for (size_t row = 0; row < C; ++row) add(row * in + r * in_local, in_local, false);
            break;
          }
          case GptTensor::kFcW:
          case GptTensor::kFcB: {
            const size_t width = t == GptTensor::kFcW ? C : 1;
            shape = t == GptTensor::kFcW ? Shape{int64_t(Fl), int64_t(C)} : Shape{int64_t(Fl)};
            add(r * Fl * width, Fl * width, false);
            break;
          }
          default:
            add(0, numel, r != 0);
            break;
        }
        table->push_back({GptTensorName(t, layer), shape});
      });
  *local_size = local;
}

}  // namespace

ParamSplit GptParamSplit(const GptConfig& config, int degree, int rank) {
  return GptModelSplit(config, degree, 1, rank);
}

ParamSplit GptModelSplit(const GptConfig& config, int mp_degree, int pp_degree, int rank) {
  ParamSplit split;
  split.rank = rank;
  split.degree = mp_degree * pp_degree;
  split.whole_table = GptParamTable(config);
  split.whole_size = static_cast<size_t>(GptParamCount(config));
  split.segments.resize(split.degree);
  split.local_size.resize(split.degree);
  for (int r = 0; r < split.degree; ++r) {
    Result<GptStage> stage = GptPipelineStage(config, pp_degree, r / mp_degree);
    CHECK(stage.ok()) << stage.status().ToString();
    ParamTable table;
    BuildShard(config, mp_degree, r % mp_degree, *stage, &table, &split.segments[r],
               &split.local_size[r]);
  }
  return split;
}

Result<std::unique_ptr<GptTensorParallel>> GptTensorParallel::Create(const GptConfig& config,
                                                                     Collective* group,
                                                                     const GptStage* stage) {
  FLEET_RETURN_IF_ERROR(config.Validate());
  const int M = group ? group->size() : 1;
  const int per = (config.vocab_size + M - 1) / M;
  if (config.num_attention_heads % M != 0 || config.ffn() % M != 0 ||
      config.vocab_size <= (M - 1) * per) {
    return Status::InvalidArgument(
        "must divide Model.num_attention_heads (" + std::to_string(config.num_attention_heads) +
            ") and the MLP width (" + std::to_string(config.ffn()) +
            ") and leave every rank vocabulary rows (" + std::to_string(config.vocab_size) + ")",
        "Distributed.mp_degree=" + std::to_string(M));
  }
  return std::unique_ptr<GptTensorParallel>(
      new GptTensorParallel(config, group, stage ? *stage : GptWholeStage(config)));
}

GptTensorParallel::GptTensorParallel(const GptConfig& config, Collective* group,
                                     const GptStage& stage)
    : config_(config),
      group_(group),
      degree_(group ? group->size() : 1),
      rank_(group ? group->rank() : 0),
      stage_(stage) {
  std::tie(vocab_begin_, vocab_rows_) = VocabRange(config.vocab_size, degree_, rank_);
  // This stage's shards only: the segments of the group's ranks.
  split_.rank = rank_;
  split_.degree = degree_;
  split_.whole_table = GptParamTable(config);
  split_.whole_size = static_cast<size_t>(GptParamCount(config));
  split_.segments.resize(degree_);
  split_.local_size.resize(degree_);
  for (int r = 0; r < degree_; ++r) {
    ParamTable table;
    BuildShard(config, degree_, r, stage_, &table, &split_.segments[r], &split_.local_size[r]);
  }
  split_.group = group;
}

int GptTensorParallel::heads() const { return config_.num_attention_heads / degree_; }
int GptTensorParallel::attention_width() const { return config_.hidden_size / degree_; }
int GptTensorParallel::ffn() const { return config_.ffn() / degree_; }

ParamTable GptTensorParallel::ShardTable() const {
  ParamTable table;
  std::vector<ArenaSegment> segments;
  size_t local = 0;
  BuildShard(config_, degree_, rank_, stage_, &table, &segments, &local);
  return table;
}

void GptTensorParallel::AllReduce(float* data, size_t n, ReduceOp op) {
  if (group_ == nullptr || degree_ == 1 || !status_.ok()) return;
  status_ = group_->AllReduce(data, n, op)
                .WithContext("tensor-parallel all-reduce of " + std::to_string(n) + " floats");
}

}  // namespace fleet::trainer
