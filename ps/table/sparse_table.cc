#include "ps/table/sparse_table.h"

#include <glog/logging.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ps/table/float_rows.h"
#include "ps/table/row_store.h"
#include "ps/table/shard_file.h"

namespace fleet::ps {
namespace {

constexpr uint8_t kDirty = 1;
// A lower tier holds a copy of the row (InsertAbsentRows); with kDirty
// clear the copy is current.
constexpr uint8_t kHasCopy = 2;
// Keys looked up together so their cache misses overlap (LocalShard::ForEachSlot).
constexpr size_t kLookupBatch = 32;
constexpr uint32_t kNoExt = UINT32_MAX;
constexpr uint32_t kNoSlot = UINT32_MAX;

// The index stores 4-byte slot ids; hashing and equality read the key stored
// in front of the slot's row, and lookups by key go through KeyProbe
// (heterogeneous lookup), so the key is stored once.
//
// The index hash is Mix64(key), which routing computed already, rotated:
// under the hash partition its low bits pick the key's global shard (hash %
// shard_num), so within one local shard they repeat, and absl takes the
// 7-bit tag from the low bits.
//
// A probe with `candidate` set compares equal to every slot whose 7-bit
// hash tag matches, without reading the stored key: find() then returns the
// first slot that may hold the key (or end(): the key is certainly absent)
// after touching only the index. ForEachSlot uses it to prefetch a batch's
// rows and keys together and checks each candidate afterwards.
inline size_t IndexHash(uint64_t mix64) { return std::rotr(mix64, 32); }
struct KeyProbe {
  explicit KeyProbe(uint64_t k) : key(k), hash(Mix64(k)) {}
  KeyProbe(uint64_t k, uint64_t mix64, bool candidate)
      : key(k), hash(mix64), candidate(candidate) {}
  uint64_t key;
  uint64_t hash;  // Mix64(key)
  bool candidate = false;
};
struct SlotHash {
  using is_transparent = void;
  const KeyedRowColumn* rows = nullptr;
  size_t operator()(uint32_t slot) const { return IndexHash(Mix64(rows->key(slot))); }
  size_t operator()(KeyProbe p) const { return IndexHash(p.hash); }
};
struct SlotEq {
  using is_transparent = void;
  const KeyedRowColumn* rows = nullptr;
  bool operator()(uint32_t a, uint32_t b) const { return rows->key(a) == rows->key(b); }
  bool operator()(uint32_t a, KeyProbe b) const { return b.candidate || rows->key(a) == b.key; }
  bool operator()(KeyProbe a, uint32_t b) const { return a.candidate || a.key == rows->key(b); }
};

// A local shard's lock: a request takes each one it touches (all 16 of the
// default for 1000 keys), almost always uncontended. std::mutex locks and
// unlocks in ~4 ns here, absl::Mutex in ~12 (Debian's libabsl is built
// without NDEBUG); the annotations keep absl's thread-safety analysis.
class ABSL_LOCKABLE ShardMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE ShardLock {
 public:
  explicit ShardLock(ShardMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~ShardLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  ShardLock(const ShardLock&) = delete;
  ShardLock& operator=(const ShardLock&) = delete;

 private:
  ShardMutex* const mu_;
};

}  // namespace

// One local shard: the rows of the global shards [first, first + count) of
// this server, in one arena and one index, with
// admission counts and change marks. Every method expects mu to be held by
// the caller (SparseTable), which keeps the per-request loop in one critical
// section.
class LocalShard {
 public:
  LocalShard(const Accessor* accessor, const TableConfig& config, uint32_t first, uint32_t count,
             RowQuota* quota)
      : accessor_(accessor),
        quota_(quota),
        table_id_(config.id),
        shard_num_(config.shard_num),
        partition_(config.partition),
        first_(first),
        count_(count),
        min_count_(config.admission_min_count),
        pull_copies_row_(accessor->pull_copies_row()),
        plain_push_rule_(accessor->plain_push_rule()),
        inline_sgd_(plain_push_rule_ != nullptr && !plain_push_rule_->preprocesses()
                        ? dynamic_cast<const SgdRule*>(plain_push_rule_)
                        : nullptr),
        row_floats_(accessor->row_floats()),
        ext_floats_(accessor->ext_floats()),
        shift_(ChunkShiftFor(KeyedRowColumn::SlotBytes(row_floats_))),
        ext_shift_(ChunkShiftFor(ext_floats_ * sizeof(float))),
        slots_(shift_),
        flags_(1, shift_),
        rows_(row_floats_, shift_),
        ext_of_(ext_floats_ > 0 ? 1 : 0, shift_),
        ext_slots_(ext_shift_),
        ext_(ext_floats_, ext_shift_),
        index_(0, SlotHash{&rows_}, SlotEq{&rows_}) {}
  LocalShard(const LocalShard&) = delete;
  LocalShard& operator=(const LocalShard&) = delete;

  ShardMutex mu;

  // hashes[i] is Mix64(keys[i]) (see KeyProbe).
  void Pull(std::span<const uint64_t> keys, const uint64_t* hashes, std::span<const uint32_t> which,
            float* values) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t d = accessor_->pull_dim();
    ForEachSlot(keys, hashes, which, [&](uint32_t i, const FoundRow* found) {
      std::span<float> out(values + size_t{i} * d, d);
      if (found == nullptr) {
        accessor_->InitialPull(keys[i], out);
      } else if (pull_copies_row_) {
        CopyFloats(found->row, d, out.data());
      } else {
        accessor_->Pull(Row(*found), Ext(found->slot), out);
      }
    });
  }

