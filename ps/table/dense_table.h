// DenseTable: elements [range.begin, range.end) of a dense parameter vector
// of config.dim elements, the slice one server holds (SplitDenseRange in
// partition.h), with its optimizer state.
//
// The optimizer treats the whole slice as one row: one Adam step count for
// the slice, and clip-by-norm over the slice (see OptimizerConfig).
//
// Thread safety: thread-safe; one mutex serialises all calls, each of which
// takes O(range size) time and never waits for anything else.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/file_system.h"
#include "comm/status.h"
#include "ps/table/optimizer.h"
#include "ps/table/partition.h"
#include "ps/table/save_state.h"
#include "ps/table/table_config.h"

namespace fleet::ps {

class DenseTable {
 public:
  // Initial values come from config.initializer (element i from key i, so
  // they do not depend on the number of servers).
  // Errors: InvalidArgument for an invalid or sparse config, or a range
  // that does not fit in [0, config.dim).
  static Result<std::unique_ptr<DenseTable>> Create(const TableConfig& config, DenseRange range);

  const TableConfig& config() const { return config_; }
  DenseRange range() const { return range_; }

  // Copies the slice into out. Errors: InvalidArgument when out.size() !=
  // range().size() (out untouched).
  Status Pull(std::span<float> out) const;
  // Applies a gradient for the whole slice. Errors: InvalidArgument when
  // grad.size() != range().size(); the table is then unchanged.
  Status PushGrad(std::span<const float> grad);
  // value += delta over the slice (geo mode). Errors as PushGrad.
  Status PushDelta(std::span<const float> delta);
  // Overwrites the slice's values (a worker setting the model's initial
  // values); optimizer state is kept. Errors as PushGrad.
  Status Assign(std::span<const float> values);
  // Bytes held by values and optimizer state.
  uint64_t memory_bytes() const;

  // ---- Checkpoint hooks (used by Checkpointer; see checkpoint.h) ----

  // The slice with its state as a dense file image.
  std::string Serialize() const;
  // Copies into this table the part of a dense file image that overlaps
  // range(); returns the number of elements covered through *covered. This
  // must be a staging table nobody else uses yet.
  // Errors: Corruption naming `file` for a malformed image or one of
  // another table, dim or optimizer state layout.
  Status ApplyFile(std::string_view image, std::string_view file, uint64_t* covered);
  // An empty (freshly initialised) table like this one, for staging a load.
  std::unique_ptr<DenseTable> NewEmptyLike() const;
  // Swaps values and state with staging's. REQUIRES: same config and range.
  void SwapValues(DenseTable& staging);

  SaveState& save_state() { return save_state_; }

 private:
  DenseTable(const TableConfig& config, DenseRange range);
  Status CheckSize(size_t n, const char* what) const;

  // Fixed after construction.
  const TableConfig config_;
  const DenseRange range_;
  const std::unique_ptr<OptimizerRule> rule_;

  // Owns its own synchronisation.
  SaveState save_state_;

  mutable std::mutex mu_;
  std::vector<float> values_;  // guarded by mu_; range_.size() floats
  std::vector<float> state_;   // guarded by mu_; rule_->state_size(range_.size()) floats
};

// Writes the slice as a NumPy .npy file (format 1.0, dtype '<f4', shape
// (n,)) through the caller's file system, atomically (temp file, sync,
// rename, directory sync). Declared here, defined in checkpoint.cc.
Status ExportDenseNpy(const DenseTable& table, FileSystem* fs, const std::string& path);

}  // namespace fleet::ps
