// TableConfig: everything that defines one parameter-server table, and the
// parser that builds it from a YAML node (one entry of the job config's
// `tables:` list).
//
// The comments of the structs below are where a table's keys are documented.
// Every key is optional except `id`, `kind` and `dim`. Unknown keys are
// refused (InvalidArgument naming the key, and the file or -o that set it)
// so a typo never silently falls back to a default. Read with the one
// config reader (comm/yaml_config.h).
//
// Thread safety: plain values; copy freely.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

#include "comm/status.h"
#include "comm/yaml_config.h"
#include "ps/table/partition.h"

namespace fleet::ps {

enum class TableKind { kDense, kSparse };
enum class AccessorKind { kPlain, kCtr };
enum class OptimizerKind { kSgd, kAdagrad, kAdam };
enum class ClipMode { kNone, kValue, kNorm };
enum class InitializerKind { kZeros, kUniform, kGaussian };
enum class StorageKind { kMemory, kSsd };

struct OptimizerConfig {
  // `optimizer.rule`: sgd | adagrad | adam. Default sgd.
  // sgd keeps no state; adagrad keeps one float per value element; adam two
  // per element plus two per row (the bias-correction powers). More state
  // means more memory per sparse row: for dim 8, sgd 32 B, adagrad 64 B,
  // adam 104 B of floats per row.
  OptimizerKind rule = OptimizerKind::kSgd;

  // `optimizer.learning_rate`: default 0.01. The step size for all rules.
  float learning_rate = 0.01f;

  // `optimizer.l2_decay`: default 0 (off). Adds l2_decay * w to the gradient
  // after clipping (coupled L2, as in classic SGD weight decay). Raise it to
  // fight overfitting of rare sparse features; it also shrinks rows that are
  // only pulled, never pushed, not at all (decay happens on push only).
  float l2_decay = 0.0f;

  // `optimizer.clip_mode`: none | value | norm. Default none.
  //   value: each gradient element is clamped to [-clip_threshold, clip_threshold].
  //   norm:  the gradient of one push for one sparse row (or for the whole
  //          range a dense server holds) is scaled so its L2 norm is at most
  //          clip_threshold. For dense tables the norm is per server slice, so
  //          results depend on the number of servers; prefer `value` there.
  // Clipping happens before L2 decay is added.
  ClipMode clip_mode = ClipMode::kNone;
  // `optimizer.clip_threshold`: default 0; must be > 0 when clip_mode != none.
  float clip_threshold = 0.0f;

  // `optimizer.initial_g2sum` (adagrad): default 0.1. The accumulator's start
  // value. Larger makes the first steps smaller and more uniform.
  float initial_g2sum = 0.1f;

  // `optimizer.beta1`, `optimizer.beta2` (adam): defaults 0.9, 0.999. Decay
  // of the first and second moment estimates; each in [0, 1).
  float beta1 = 0.9f;
  float beta2 = 0.999f;