  void PushGrad(std::span<const uint64_t> keys, const uint64_t* hashes,
                std::span<const uint32_t> which, const float* grads, std::span<const float> shows,
                std::span<const float> clicks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t d = accessor_->push_dim();
    if (plain_push_rule_ != nullptr) {
      PushPlainGrad(keys, hashes, which, grads);
      return;
    }
    ForEachSlot</*writes=*/true>(
        keys, hashes, which, [&](uint32_t i, const FoundRow* found) {
          if (found == nullptr) {
            ++dropped_pushes_;
            return;
          }
          const float show = shows.empty() ? 1.0f : shows[i];
          const float click = clicks.empty() ? 0.0f : clicks[i];
          const bool wants_ext =
              accessor_->PushGrad(Row(*found), Ext(found->slot),
                                  std::span<const float>(grads + size_t{i} * d, d), show, click);
          *found->flags |= kDirty;
          if (wants_ext && ext_floats_ > 0 && AttachExt(found->slot)) {
            accessor_->InitExt(keys[i], Ext(found->slot));
          }
        });
  }

  void PushDelta(std::span<const uint64_t> keys, const uint64_t* hashes,
                 std::span<const uint32_t> which, const float* deltas, std::span<const float> shows,
                 std::span<const float> clicks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t d = accessor_->push_dim();
    ForEachSlot</*writes=*/true>(
        keys, hashes, which, [&](uint32_t i, const FoundRow* found) {
          if (found == nullptr) {
            ++dropped_pushes_;
            return;
          }
          const bool wants_ext = accessor_->PushDelta(
              Row(*found), Ext(found->slot), std::span<const float>(deltas + size_t{i} * d, d),
              shows.empty() ? 0.0f : shows[i], clicks.empty() ? 0.0f : clicks[i]);
          *found->flags |= kDirty;
          if (wants_ext && ext_floats_ > 0 && AttachExt(found->slot)) {
            accessor_->InitExt(keys[i], Ext(found->slot));
          }
        });
  }

  // Keys refused a row so far (quota or slot space), for the caller to
  // report per request.
  uint64_t refused() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return refused_; }

