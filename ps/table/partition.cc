#include "ps/table/partition.h"

#include "absl/strings/str_cat.h"
#include "comm/vector_clones.h"

namespace fleet::ps {
namespace {

Status CheckServer(int num_servers, int rank) {
  if (num_servers < 1) return Status::InvalidArgument("num_servers must be >= 1", absl::StrCat(num_servers));
  if (rank < 0 || rank >= num_servers)
    return Status::InvalidArgument("server rank out of range", absl::StrCat(rank, " of ", num_servers));
  return Status::OK();
}

}  // namespace

// 64 comparisons to a branch, into an integer (a bool accumulator is not
// vectorised), which AVX2 and AVX-512 do 4 and 8 at a time (1000 keys: 0.2
// us against 0.64 with eight scalar comparisons to a branch).
FLEET_VECTOR_CLONES bool StrictlyIncreasing(std::span<const uint64_t> keys) {
  constexpr size_t kBlock = 64;
  const uint64_t* const k = keys.data();
  size_t i = 1;
  for (; i + kBlock <= keys.size(); i += kBlock) {
    uint64_t out_of_order = 0;
    for (size_t j = 0; j < kBlock; ++j) out_of_order |= k[i + j - 1] >= k[i + j] ? 1 : 0;
    if (out_of_order != 0) return false;
  }
  for (; i < keys.size(); ++i) {
    if (k[i - 1] >= k[i]) return false;
  }
  return true;
}

Result<ShardRange> AssignShards(uint32_t shard_num, int num_servers, int rank) {
  FLEET_RETURN_IF_ERROR(CheckServer(num_servers, rank));
  if (shard_num < static_cast<uint32_t>(num_servers))
    return Status::InvalidArgument("shard_num smaller than the number of servers",
                                   absl::StrCat(shard_num, " < ", num_servers));
  return ShardRange{static_cast<uint32_t>(BlockStart(shard_num, num_servers, rank)),
                    static_cast<uint32_t>(BlockStart(shard_num, num_servers, rank + 1))};
}

Result<DenseRange> SplitDenseRange(uint64_t total, int num_servers, int rank) {
  FLEET_RETURN_IF_ERROR(CheckServer(num_servers, rank));
  return DenseRange{BlockStart(total, num_servers, rank), BlockStart(total, num_servers, rank + 1)};
}

}  // namespace fleet::ps