  // `optimizer.epsilon` (adagrad, adam): default 1e-8. Added to the
  // denominator; raise it (1e-6..1e-4) if rows with tiny gradients take
  // huge steps.
  float epsilon = 1e-8f;
};

struct InitializerConfig {
  // `initializer.kind`: zeros | uniform | gaussian. Default zeros.
  // The initial value of a row depends only on (seed, key, element), never on
  // which server creates it or when, so re-sharding and admission never
  // change it.
  InitializerKind kind = InitializerKind::kZeros;
  // `initializer.seed`: default 0. Change it to decorrelate two tables.
  uint64_t seed = 0;
  // `initializer.range` (uniform): values in [-range, range). Default 0.01.
  float range = 0.01f;
  // `initializer.std` (gaussian): mean 0, this standard deviation. Default 0.01.
  float stddev = 0.01f;
};

struct CtrAccessorConfig {
  // `ctr.embed_dim`: default 1. Width of `embed_w`, the part every row has.
  // The extended embedding `embedx` has the table's `dim`.
  int embed_dim = 1;
  // `ctr.nonclk_coeff`, `ctr.click_coeff`: defaults 0.1, 1.0.
  //   score = nonclk_coeff * (show - click) + click_coeff * click.
  // Raise click_coeff to keep clicked features longer.
  float nonclk_coeff = 0.1f;
  float click_coeff = 1.0f;
  // `ctr.embedx_threshold`: default 10. A row gets its `embedx` (and its
  // optimizer state) once its score reaches this. Lower means more memory
  // and more rows learning the wide embedding; 0 creates it on first push.
  float embedx_threshold = 10.0f;
  // `ctr.show_click_decay`: default 0.98, in (0, 1]. end_pass multiplies
  // show and click by it; smaller forgets faster.
  float show_click_decay = 0.98f;
  // `ctr.delete_after_unseen_passes`: default 30. shrink deletes a row not
  // pushed for this many passes.
  int delete_after_unseen_passes = 30;
  // `ctr.delete_threshold`: default 0 (off). shrink deletes a row whose
  // score is below this. Note a row created by a pull and never pushed has
  // score 0.
  float delete_threshold = 0.0f;
};

// Where a sparse table's rows live (`storage:`). Memory keeps every row in
// RAM (SparseTable). Ssd keeps the hot rows in RAM and the rest in a RocksDB
// database on local disk (SsdSparseTable, ps/table/ssd_sparse_table.h): a
// table can then be many times larger than the server's memory. Pulls and
// pushes work on every row wherever it is; a row on disk is read back into
// memory by the first request that needs it. Checkpoints (save, load, any
// server count) and push-log recovery are the same as for a memory table.
//
// Which rows stay in memory is decided by the CTR accessor's statistics, the
// ones its shrink uses: rows not pushed for more passes, then rows of lower
// show/click score, go down first. Ssd therefore needs `accessor: ctr`.
struct StorageConfig {
  // `storage.kind`: memory | ssd. Default memory.
  StorageKind kind = StorageKind::kMemory;
  // `storage.path` (ssd, required): a directory on local disk. Server r
  // keeps its database in `<path>/s<r>` (one database per server and path,
  // shared by every table naming the path: each table in column families
  // of its own, keyed by global shard then key). That folder is scratch: a
  // server starting (or restarting) empties it, since checkpoints and the
  // push log are what survive a crash. A folder FleetPS did not create
  // there is refused rather than emptied. Every server of a job on one
  // machine may name the same path.
  std::string path;
  // `storage.cache_rows` (ssd): default 1000000, >= 1. The most rows one
  // server keeps in memory for this table. Once a request leaves more than
  // this, the coldest rows are written to disk until cache_rows * 9 / 10
  // remain (batched, so the ranking is paid once per tenth of the cache).
  // The memory this bounds is about cache_rows * (Stats().bytes / rows);
  // set it from the memory the server may use, and above the rows one
  // pass of the hot keys touches, or they go back and forth to disk.
  uint64_t cache_rows = 1000000;
  // `storage.evict_unseen_passes` (ssd): default 1, >= 1. At the end of a
  // pass (EndPass) rows not pushed for this many passes go to disk whatever
  // the cache's room: 1 keeps only the rows the last pass trained.
  uint32_t evict_unseen_passes = 1;
  // `storage.block_cache_mb` (ssd): default 8, >= 1. RocksDB's cache of
  // disk blocks for this server's database (shared by its tables; the
  // largest value among them wins). Larger makes misses cheaper when the
  // page cache is small; it counts against the server's memory.
  uint32_t block_cache_mb = 8;
  // `storage.write_buffer_mb` (ssd): default 8, >= 1. Size of one RocksDB
  // memtable of this table (up to two are held at once): rows written down
  // are buffered this much before they reach a file. Also counted against
  // the server's memory.
  uint32_t write_buffer_mb = 8;
};

// Bounds of the size keys below, checked by ValidateTableConfig.
inline constexpr uint64_t kMaxSparseDim = uint64_t{1} << 20;
inline constexpr uint64_t kMaxDenseDim = uint64_t{1} << 30;
inline constexpr uint32_t kMaxShardNum = uint32_t{1} << 20;
inline constexpr uint32_t kMaxLocalShardNum = 65535;

struct TableConfig {
  // `id`: required, >= 0. How workers and checkpoints name the table.
  uint32_t id = 0;
  // `kind`: required, dense | sparse.
  TableKind kind = TableKind::kSparse;
  // `dim`: required, >= 1. Sparse plain: floats per key. Sparse ctr: width of
  // `embedx` (a pull returns embed_dim + dim floats). Dense: total number of
  // parameters of the table (split over servers). At most kMaxSparseDim
  // (2^20) for a sparse table and kMaxDenseDim (2^30, 4 GiB of floats before
  // optimizer state) for a dense one: larger values are refused by the
  // parser rather than failing an allocation at start.
  uint64_t dim = 0;
  // `accessor`: plain | ctr (sparse only). Default plain.
  AccessorKind accessor = AccessorKind::kPlain;
  // `shard_num` (sparse): default 1000, >= 1. Fixed for the life of the
  // table and of its checkpoints: a key lives in one shard (see `partition`)
  // and a checkpoint is one file per shard. More shards balance better over
  // many servers and let more threads work at once; fewer mean fewer files.
  // Must be >= the largest number of servers the table will ever run on,
  // and <= kMaxShardNum (2^20).
  uint32_t shard_num = 1000;
  // `local_shard_num` (sparse): default 16, >= 1. How many in-memory parts a
  // server splits its global shards into (each part a block of consecutive
  // global shards, SparseTable::LocalShardRange; capped at the number of
  // global shards held). Each part has its own lock, row
  // arena and index, and a request visits each part it touches once, so
  // fewer parts make small requests cheaper and more parts let more threads
  // work at once (a visit costs ~230 instructions: a 500-key push took 11%
  // fewer server instructions with 16 parts than with 64; raise it for a
  // server with more than ~16 table threads). Not part of the checkpoint
  // format: change it freely. At most kMaxLocalShardNum (65535).
  uint32_t local_shard_num = 16;
  // `partition` (sparse): hash (default) | range. Which shard a key lives
  // in, fixed for the life of the table and of its checkpoints like
  // shard_num (ps/table/partition.h):
  //  * hash: shard Mix64(key) % shard_num. Any set of keys spreads evenly
  //    over shards and servers, sequential ids included.
  //  * range: shard floor(key * shard_num / 2^64), so each server holds one
  //    range of the key space (ps-lite's scheme), and a worker splits a
  //    request whose keys are in increasing order by binary search into one
  //    run per server, sent from the caller's arrays without a per-key
  //    pass. For keys spread over the whole uint64 range (hashed feature
  //    ids, as CTR inputs are): small sequential ids would all land on the
  //    first server.
  Partition partition = Partition::kHash;
  // `admission.min_count` (sparse): default 1 (admit at once). A missing key
  // is stored only once it has been seen (pulled or pushed) this many times;
  // until then a pull returns its initial value and a push is dropped.
  // Raise it (2..10) to keep one-off keys out of memory. The counts of keys
  // not yet admitted are not checkpointed.
  uint32_t admission_min_count = 1;
  // `max_rows_per_server` (sparse): default 0, which a server replaces by a
  // quota derived from its machine's memory and the row size (half of the
  // memory over its sparse tables; ps/server.h DefaultMaxRowsPerServer) and
  // logs. The most rows of this table one server stores. Once a server
  // holds this many, a pull or push of a key it does not hold yet is
  // answered FailedPrecondition naming the table and the quota (the key is
  // not stored: a pull got its initial value, a push to it was dropped;
  // keys already stored are served as usual), and the server logs it. Set
  // it to what a server's memory allows (Stats() bytes / rows gives the cost
  // of a row) when several servers or other programs share a machine, or to
  // protect servers from a runaway or hostile client creating keys without
  // end sooner. A local shard also refuses new keys, with the same error,
  // once its 2^32 - 1 slot ids are used.
  uint64_t max_rows_per_server = 0;