  void EndPass() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!accessor_->ages_rows()) return;
    for (uint32_t slot : index_) {
      accessor_->EndPass(Row(slot));
      *flags_.at(slot) |= kDirty;
    }
  }

  uint64_t Shrink() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<uint32_t> doomed;
    for (uint32_t slot : index_) {
      if (accessor_->ShouldDelete(Row(slot))) doomed.push_back(slot);
    }
    for (uint32_t slot : doomed) Remove(slot, /*record=*/true);
    // Counts of keys never admitted would otherwise grow without bound.
    pending_ = {};
    return doomed.size();
  }

  void AddStats(SparseTableStats* s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    s->rows += index_.size();
    s->ext_rows += ext_slots_.live();
    s->pending_keys += pending_.size();
    s->dropped_pushes += dropped_pushes_;
    s->bytes += flags_.bytes() + rows_.bytes() + ext_of_.bytes() + ext_.bytes() + slots_.bytes() +
                ext_slots_.bytes() + index_.capacity() * (sizeof(uint32_t) + 1) +
                pending_.capacity() * (sizeof(std::pair<uint64_t, uint32_t>) + 1) +
                deleted_.capacity() * (sizeof(uint64_t) + 1);
  }

  bool Lookup(uint64_t key, std::vector<float>* row, std::vector<float>* ext) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = index_.find(KeyProbe(key));
    if (it == index_.end()) return false;
    const uint32_t slot = *it;
    std::span<const float> r(rows_.row(slot), row_floats_);
    row->assign(r.begin(), r.end());
    ext->clear();
    if (ext_floats_ > 0 && *ext_of_.at(slot) != kNoExt) {
      std::span<const float> e(ext_.at(*ext_of_.at(slot)), ext_floats_);
      ext->assign(e.begin(), e.end());
    }
    return true;
  }

  // The shard file image of every global shard held here: all rows (kBase)
  // or rows changed and keys deleted since the last save (kDelta). One pass
  // over the rows sorts them into their global shards.
  std::vector<ShardImage> Serialize(SaveMode mode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<std::vector<uint32_t>> chosen(count_);
    for (uint32_t slot : index_) {
      if (mode == SaveMode::kBase || (*flags_.at(slot) & kDirty))
        chosen[Position(ShardOfKey(rows_.key(slot), shard_num_, partition_))].push_back(slot);
    }
    // Delta: write deleted keys too. Base: they are simply absent.
    std::vector<std::vector<uint64_t>> deleted(count_);
    if (mode == SaveMode::kDelta) {
      for (uint64_t k : deleted_)
        deleted[Position(ShardOfKey(k, shard_num_, partition_))].push_back(k);
    }

    std::vector<ShardImage> images(count_);
    for (uint32_t p = 0; p < count_; ++p) {
      // Rows in key order: the same rows give the same file, whatever the
      // index's history or the local shard layout.
      std::sort(chosen[p].begin(), chosen[p].end(),
                [&](uint32_t a, uint32_t b) { return rows_.key(a) < rows_.key(b); });
      std::sort(deleted[p].begin(), deleted[p].end());
      ShardImage& im = images[p];
      im.shard = first_ + p;
      ShardFileWriter w(&im.image, Shape(im.shard), mode);
      for (uint32_t slot : chosen[p]) w.AddRow(rows_.key(slot), Row(slot), Ext(slot));
      for (uint64_t k : deleted[p]) w.AddDeleted(k);
      im.info = w.Finish();
    }

    // Clear the change marks now; AbortSave puts them back.
    save_pending_ = true;
    save_was_base_ = mode == SaveMode::kBase;
    for (const auto& slots : chosen) {
      for (uint32_t slot : slots) {
        if (*flags_.at(slot) & kDirty) {
          if (!save_was_base_) saved_keys_.push_back(rows_.key(slot));
          *flags_.at(slot) &= ~kDirty;
        }
      }
    }
    for (uint64_t k : deleted_) saved_deleted_.push_back(k);
    deleted_ = {};
    return images;
  }

  void CommitSave() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { ResetSaveUndo(); }

  void AbortSave() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!save_pending_) return;
    // A failed base save may have cleared marks we did not record: mark every
    // row, which can only make the next delta larger, never wrong.
    if (save_was_base_) {
      for (uint32_t slot : index_) *flags_.at(slot) |= kDirty;
    }
    for (uint64_t k : saved_keys_) Remark(k);
    for (uint64_t k : saved_deleted_) Remark(k);
    ResetSaveUndo();
  }

  // Applies the shard file image of global shard `shard` (held here).
  Status Apply(uint32_t shard_id, std::string_view image, std::string_view file)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto on_row = [&](uint64_t key, std::span<const float> row,
                      std::span<const float> ext) -> Status {
      std::optional<uint32_t> slot = Find(KeyProbe(key));
      if (!slot) {
        // A checkpoint is loaded whole even above the row quota (lowered
        // since it was saved): only new keys are refused afterwards.
        slot = Insert(key, /*init=*/false);
        if (!slot) return Status::Corruption("exceeds the slot space of a local shard");
        quota_->Force();
      }
      *flags_.at(*slot) = 0;
      std::copy(row.begin(), row.end(), rows_.row(*slot));
      if (!ext.empty()) {
        if (*ext_of_.at(*slot) == kNoExt && !AttachExt(*slot))
          return Status::Corruption("exceeds the extension slot space of a local shard");
        std::copy(ext.begin(), ext.end(), Ext(*slot).begin());
      } else if (ext_floats_ > 0 && *ext_of_.at(*slot) != kNoExt) {
        ext_slots_.Free(*ext_of_.at(*slot));
        *ext_of_.at(*slot) = kNoExt;
      }
      return Status::OK();
    };
    auto on_deleted = [&](uint64_t key) {
      if (std::optional<uint32_t> slot = Find(KeyProbe(key))) Remove(*slot, /*record=*/false);
      return Status::OK();
    };
    return ReadShardFile(image, file, Shape(shard_id), on_row, on_deleted);
  }

  // ---- Tier hooks (SparseTable's protected methods) ----

  void FindAbsent(std::span<const uint64_t> keys, const uint64_t* hashes,
                  std::span<const uint32_t> which, std::vector<uint32_t>* absent) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (uint32_t i : which) {
      if (!Find(KeyProbe(keys[i], hashes[i], false))) absent->push_back(i);
    }
  }

  // False when the slot space is used up.
  bool InsertAbsent(const SparseTable::RowRef& r, bool* inserted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    *inserted = false;
    if (Find(KeyProbe(r.key))) return true;
    std::optional<uint32_t> slot = Insert(r.key, /*init=*/false);
    if (!slot) return false;
    quota_->Force();
    *flags_.at(*slot) = (r.has_copy ? kHasCopy : 0) | (r.changed ? kDirty : 0);
    std::copy(r.row.begin(), r.row.end(), rows_.row(*slot));
    if (!r.ext.empty()) {
      if (!AttachExt(*slot)) {
        Remove(*slot, /*record=*/false);
        return false;
      }
      std::copy(r.ext.begin(), r.ext.end(), Ext(*slot).begin());
    }
    *inserted = true;
    return true;
  }

  uint64_t Extract(const SparseTable::RowPick& pick, const SparseTable::RowTake& take)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<uint32_t> chosen;
    for (uint32_t slot : index_) {
      if (pick(Row(slot))) chosen.push_back(slot);
    }
    for (uint32_t slot : chosen) {
      take(Ref(slot));
      Remove(slot, /*record=*/false);
    }
    return chosen.size();
  }

  void Visit(const SparseTable::RowTake& fn) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (uint32_t slot : index_) fn(Ref(slot));
  }

  SparseTable::RowRef Ref(uint32_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint8_t f = *flags_.at(slot);
    return {rows_.key(slot), Row(slot), Ext(slot), (f & kHasCopy) != 0, (f & kDirty) != 0};
  }

  void ForgetPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { pending_ = {}; }

 private:
  // PushGrad for accessors with a plain_push_rule(). SGD's step (a multiply
  // and a subtract per element) runs inline as each row is found; the other
  // rules' (square roots, divides) run kLookupBatch rows at a time once
  // their rows are found, where their long-latency arithmetic overlaps
  // (inline, adagrad and adam at dim 8 measured 6-12% slower, SGD at dim 1
  // ~10% faster). Always batched with clipping or decay.
  void PushPlainGrad(std::span<const uint64_t> keys, const uint64_t* hashes,
                     std::span<const uint32_t> which, const float* grads) {
    const size_t d = accessor_->push_dim();
    float* rows[kLookupBatch];
    const float* row_grads[kLookupBatch];
    size_t n = 0;
    auto flush = [&] {
      plain_push_rule_->UpdateRows({rows, n}, {row_grads, n}, d);
      n = 0;
    };
    ForEachSlot</*writes=*/true>(keys, hashes, which,
                                 [&](uint32_t i, const FoundRow* found) {
                                   if (found == nullptr) {
                                     ++dropped_pushes_;
                                     return;
                                   }
                                   *found->flags |= kDirty;
                                   float* row = found->row;
                                   const float* grad = grads + size_t{i} * d;
                                   if (inline_sgd_ != nullptr) {
                                     inline_sgd_->Apply(row, row + d, grad, d);
                                     return;
                                   }
                                   rows[n] = row;
                                   row_grads[n] = grad;
                                   if (++n == kLookupBatch) flush();
                                 });
    if (n > 0) flush();
  }

  // Index into this shard's list of global shards.
  uint32_t Position(uint32_t global_shard) const { return global_shard - first_; }

  ShardFileShape Shape(uint32_t global_shard) const {
    return {.table_id = table_id_,
            .shard = global_shard,
            .shard_num = shard_num_,
            .partition = partition_,
            .row_floats = static_cast<uint32_t>(row_floats_),
            .ext_floats = static_cast<uint32_t>(ext_floats_)};
  }

  std::span<float> Row(uint32_t slot) const { return {rows_.row(slot), row_floats_}; }

  // A stored row as ForEachSlot hands it over: where its row and change
  // marks are is worked out once per key (finding a column's chunk costs
  // ~13 instructions, and a push used to do it five times a key).
  struct FoundRow {
    uint32_t slot;
    float* row;      // row_floats_ floats
    uint8_t* flags;  // its change marks; null unless ForEachSlot<writes>
  };
  std::span<float> Row(const FoundRow& found) const { return {found.row, row_floats_}; }
  std::span<float> Ext(uint32_t slot) const {
    if (ext_floats_ == 0 || *ext_of_.at(slot) == kNoExt) return {};
    return {ext_.at(*ext_of_.at(slot)), ext_floats_};
  }

  std::optional<uint32_t> Find(KeyProbe probe) const {
    auto it = index_.find(probe);
    if (it == index_.end()) return std::nullopt;
    return *it;
  }

  // Calls fn(i, found) for each request index i of `which`, in order, where
  // found is the row FindOrAdmit(keys[i]) gives (null: none). In a table
  // much larger than the caches a lookup costs two dependent misses (index,
  // then key and row); to overlap them, keys go kLookupBatch at a time
  // through three passes: prefetch the index positions of the batch; find
  // each key's candidate slot from the index alone (KeyProbe::candidate) and
  // prefetch its record; then confirm each candidate (a wrong one, about 1
  // in 128 probes, falls back to a full lookup) and call fn. (A rolling
  // pipeline with the stages 16 keys apart measured slower here: more
  // prefetches in flight than the core keeps.)
  // `writes`: fn changes rows and sets their change marks, so those are
  // fetched for writing too.
  template <bool writes = false, typename Fn>
  void ForEachSlot(std::span<const uint64_t> keys, const uint64_t* hashes,
                   std::span<const uint32_t> which, Fn&& fn) {
    uint32_t candidates[kLookupBatch];
    float* records[kLookupBatch];
    uint8_t* flags[kLookupBatch];
    for (size_t b = 0; b < which.size(); b += kLookupBatch) {
      const std::span<const uint32_t> batch = which.subspan(b, std::min(kLookupBatch, which.size() - b));
      for (uint32_t i : batch) index_.prefetch(KeyProbe(keys[i], hashes[i], /*candidate=*/false));
      // The two columns' layouts in locals, taken again each batch (fn may
      // have added rows, and chunks); they share the chunk size, so a slot's
      // chunk and place in it are worked out once for both.
      const KeyedRowColumn::View record_of = rows_.view();
      const ChunkedColumn<uint8_t>::View flags_of = flags_.view();
      DCHECK_EQ(flags_of.shift, record_of.shift);
      uint8_t* const* const flag_chunks = flags_of.bases;
      for (size_t j = 0; j < batch.size(); ++j) {
        const uint32_t i = batch[j];
        auto it = index_.find(KeyProbe(keys[i], hashes[i], /*candidate=*/true));
        candidates[j] = it == index_.end() ? kNoSlot : *it;
        if (candidates[j] != kNoSlot) {
          const uint32_t chunk = candidates[j] >> record_of.shift;
          const uint32_t within = candidates[j] & record_of.mask;
          records[j] = record_of.bases[chunk] + within * record_of.width;
          // Both ends: a record may straddle two cache lines.
          __builtin_prefetch(records[j], writes);
          __builtin_prefetch(records[j] + record_of.width - 1, writes);
          if constexpr (writes) {
            flags[j] = flag_chunks[chunk] + within;
            __builtin_prefetch(flags[j], 1);
          }
        }
      }
      for (size_t j = 0; j < batch.size(); ++j) {
        const uint64_t key = keys[batch[j]];
        const uint32_t c = candidates[j];
        FoundRow found;
        if (c != kNoSlot && KeyedRowColumn::KeyOf(records[j]) == key) {
          found = {c, KeyedRowColumn::RowOf(records[j]), writes ? flags[j] : nullptr};
        } else if (std::optional<uint32_t> slot =
                       FindOrAdmit(KeyProbe(key, hashes[batch[j]], false))) {
          // A missing candidate is looked up again too: an earlier key of
          // the batch may have been the same key and inserted it.
          found = {*slot, rows_.row(*slot), writes ? flags_.at(*slot) : nullptr};
        } else {
          fn(batch[j], static_cast<const FoundRow*>(nullptr));
          continue;
        }
        fn(batch[j], &found);
      }
    }
  }

  // The row of key, created if the admission rule lets it in now and the
  // row quota and slot space have room (else counted in refused_).
  std::optional<uint32_t> FindOrAdmit(KeyProbe probe) {
    if (std::optional<uint32_t> slot = Find(probe)) return slot;
    if (min_count_ > 1) {
      uint32_t& seen = pending_[probe.key];
      if (++seen < min_count_) return std::nullopt;
      pending_.erase(probe.key);
    }
    if (!quota_->Take()) {
      ++refused_;
      return std::nullopt;
    }
    std::optional<uint32_t> slot = Insert(probe.key, /*init=*/true);
    if (!slot) {
      quota_->Give();
      ++refused_;
    }
    return slot;
  }

  // nullopt when the slot space is used up.
  std::optional<uint32_t> Insert(uint64_t key, bool init) {
    bool grew;
    const std::optional<uint32_t> allocated = slots_.Allocate(&grew);
    if (!allocated) return std::nullopt;
    const uint32_t slot = *allocated;
    if (grew) {
      flags_.AddChunk();
      rows_.AddChunk();
      ext_of_.AddChunk();
    }
    rows_.set_key(slot, key);
    *flags_.at(slot) = kDirty;
    if (ext_floats_ > 0) *ext_of_.at(slot) = kNoExt;
    if (init) accessor_->InitRow(key, Row(slot));
    index_.insert(slot);
    if (!deleted_.empty()) deleted_.erase(key);
    return slot;
  }

  // False when the extension slot space is used up (the row keeps none).
  bool AttachExt(uint32_t slot) {
    bool grew;
    const std::optional<uint32_t> e = ext_slots_.Allocate(&grew);
    if (!e) {
      ++refused_;
      return false;
    }
    if (grew) ext_.AddChunk();
    *ext_of_.at(slot) = *e;
    return true;
  }

  // record: remember the key as deleted for the next delta checkpoint.
  void Remove(uint32_t slot, bool record) {
    const uint64_t key = rows_.key(slot);
    index_.erase(slot);  // hashes the key, so before the slot is reused
    if (ext_floats_ > 0 && *ext_of_.at(slot) != kNoExt) ext_slots_.Free(*ext_of_.at(slot));
    slots_.Free(slot);
    quota_->Give();
    if (record) deleted_.insert(key);
  }

  // After a failed save: the key changed since the last good save.
  void Remark(uint64_t key) {
    if (std::optional<uint32_t> slot = Find(KeyProbe(key))) {
      *flags_.at(*slot) |= kDirty;
    } else {
      deleted_.insert(key);
    }
  }

  void ResetSaveUndo() {
    save_pending_ = false;
    save_was_base_ = false;
    saved_keys_ = {};
    saved_deleted_ = {};
  }

  // Fixed after construction.
  const Accessor* const accessor_;
  RowQuota* const quota_;  // the table's; owns its own synchronisation
  const uint32_t table_id_;
  const uint32_t shard_num_;
  const Partition partition_;
  const uint32_t first_, count_;  // the global shards held here
  const uint32_t min_count_;
  const bool pull_copies_row_;                  // Accessor::pull_copies_row(), asked once
  const OptimizerRule* const plain_push_rule_;  // Accessor::plain_push_rule(), asked once
  const SgdRule* const inline_sgd_;  // plain_push_rule_ when SGD without clipping or decay
  const size_t row_floats_;
  const size_t ext_floats_;
  const uint32_t shift_, ext_shift_;  // chunk sizes of the row and extension columns

  // Guarded by mu (annotated on the methods; the columns are referenced by
  // the index's hasher, so they are declared before it).
  SlotAllocator slots_;
  ChunkedColumn<uint8_t> flags_;
  KeyedRowColumn rows_;
  ChunkedColumn<uint32_t> ext_of_;  // extension slot per row; width 0 without extensions
  SlotAllocator ext_slots_;
  ChunkedColumn<float> ext_;
  absl::flat_hash_set<uint32_t, SlotHash, SlotEq> index_;
  absl::flat_hash_map<uint64_t, uint32_t> pending_;  // sightings of keys not admitted yet
  absl::flat_hash_set<uint64_t> deleted_;            // deleted since the last save
  uint64_t dropped_pushes_ = 0;
  uint64_t refused_ = 0;  // new keys refused a row (quota or slot space)

  // Undo record of a save in flight (between Serialize and Commit/AbortSave).
  bool save_pending_ = false;
  bool save_was_base_ = false;
  std::vector<uint64_t> saved_keys_;
  std::vector<uint64_t> saved_deleted_;
};

