#include "ps/key_dedup.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "comm/splitmix.h"

namespace fleet::ps {
namespace {

// Values handed out in first-occurrence order, as PsClient does: every key
// maps to the position of its first occurrence among the distinct keys.
std::vector<uint32_t> Positions(KeyDeduper& d, const std::vector<uint64_t>& keys,
                                size_t* distinct) {
  d.Reset(keys.size());
  std::vector<uint32_t> out;
  uint32_t next = 0;
  for (uint64_t k : keys) {
    bool inserted;
    out.push_back(d.FindOrInsert(k, Mix64(k), next, &inserted));
    if (inserted) ++next;
  }
  *distinct = next;
  return out;
}

TEST(KeyDeduperTest, MatchesAHashMapAcrossReusedRequestsOfMixedSizes) {
  KeyDeduper d;  // one table for every request, as the client keeps per thread
  SplitMix64 rng(7);
  for (size_t n : {1000, 5, 70000, 0, 1, 3000, 16, 17}) {
    std::vector<uint64_t> keys(n);
    // Few distinct values (many duplicates), some colliding in the low bits.
    for (auto& k : keys) k = (rng.Next() % (n / 3 + 1)) << 20;
    absl::flat_hash_map<uint64_t, uint32_t> ref;
    std::vector<uint32_t> expected;
    for (uint64_t k : keys) expected.push_back(ref.try_emplace(k, ref.size()).first->second);
    size_t distinct;
    EXPECT_EQ(Positions(d, keys, &distinct), expected) << n << " keys";
    EXPECT_EQ(distinct, ref.size()) << n << " keys";
  }
}

TEST(KeyDeduperTest, KeysOfAnEarlierRequestAreForgotten) {
  KeyDeduper d;
  size_t distinct;
  Positions(d, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, &distinct);
  EXPECT_EQ(Positions(d, {10, 3, 10}, &distinct), (std::vector<uint32_t>{0, 1, 0}));
  EXPECT_EQ(distinct, 2u);
}

}  // namespace
}  // namespace fleet::ps
