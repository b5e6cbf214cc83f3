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

// Walks the table once for rank r of M: the shard's table and its segments.
void BuildShard(const GptConfig& c, int M, int r, ParamTable* table,
                std::vector<ArenaSegment>* segments, size_t* local_size, size_t* whole_size) {
  const size_t C = c.hidden_size, F = c.ffn();
  const size_t Cl = C / M, Fl = F / M;
  const auto [v_begin, v_rows] = VocabRange(c.vocab_size, M, r);
  size_t local = 0, whole = 0;
  auto add = [&](size_t whole_offset, size_t size, bool replicated) {
    segments->push_back({local, whole + whole_offset, size, replicated});
    local += size;
  };
  ForEachGptTensor(c, [&](GptTensor t, int layer, int64_t rows, int64_t cols) {
    const size_t numel = static_cast<size_t>(rows * (cols ? cols : 1));
    Shape shape = cols ? Shape{rows, cols} : Shape{rows};
    switch (t) {
      case GptTensor::kWte:
        shape = Shape{v_rows, int64_t(C)};
        add(size_t(v_begin) * C, size_t(v_rows) * C, false);
        break;
      case GptTensor::kQkvW:
      case GptTensor::kQkvB: {
        // q, k and v of this rank's heads: three runs of rows.
        const size_t width = t == GptTensor::kQkvW ? C : 1;
        shape = t == GptTensor::kQkvW ? Shape{int64_t(3 * Cl), int64_t(C)} : Shape{int64_t(3 * Cl)};
        for (size_t part = 0; part < 3; ++part) add((part * C + r * Cl) * width, Cl * width, false);
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
        add(0, numel, true);
        break;
    }
    table->push_back({GptTensorName(t, layer), shape});
    whole += numel;
  });
  *local_size = local;
  *whole_size = whole;
}

}  // namespace

ParamSplit GptParamSplit(const GptConfig& config, int degree, int rank) {
  ParamSplit split;
  split.rank = rank;
  split.degree = degree;
  split.whole_table = GptParamTable(config);
  split.segments.resize(degree);
  split.local_size.resize(degree);
  for (int r = 0; r < degree; ++r) {
    ParamTable table;
    BuildShard(config, degree, r, &table, &split.segments[r], &split.local_size[r],
               &split.whole_size);
  }
  return split;
}

Result<std::unique_ptr<GptTensorParallel>> GptTensorParallel::Create(const GptConfig& config,
                                                                     Collective* group) {
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
  return std::unique_ptr<GptTensorParallel>(new GptTensorParallel(config, group));
}

GptTensorParallel::GptTensorParallel(const GptConfig& config, Collective* group)
    : config_(config),
      group_(group),
      degree_(group ? group->size() : 1),
      rank_(group ? group->rank() : 0) {
  std::tie(vocab_begin_, vocab_rows_) = VocabRange(config.vocab_size, degree_, rank_);
  split_ = GptParamSplit(config, degree_, rank_);
  split_.group = group;
}

int GptTensorParallel::heads() const { return config_.num_attention_heads / degree_; }
int GptTensorParallel::attention_width() const { return config_.hidden_size / degree_; }
int GptTensorParallel::ffn() const { return config_.ffn() / degree_; }

ParamTable GptTensorParallel::ShardTable() const {
  ParamTable table;
  std::vector<ArenaSegment> segments;
  size_t local = 0, whole = 0;
  BuildShard(config_, degree_, rank_, &table, &segments, &local, &whole);
  return table;
}

void GptTensorParallel::AllReduce(float* data, size_t n, ReduceOp op) {
  if (group_ == nullptr || degree_ == 1 || !status_.ok()) return;
  status_ = group_->AllReduce(data, n, op)
                .WithContext("tensor-parallel all-reduce of " + std::to_string(n) + " floats");
}

}  // namespace fleet::trainer