Status SparseTable::CheckCreate(const TableConfig& config, ShardRange owned) {
  FLEET_RETURN_IF_ERROR(ValidateTableConfig(config));
  if (config.kind != TableKind::kSparse)
    return Status::InvalidArgument("SparseTable needs a sparse table config", absl::StrCat("table ", config.id));
  if (owned.begin >= owned.end || owned.end > config.shard_num)
    return Status::InvalidArgument("owned shard range must be non-empty and within shard_num",
                                   absl::StrCat("table ", config.id, " [", owned.begin, ", ", owned.end,
                                                ") of ", config.shard_num));
  return Status::OK();
}

Result<std::unique_ptr<SparseTable>> SparseTable::Create(const TableConfig& config, ShardRange owned,
                                                         ThreadPool* pool) {
  FLEET_RETURN_IF_ERROR(CheckCreate(config, owned));
  return std::unique_ptr<SparseTable>(
      new SparseTable(config, owned, pool, std::shared_ptr<const Accessor>(MakeAccessor(config))));
}

SparseTable::SparseTable(const TableConfig& config, ShardRange owned, ThreadPool* pool,
                         std::shared_ptr<const Accessor> accessor)
    : config_(config),
      owned_(owned),
      pool_(pool),
      accessor_(std::move(accessor)),
      quota_(std::make_unique<RowQuota>(config.max_rows_per_server)),
      local_count_(std::min({config.local_shard_num, owned.size(), uint32_t{65535}})),
      sharder_(config.shard_num, config.partition) {
  // A block of consecutive global shards per local shard (LocalShardRange),
  // not every L-th one, so that under the range partition a request's
  // increasing keys reach each local shard as one run (Route's sorted path).
  local_of_.resize(owned.size());
  absl::MutexLock l(&shards_mu_);
  shards_.reserve(local_count_);
  for (uint32_t s = 0; s < local_count_; ++s) {
    const ShardRange held = LocalShardRange(s);
    for (uint32_t g = held.begin; g < held.end; ++g) local_of_[g - owned.begin] = static_cast<uint16_t>(s);
    shards_.push_back(
        std::make_unique<LocalShard>(accessor_.get(), config_, held.begin, held.size(), quota_.get()));
  }
}

