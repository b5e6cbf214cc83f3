// How keys and dense parameters are spread over global shards and servers.
// These functions are part of the checkpoint format: changing them makes old
// checkpoints load keys into the wrong shards (Load detects that and refuses).
//
// Thread safety: pure functions.
#pragma once

#include <libdivide.h>

#include <cstdint>

#include "comm/splitmix.h"
#include "comm/status.h"

namespace fleet::ps {

// Keys are placed by the splitmix64 finaliser: every output bit depends on
// every input bit, so sequential ids and ids that share low bits spread
// evenly over shards. Stable forever (comm/splitmix.h).
using ::fleet::Mix64;

// The global shard of a key. REQUIRES: shard_num >= 1.
constexpr uint32_t ShardOfKey(uint64_t key, uint32_t shard_num) {
  return static_cast<uint32_t>(Mix64(key) % shard_num);
}

// ShardOfKey for one shard_num with the division worked out once
// (libdivide): the same results, without a 64-bit divide per key on the
// paths that route every key of a request.
class KeySharder {
 public:
  explicit KeySharder(uint32_t shard_num)
      : shard_num_(shard_num), divider_(shard_num > 1 ? shard_num : 2) {}
  uint32_t operator()(uint64_t key) const { return OfHash(Mix64(key)); }
  // The same from Mix64(key), for callers that use the hash for more.
  uint32_t OfHash(uint64_t hash) const {
    if (shard_num_ == 1) return 0;  // the branch-free divider cannot divide by 1
    return static_cast<uint32_t>(hash - divider_.divide(hash) * shard_num_);
  }
  uint32_t shard_num() const { return static_cast<uint32_t>(shard_num_); }

 private:
  uint64_t shard_num_;
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