  OptimizerConfig optimizer;
  InitializerConfig initializer;
  CtrAccessorConfig ctr;
  // `storage` (sparse): see StorageConfig. With kind ssd, max_rows_per_server
  // must stay 0 (storage.cache_rows bounds memory; the disk has no row
  // quota) and a server derives no default for it.
  StorageConfig storage;
};

// Parses one table entry (a section of a job document, "tables.0") and
// refuses its unknown keys. Errors: InvalidArgument naming the key (e.g.
// "tables.0.optimizer.beta1: must be in [0, 1) (from job.yaml)") for a
// missing required key, an unknown key, a value of the wrong type or out of
// range.
Result<TableConfig> ParseTableConfig(ConfigSection& entry);
// The same for a table on its own (a checkpoint manifest's); errors name
// the key only.
Result<TableConfig> ParseTableConfig(const YAML::Node& node);

// Checks cross-field rules (used by the parser and by table constructors for
// configs built in code). Errors: InvalidArgument naming the key.
Status ValidateTableConfig(const TableConfig& config);

// The config as a YAML document that ParseTableConfig reads back to an equal
// config (used in checkpoint manifests).
std::string TableConfigToYaml(const TableConfig& config);

// OK when a checkpoint saved with `saved` can be loaded into a table built
// with `current`: same kind, dim, accessor (and embed_dim), optimizer rule
// and shard_num. Learning rate, decay, clipping, initializer, admission and
// storage may change between runs (a memory table's checkpoint loads into
// an ssd table and back). Errors: InvalidArgument naming the field and both
// values.
Status CheckCheckpointCompatible(const TableConfig& saved, const TableConfig& current);

}  // namespace fleet::ps