SparseTable::~SparseTable() = default;

std::unique_ptr<SparseTable> SparseTable::NewEmptyLike() const {
  return std::unique_ptr<SparseTable>(new SparseTable(config_, owned_, pool_, accessor_));
}

// A request's keys grouped by local shard: keys of local shard s are
// order[offsets[s] .. offsets[s+1]); hashes[i] = Mix64(keys[i]), used for
// both the shard and the index lookup.
struct SparseTable::RoutedKeys {
  std::vector<uint32_t> order;
  std::vector<uint32_t> offsets;
  std::vector<uint64_t> hashes;
  std::vector<uint16_t> local;  // scratch: local shard by request index
};

Status SparseTable::Route(std::span<const uint64_t> keys, size_t values_size, size_t width,
                          RoutedKeys* routed) const {
  if (values_size != keys.size() * width)
    return Status::InvalidArgument(absl::StrCat("table ", config_.id, ": ", keys.size(), " keys need ",
                                                keys.size() * width, " floats (", width, " per key), got ",
                                                values_size));
  if (keys.size() > UINT32_MAX) return Status::InvalidArgument("too many keys in one request");
  const size_t n = keys.size();
  routed->hashes.resize(n);
  routed->order.resize(n);
  std::vector<uint32_t>& offsets = routed->offsets;
  // Increasing keys under the range partition (ps-lite's order and
  // partition): their shards never decrease along the request, nor do the
  // local shards holding them (blocks of shards), so each local shard's keys
  // are one run, found by binary search. No shard per key and no grouping:
  // ~25 instructions a key against ~40 below (callgrind, 500 keys).
  if (sharder_.partition() == Partition::kRange && n > 0 && sharder_(keys.front()) >= owned_.begin &&
      sharder_(keys.back()) < owned_.end && StrictlyIncreasing(keys)) {
    uint64_t* const hashes = routed->hashes.data();
    uint32_t* const order = routed->order.data();
    for (size_t i = 0; i < n; ++i) {
      hashes[i] = Mix64(keys[i]);
      order[i] = static_cast<uint32_t>(i);
    }
    offsets.resize(local_count_ + 1);
    offsets[0] = 0;
    for (uint32_t s = 1; s < local_count_; ++s) {
      offsets[s] = static_cast<uint32_t>(
          std::partition_point(keys.begin() + offsets[s - 1], keys.end(),
                               [&](uint64_t k) { return LocalOf(sharder_(k)) < s; }) -
          keys.begin());
    }
    offsets[local_count_] = static_cast<uint32_t>(n);
    return Status::OK();
  }
  routed->local.resize(n);
  // Locals, and the work in passes of few live values each: the stores
  // into the arrays may alias the members (the owned range, the divider),
  // which the compiler would reload after every store, and one pass doing
  // all of it ran out of registers (57 instructions a key, now 49).
  const KeySharder sharder = sharder_;
  const uint32_t begin = owned_.begin;
  const uint32_t owned = owned_.size();
  const uint64_t* const key = keys.data();
  uint64_t* const hashes = routed->hashes.data();
  uint16_t* const local = routed->local.data();
  // Each key's shard relative to the owned range, parked in `order` (filled
  // for real below).
  uint32_t* const relative = routed->order.data();
  bool foreign = false;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = Mix64(key[i]);
    hashes[i] = h;
    relative[i] = sharder.Of(key[i], h) - begin;  // wraps below begin
    foreign |= relative[i] >= owned;
  }
  if (foreign) {
    for (size_t i = 0; i < n; ++i) {
      if (relative[i] < owned) continue;
      const uint32_t s = relative[i] + begin;
      return Status::InvalidArgument(absl::StrCat("table ", config_.id, ": key ", keys[i], " is in shard ", s,
                                                  ", not held by this server (holds [", owned_.begin, ", ",
                                                  owned_.end, "))"));
    }
  }
  offsets.assign(local_count_ + 1, 0);
  uint32_t* const counts = offsets.data() + 1;
  const uint16_t* const local_of = local_of_.data();
  for (size_t i = 0; i < n; ++i) {
    local[i] = local_of[relative[i]];
    ++counts[local[i]];
  }
  for (size_t s = 0; s < local_count_; ++s) offsets[s + 1] += offsets[s];
  // While filling, offsets[s] is the next free place of shard s, so it ends
  // at the start of shard s + 1; shifting by one entry restores the starts.
  uint32_t* const next = offsets.data();
  uint32_t* const order = routed->order.data();
  for (size_t i = 0; i < n; ++i) order[next[local[i]]++] = static_cast<uint32_t>(i);
  for (size_t s = local_count_; s > 0; --s) offsets[s] = offsets[s - 1];
  offsets[0] = 0;
  return Status::OK();
}

