#include "ps/table/accessor.h"

#include <algorithm>

#include "ps/table/float_rows.h"

namespace fleet::ps {

PlainAccessor::PlainAccessor(const TableConfig& config)
    : dim_(config.dim), init_(config.initializer), rule_(MakeOptimizerRule(config.optimizer)) {}

void PlainAccessor::InitRow(uint64_t key, std::span<float> row) const {
  init_.Fill(key, 0, row.first(dim_));
  rule_->InitState(dim_, row.subspan(dim_));
}

void PlainAccessor::InitialPull(uint64_t key, std::span<float> out) const { init_.Fill(key, 0, out); }

void PlainAccessor::Pull(std::span<const float> row, std::span<const float>, std::span<float> out) const {
  CopyFloats(row.data(), dim_, out.data());
}

bool PlainAccessor::PushGrad(std::span<float> row, std::span<float>, std::span<const float> grad, float,
                             float) const {
  rule_->Update(row.first(dim_), row.subspan(dim_), grad);
  return false;
}

bool PlainAccessor::PushDelta(std::span<float> row, std::span<float>, std::span<const float> delta,
                              float, float) const {
  for (size_t i = 0; i < dim_; ++i) row[i] += delta[i];
  return false;
}

CtrAccessor::CtrAccessor(const TableConfig& config)
    : ctr_(config.ctr),
      embed_dim_(config.ctr.embed_dim),
      embedx_dim_(config.dim),
      init_(config.initializer),
      rule_(MakeOptimizerRule(config.optimizer)) {}

void CtrAccessor::InitRow(uint64_t key, std::span<float> row) const {
  row[kShow] = row[kClick] = row[kUnseen] = 0.0f;
  init_.Fill(key, kEmbedStream, row.subspan(kEmbed, embed_dim_));
  rule_->InitState(embed_dim_, row.subspan(kEmbed + embed_dim_));
}

void CtrAccessor::InitExt(uint64_t key, std::span<float> ext) const {
  init_.Fill(key, kEmbedxStream, ext.first(embedx_dim_));
  rule_->InitState(embedx_dim_, ext.subspan(embedx_dim_));
}

void CtrAccessor::InitialPull(uint64_t key, std::span<float> out) const {
  init_.Fill(key, kEmbedStream, out.first(embed_dim_));
  std::fill(out.begin() + embed_dim_, out.end(), 0.0f);
}

void CtrAccessor::Pull(std::span<const float> row, std::span<const float> ext, std::span<float> out) const {
  std::copy_n(row.begin() + kEmbed, embed_dim_, out.begin());
  if (ext.empty()) {
    std::fill(out.begin() + embed_dim_, out.end(), 0.0f);
  } else {
    std::copy_n(ext.begin(), embedx_dim_, out.begin() + embed_dim_);
  }
}

bool CtrAccessor::PushGrad(std::span<float> row, std::span<float> ext, std::span<const float> grad, float show,
                           float click) const {
  row[kShow] += show;
  row[kClick] += click;
  row[kUnseen] = 0.0f;
  rule_->Update(row.subspan(kEmbed, embed_dim_), row.subspan(kEmbed + embed_dim_), grad.first(embed_dim_));
  if (!ext.empty()) {
    rule_->Update(ext.first(embedx_dim_), ext.subspan(embedx_dim_), grad.subspan(embed_dim_));
    return false;
  }
  return Score(row) >= ctr_.embedx_threshold;
}

bool CtrAccessor::PushDelta(std::span<float> row, std::span<float> ext,
                            std::span<const float> delta, float show, float click) const {
  row[kShow] += show;
  row[kClick] += click;
  if (show > 0.0f) row[kUnseen] = 0.0f;
  for (size_t i = 0; i < embed_dim_; ++i) row[kEmbed + i] += delta[i];
  if (!ext.empty()) {
    for (size_t i = 0; i < embedx_dim_; ++i) ext[i] += delta[embed_dim_ + i];
    return false;
  }
  return Score(row) >= ctr_.embedx_threshold;
}

void CtrAccessor::EndPass(std::span<float> row) const {
  row[kShow] *= ctr_.show_click_decay;
  row[kClick] *= ctr_.show_click_decay;
  row[kUnseen] += 1.0f;
}

bool CtrAccessor::ShouldDelete(std::span<const float> row) const {
  return row[kUnseen] >= static_cast<float>(ctr_.delete_after_unseen_passes) ||
         Score(row) < ctr_.delete_threshold;
}

float CtrAccessor::Score(std::span<const float> row) const {
  return ctr_.nonclk_coeff * (row[kShow] - row[kClick]) + ctr_.click_coeff * row[kClick];
}

std::unique_ptr<Accessor> MakeAccessor(const TableConfig& config) {
  if (config.accessor == AccessorKind::kCtr) return std::make_unique<CtrAccessor>(config);
  return std::make_unique<PlainAccessor>(config);
}

}  // namespace fleet::ps
