// How keys and dense parameters are spread over global shards and servers.
// These functions are part of the checkpoint format: changing them makes old
// checkpoints load keys into the wrong shards (Load detects that and refuses),
// and a checkpoint records its tables' partition (Load refuses another).
//
// Thread safety: pure functions.
#pragma once

#include <libdivide.h>

#include <cstdint>
#include <span>

#include "comm/splitmix.h"
#include "comm/status.h"

namespace fleet::ps {

// Keys are placed by the splitmix64 finaliser: every output bit depends on
// every input bit, so sequential ids and ids that share low bits spread
// evenly over shards. Stable forever (comm/splitmix.h).
using ::fleet::Mix64;

// How a sparse table's keys map to its global shards (TableConfig's
// `partition`). Part of the checkpoint format, like shard_num.
enum class Partition {
  // Shard Mix64(key) % shard_num: any set of keys spreads evenly.
  kHash,
  // Shard floor(key * shard_num / 2^64): each shard is one range of the key
  // space, and so is each server's block of shards (ps-lite's scheme). A
  // request's keys in increasing order then fall into one run per server,
  // sent without touching each key; even only when the keys spread over the
  // whole uint64 range (hashed feature ids), not for small sequential ids.
  kRange,
};

// The global shard of a key under the hash partition. REQUIRES: shard_num >= 1.
constexpr uint32_t ShardOfKey(uint64_t key, uint32_t shard_num) {
  return static_cast<uint32_t>(Mix64(key) % shard_num);
}

// The global shard of a key under the range partition. REQUIRES: shard_num >= 1.
constexpr uint32_t RangeShardOfKey(uint64_t key, uint32_t shard_num) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(key) * shard_num) >> 64);
}

constexpr uint32_t ShardOfKey(uint64_t key, uint32_t shard_num, Partition partition) {
  return partition == Partition::kRange ? RangeShardOfKey(key, shard_num)
                                        : ShardOfKey(key, shard_num);
}

// Under the range partition, the smallest key of `shard`: the keys of shard
// s are [FirstKeyOfShard(s), FirstKeyOfShard(s + 1)), the last shard's up
// to UINT64_MAX. It is ceil(s * 2^64 / shard_num): key * shard_num >= s *
// 2^64 exactly from there. REQUIRES: shard < shard_num.
constexpr uint64_t FirstKeyOfShard(uint32_t shard, uint32_t shard_num) {
  const unsigned __int128 scaled = static_cast<unsigned __int128>(shard) << 64;
  return static_cast<uint64_t>((scaled + shard_num - 1) / shard_num);
}

// Where part `part` of n items split into `parts` near-equal blocks begins:
// part * n / parts, without overflow for any uint64 n. Servers' shards and
// dense ranges, and a server's local shards, are split this way.
constexpr uint64_t BlockStart(uint64_t n, int parts, int part) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(n) * part) / parts);
}

// Whether keys are in strictly increasing order, so repeat none: the order
// ps-lite demands and sorted-unique batches have. Under the range partition
// such keys fall into one run per shard, and so per server (the client's
// split) and per block of shards (a table's local shards). One pass over
// the keys, vectorised (1000 keys: ~0.2 us).
bool StrictlyIncreasing(std::span<const uint64_t> keys);

// ShardOfKey for one shard_num and partition with the division worked out
// once (libdivide): the same results, without a 64-bit divide per key on
// the paths that route every key of a request.
class KeySharder {
 public:
  KeySharder(uint32_t shard_num, Partition partition)
      : shard_num_(shard_num), partition_(partition), divider_(shard_num > 1 ? shard_num : 2) {}
  uint32_t operator()(uint64_t key) const {
    return partition_ == Partition::kRange ? RangeShardOfKey(key, shard_num()) : OfHash(Mix64(key));
  }
  // The same for a caller that has hash = Mix64(key) at hand (for more).
  uint32_t Of(uint64_t key, uint64_t hash) const {
    return partition_ == Partition::kRange ? RangeShardOfKey(key, shard_num()) : OfHash(hash);
  }
  uint32_t shard_num() const { return static_cast<uint32_t>(shard_num_); }
  Partition partition() const { return partition_; }

 private:
  // Mix64(key) % shard_num.
  uint32_t OfHash(uint64_t hash) const {
    if (shard_num_ == 1) return 0;  // the branch-free divider cannot divide by 1
    return static_cast<uint32_t>(hash - divider_.divide(hash) * shard_num_);
  }

  uint64_t shard_num_;
  Partition partition_;
  // Branch-free: a multiply, an add and shifts per key, where the other
  // kind tests which of its algorithms the divisor needs on every call
  // (16 against ~6 instructions a key, on paths that route every key).
  libdivide::branchfree_divider<uint64_t> divider_;
};

// Global shards [begin, end) held by one server.
struct ShardRange {
  uint32_t begin = 0;
  uint32_t end = 0;
  uint32_t size() const { return end - begin; }
  bool contains(uint32_t shard) const { return shard >= begin && shard < end; }
};

// Shards of server `rank` among `num_servers`: the contiguous block
// [rank * shard_num / S, (rank + 1) * shard_num / S). Every shard goes to
// exactly one server and block sizes differ by at most one.
// Errors: InvalidArgument when num_servers < 1, rank is out of [0, S), or
// shard_num < num_servers (a server would own no shard).
Result<ShardRange> AssignShards(uint32_t shard_num, int num_servers, int rank);

// Elements [begin, end) of a dense table held by one server.
struct DenseRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

// Range of server `rank` for a dense table of `total` elements: the block
// [rank * total / S, (rank + 1) * total / S). Servers may get an empty range
// when total < S. Errors: InvalidArgument for num_servers < 1 or rank out of range.
Result<DenseRange> SplitDenseRange(uint64_t total, int num_servers, int rank);

}  // namespace fleet::ps