void SparseTable::ForEachShard(const std::function<void(LocalShard&)>& fn) {
  absl::ReaderMutexLock l(&shards_mu_);
  auto run = [&](size_t i) ABSL_NO_THREAD_SAFETY_ANALYSIS { fn(*shards_[i]); };
  if (pool_ == nullptr) {
    for (size_t i = 0; i < shards_.size(); ++i) run(i);
  } else {
    pool_->ParallelFor(shards_.size(), run);
  }
}

Status SparseTable::ForEachShardOfKeys(
    std::span<const uint64_t> keys, size_t values_size, size_t width,
    absl::FunctionRef<void(LocalShard&, const uint64_t*, std::span<const uint32_t>)> fn) {
  // Reused per thread: a small request would otherwise spend a good part of
  // its time allocating these. (fn never re-enters the table.)
  thread_local RoutedKeys scratch;
  // A named reference: a lambda naming the thread_local itself would see
  // the running pool thread's copy.
  RoutedKeys& routed = scratch;
  FLEET_RETURN_IF_ERROR(Route(keys, values_size, width, &routed));
  const uint32_t* const offsets = routed.offsets.data();
  auto run = [&](size_t s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    LocalShard& sh = *shards_[s];
    ShardLock sl(&sh.mu);
    fn(sh, routed.hashes.data(),
       std::span<const uint32_t>(routed.order.data() + offsets[s], offsets[s + 1] - offsets[s]));
  };
  absl::ReaderMutexLock l(&shards_mu_);
  // Small requests are cheaper on the calling thread than handed out: 1000
  // keys of dim 1 take ~30 us here, about what waking a pool thread costs on
  // a VM. Estimated cost: ~30 ns per key plus ~0.5 ns per float moved.
  const size_t cost_ns = keys.size() * 30 + keys.size() * width / 2;
  if (pool_ == nullptr || cost_ns < 100'000) {
    for (size_t s = 0; s < local_count_; ++s) {
      if (offsets[s + 1] > offsets[s]) run(s);
    }
  } else {
    std::vector<uint32_t> groups;  // the local shards with keys
    for (size_t s = 0; s < local_count_; ++s) {
      if (offsets[s + 1] > offsets[s]) groups.push_back(static_cast<uint32_t>(s));
    }
    pool_->ParallelFor(groups.size(), [&](size_t g) { run(groups[g]); });
  }
  // Keep what a usual request needs, not the peak of a huge one.
  if (routed.hashes.capacity() > (size_t{1} << 20)) routed = RoutedKeys();
  return Status::OK();
}

