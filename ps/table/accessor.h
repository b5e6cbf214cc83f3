// Accessors: what a sparse row holds and how pulls, pushes and passes change
// it. A shard stores each row as `row_floats()` floats in its arena, plus,
// for accessors with an extension (ext_floats() > 0), an optional second
// block of `ext_floats()` floats that the shard allocates when PushGrad asks
// for it. The accessor never sees keys' storage or locks; the shard calls it
// with spans while holding the shard lock.
//
//   PlainAccessor: row = [value (dim)][optimizer state]; pull returns value.
//   CtrAccessor:   row = [show, click, unseen_passes][embed_w (embed_dim)][its state]
//                  ext = [embedx (dim)][its state], created once the score
//                  reaches ctr.embedx_threshold;
//                  pull returns [embed_w, embedx] (embedx zeros until created).
//
// Thread safety: immutable after construction; methods may run concurrently
// on distinct rows.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "ps/table/initializer.h"
#include "ps/table/optimizer.h"
#include "ps/table/table_config.h"

namespace fleet::ps {

class Accessor {
 public:
  virtual ~Accessor() = default;

  // Floats per key in a pull response and in a push (gradient or delta).
  virtual size_t pull_dim() const = 0;
  size_t push_dim() const { return pull_dim(); }
  // Floats per stored row, and per extension block (0: no extension).
  virtual size_t row_floats() const = 0;
  virtual size_t ext_floats() const { return 0; }

  // Writes a new row's fields.
  virtual void InitRow(uint64_t key, std::span<float> row) const = 0;
  // Writes a new extension block. Only called when ext_floats() > 0.
  virtual void InitExt(uint64_t key, std::span<float> ext) const {}

  // The value a pull of an unstored (not yet admitted) key returns: exactly
  // what a pull right after admission would return.
  virtual void InitialPull(uint64_t key, std::span<float> out) const = 0;
  // `ext` is empty when the row has no extension.
  virtual void Pull(std::span<const float> row, std::span<const float> ext, std::span<float> out) const = 0;
  // True when Pull copies the row's first pull_dim() floats and nothing
  // else: the shard then copies them itself instead of calling Pull per key.
  virtual bool pull_copies_row() const { return false; }

  // Applies one gradient with its show/click counts. Returns true when the
  // row has no extension (ext empty) and should get one now; the shard then
  // allocates it and calls InitExt.
  virtual bool PushGrad(std::span<float> row, std::span<float> ext, std::span<const float> grad, float show,
                        float click) const = 0;
  // When not null: PushGrad of a row is exactly rule->Update of its first
  // pull_dim() floats (then its state) with the gradient, show and click
  // unused, and never asks for an extension; the shard then updates a batch
  // of rows with one OptimizerRule::UpdateRows call.
  virtual const OptimizerRule* plain_push_rule() const { return nullptr; }
  // value += delta for every value part present, with the show/click counts
  // the delta's steps saw (geo mode). Returns true, as PushGrad does, when
  // the row has no extension and should get one now.
  virtual bool PushDelta(std::span<float> row, std::span<float> ext, std::span<const float> delta,
                         float show, float click) const = 0;

  // Whether EndPass changes rows (then every row counts as changed for the
  // next delta checkpoint).
  virtual bool ages_rows() const { return false; }
  // Called on every row by SparseTable::EndPass.
  virtual void EndPass(std::span<float> row) const {}
  // Whether SparseTable::Shrink deletes the row.
  virtual bool ShouldDelete(std::span<const float> row) const { return false; }
};

// value + optimizer state. EndPass and Shrink leave rows alone.
class PlainAccessor final : public Accessor {
 public:
  // REQUIRES: config passed ValidateTableConfig.
  explicit PlainAccessor(const TableConfig& config);

  size_t pull_dim() const override { return dim_; }
  size_t row_floats() const override { return dim_ + rule_->state_size(dim_); }
  void InitRow(uint64_t key, std::span<float> row) const override;
  void InitialPull(uint64_t key, std::span<float> out) const override;
  void Pull(std::span<const float> row, std::span<const float> ext, std::span<float> out) const override;
  bool pull_copies_row() const override { return true; }
  const OptimizerRule* plain_push_rule() const override { return rule_.get(); }
  bool PushGrad(std::span<float> row, std::span<float> ext, std::span<const float> grad, float show,
                float click) const override;
  bool PushDelta(std::span<float> row, std::span<float> ext, std::span<const float> delta,
                 float show, float click) const override;

 private:
  const size_t dim_;
  const Initializer init_;
  const std::unique_ptr<OptimizerRule> rule_;
};

class CtrAccessor final : public Accessor {
 public:
  // Field offsets inside a row.
  static constexpr size_t kShow = 0, kClick = 1, kUnseen = 2, kEmbed = 3;

  // REQUIRES: config passed ValidateTableConfig.
  explicit CtrAccessor(const TableConfig& config);

  size_t pull_dim() const override { return embed_dim_ + embedx_dim_; }
  size_t row_floats() const override { return kEmbed + embed_dim_ + rule_->state_size(embed_dim_); }
  size_t ext_floats() const override { return embedx_dim_ + rule_->state_size(embedx_dim_); }
  void InitRow(uint64_t key, std::span<float> row) const override;
  void InitExt(uint64_t key, std::span<float> ext) const override;
  void InitialPull(uint64_t key, std::span<float> out) const override;
  void Pull(std::span<const float> row, std::span<const float> ext, std::span<float> out) const override;
  // Adds show/click, resets unseen_passes, updates embed_w and (when
  // present) embedx. A gradient for an absent embedx is dropped: it was
  // computed against zeros the row never stored.
  bool PushGrad(std::span<float> row, std::span<float> ext, std::span<const float> grad, float show,
                float click) const override;
  // Adds show/click (a sighting resets unseen_passes) and the delta to
  // embed_w and, when present, embedx; a delta for an absent embedx is
  // dropped, as a gradient is.
  bool PushDelta(std::span<float> row, std::span<float> ext, std::span<const float> delta,
                 float show, float click) const override;
  bool ages_rows() const override { return true; }
  // show, click *= show_click_decay; unseen_passes += 1.
  void EndPass(std::span<float> row) const override;
  // unseen_passes >= delete_after_unseen_passes, or score < delete_threshold.
  bool ShouldDelete(std::span<const float> row) const override;

  // nonclk_coeff * (show - click) + click_coeff * click.
  float Score(std::span<const float> row) const;

 private:
  // Initializer streams, so embed_w and embedx draw different numbers.
  static constexpr uint32_t kEmbedStream = 0, kEmbedxStream = 1;

  const CtrAccessorConfig ctr_;
  const size_t embed_dim_;
  const size_t embedx_dim_;
  const Initializer init_;
  const std::unique_ptr<OptimizerRule> rule_;
};

// The accessor named by config.accessor. REQUIRES: a valid sparse config.
std::unique_ptr<Accessor> MakeAccessor(const TableConfig& config);

}  // namespace fleet::ps
