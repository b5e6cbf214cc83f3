#include "ps/table/partition.h"

#include "absl/strings/str_cat.h"

namespace fleet::ps {
namespace {

Status CheckServer(int num_servers, int rank) {
  if (num_servers < 1) return Status::InvalidArgument("num_servers must be >= 1", absl::StrCat(num_servers));
  if (rank < 0 || rank >= num_servers)
    return Status::InvalidArgument("server rank out of range", absl::StrCat(rank, " of ", num_servers));
  return Status::OK();
}

// rank * n / S without overflow for any uint64 n (S is small).
uint64_t BlockStart(uint64_t n, int num_servers, int rank) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(n) * rank) / num_servers);
}

}  // namespace

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