Status SparseTable::RefusedKeys(uint64_t refused, const char* op) const {
  if (refused == 0) return Status::OK();
  // One line per 100 refusals: a flood must not flood the log too.
  LOG_EVERY_N(WARNING, 100) << "table " << config_.id << ": " << refused << " new keys of a "
                            << op << " refused a row (max_rows_per_server "
                            << quota_->max() << ", or a local shard's slot space)";
  const std::string limit =
      quota_->max() > 0 ? absl::StrCat("max_rows_per_server = ", quota_->max(),
                                       " rows reached; raise tables.<i>.max_rows_per_server if the "
                                       "server has the memory")
                        : "a local shard's 2^32 - 1 slot ids are used up";
  return Status::FailedPrecondition(
      absl::StrCat(op, ": ", refused, " new keys were not stored (", limit,
                   "); a pull got their initial values, a push to them was dropped"),
      absl::StrCat("table ", config_.id));
}

Status SparseTable::Pull(std::span<const uint64_t> keys, std::span<float> values) {
  std::atomic<uint64_t> refused{0};
  FLEET_RETURN_IF_ERROR(ForEachShardOfKeys(
      keys, values.size(), pull_dim(),
      [&](LocalShard& sh, const uint64_t* hashes, std::span<const uint32_t> which)
          ABSL_NO_THREAD_SAFETY_ANALYSIS {
            const uint64_t before = sh.refused();
            sh.Pull(keys, hashes, which, values.data());
            if (sh.refused() != before) refused += sh.refused() - before;
          }));
  return RefusedKeys(refused.load(), "pull");
}

Status SparseTable::CheckCounts(size_t keys, std::span<const float> shows,
                                std::span<const float> clicks) const {
  if (!shows.empty() && shows.size() != keys)
    return Status::InvalidArgument(
        absl::StrCat("table ", config_.id, ": ", shows.size(), " shows for ", keys, " keys"));
  if (!clicks.empty() && clicks.size() != keys)
    return Status::InvalidArgument(
        absl::StrCat("table ", config_.id, ": ", clicks.size(), " clicks for ", keys, " keys"));
  return Status::OK();
}

Status SparseTable::PushGrad(std::span<const uint64_t> keys, std::span<const float> grads,
                             std::span<const float> shows, std::span<const float> clicks) {
  FLEET_RETURN_IF_ERROR(CheckCounts(keys.size(), shows, clicks));
  std::atomic<uint64_t> refused{0};
  FLEET_RETURN_IF_ERROR(ForEachShardOfKeys(
      keys, grads.size(), push_dim(),
      [&](LocalShard& sh, const uint64_t* hashes, std::span<const uint32_t> which)
          ABSL_NO_THREAD_SAFETY_ANALYSIS {
            const uint64_t before = sh.refused();
            sh.PushGrad(keys, hashes, which, grads.data(), shows, clicks);
            if (sh.refused() != before) refused += sh.refused() - before;
          }));
  return RefusedKeys(refused.load(), "push");
}

Status SparseTable::PushDelta(std::span<const uint64_t> keys, std::span<const float> deltas,
                              std::span<const float> shows, std::span<const float> clicks) {
  FLEET_RETURN_IF_ERROR(CheckCounts(keys.size(), shows, clicks));
  std::atomic<uint64_t> refused{0};
  FLEET_RETURN_IF_ERROR(ForEachShardOfKeys(
      keys, deltas.size(), push_dim(),
      [&](LocalShard& sh, const uint64_t* hashes, std::span<const uint32_t> which)
          ABSL_NO_THREAD_SAFETY_ANALYSIS {
            const uint64_t before = sh.refused();
            sh.PushDelta(keys, hashes, which, deltas.data(), shows, clicks);
            if (sh.refused() != before) refused += sh.refused() - before;
          }));
  return RefusedKeys(refused.load(), "push_delta");
}

void SparseTable::EndPass() {
  ForEachShard([](LocalShard& sh) {
    ShardLock l(&sh.mu);
    sh.EndPass();
  });
}

uint64_t SparseTable::Shrink() {
  std::atomic<uint64_t> deleted{0};
  ForEachShard([&](LocalShard& sh) {
    ShardLock l(&sh.mu);
    deleted += sh.Shrink();
  });
  return deleted.load();
}

SparseTableStats SparseTable::Stats() const {
  SparseTableStats s;
  absl::ReaderMutexLock l(&shards_mu_);
  for (const auto& sh : shards_) {
    ShardLock sl(&sh->mu);
    sh->AddStats(&s);
  }
  return s;
}

LocalShard& SparseTable::shard(uint32_t global) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  CHECK(owned_.contains(global)) << "shard " << global << " not held by table " << config_.id;
  return *shards_[LocalOf(global)];
}

bool SparseTable::DebugRow(uint64_t key, std::vector<float>* row, std::vector<float>* ext) const {
  absl::ReaderMutexLock l(&shards_mu_);
  LocalShard& sh = shard(sharder_(key));
  ShardLock sl(&sh.mu);
  return sh.Lookup(key, row, ext);
}

Result<std::vector<ShardImage>> SparseTable::SerializeLocalShard(size_t local, SaveMode mode) {
  absl::ReaderMutexLock l(&shards_mu_);
  CHECK_LT(local, shards_.size());
  LocalShard& sh = *shards_[local];
  ShardLock sl(&sh.mu);
  return sh.Serialize(mode);
}

void SparseTable::CommitSave() {
  ForEachShard([](LocalShard& sh) {
    ShardLock l(&sh.mu);
    sh.CommitSave();
  });
}

void SparseTable::AbortSave() {
  ForEachShard([](LocalShard& sh) {
    ShardLock l(&sh.mu);
    sh.AbortSave();
  });
}

Status SparseTable::ApplyShardFile(uint32_t s, std::string_view image, std::string_view file) {
  if (!owned_.contains(s))
    return Status::InvalidArgument(absl::StrCat("shard ", s, " not held by this table"), file);
  absl::ReaderMutexLock l(&shards_mu_);
  LocalShard& sh = shard(s);
  ShardLock sl(&sh.mu);
  return sh.Apply(s, image, file);
}

void SparseTable::SwapRows(SparseTable& staging) {
  CHECK(staging.accessor_ == accessor_) << "SwapRows needs a table made by NewEmptyLike";
  absl::MutexLock l(&shards_mu_);
  absl::MutexLock sl(&staging.shards_mu_);
  shards_.swap(staging.shards_);
  quota_.swap(staging.quota_);  // each table keeps the counter its shards use
}

uint64_t SparseTable::MemoryRows() const {
  absl::ReaderMutexLock l(&shards_mu_);
  return quota_->rows();
}

Status SparseTable::FindAbsent(std::span<const uint64_t> keys, size_t values_size, size_t width,
                               std::vector<uint32_t>* absent) {
  absl::Mutex absent_mu;  // groups may run on the pool's threads
  return ForEachShardOfKeys(
      keys, values_size, width,
      [&](LocalShard& sh, const uint64_t* hashes, std::span<const uint32_t> which)
          ABSL_NO_THREAD_SAFETY_ANALYSIS {
            std::vector<uint32_t> found;
            sh.FindAbsent(keys, hashes, which, &found);
            if (found.empty()) return;
            absl::MutexLock l(&absent_mu);
            absent->insert(absent->end(), found.begin(), found.end());
          });
}

Status SparseTable::InsertAbsentRows(std::span<const RowRef> rows,
                                     std::vector<uint8_t>* inserted) {
  inserted->assign(rows.size(), 0);
  absl::ReaderMutexLock l(&shards_mu_);
  for (size_t i = 0; i < rows.size(); ++i) {
    LocalShard& sh = shard(sharder_(rows[i].key));
    ShardLock sl(&sh.mu);
    bool stored = false;
    if (!sh.InsertAbsent(rows[i], &stored)) {
      return Status::FailedPrecondition(
          absl::StrCat("key ", rows[i].key, " could not be brought back into memory: a local "
                       "shard's 2^32 - 1 slot ids are used up"),
          absl::StrCat("table ", config_.id));
    }
    (*inserted)[i] = stored ? 1 : 0;
  }
  return Status::OK();
}

uint64_t SparseTable::ExtractRows(size_t local, const RowPick& pick, const RowTake& take) {
  absl::ReaderMutexLock l(&shards_mu_);
  CHECK_LT(local, shards_.size());
  LocalShard& sh = *shards_[local];
  ShardLock sl(&sh.mu);
  return sh.Extract(pick, take);
}

void SparseTable::ForEachRowIn(size_t local, const RowTake& fn) const {
  absl::ReaderMutexLock l(&shards_mu_);
  CHECK_LT(local, shards_.size());
  LocalShard& sh = *shards_[local];
  ShardLock sl(&sh.mu);
  sh.Visit(fn);
}

void SparseTable::ForgetAdmissionCounts() {
  ForEachShard([](LocalShard& sh) {
    ShardLock l(&sh.mu);
    sh.ForgetPending();
  });
}

}  // namespace fleet::ps
