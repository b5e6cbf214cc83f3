#include "data/sharded_lines.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/data/test_util.h"
#include "data/ctr_reader.h"

namespace fleet::data {
namespace {

using testing::TempDir;

// Writes one file per entry of `line_counts` (gzip for odd files), each line
// unique; returns the paths and all lines in global order.
std::vector<std::string> MakeFiles(const TempDir& dir, const std::vector<int>& line_counts,
                                   std::vector<std::string>* all_lines) {
  std::vector<std::string> paths;
  for (size_t f = 0; f < line_counts.size(); ++f) {
    std::vector<std::string> lines;
    for (int l = 0; l < line_counts[f]; ++l) {
      lines.push_back("file" + std::to_string(f) + " line" + std::to_string(l));
    }
    all_lines->insert(all_lines->end(), lines.begin(), lines.end());
    paths.push_back(dir.File("part-" + std::to_string(f)));
    if (f % 2) {
      testing::WriteGzip(paths.back(), testing::JoinLines(lines));
    } else {
      testing::WritePlain(paths.back(), testing::JoinLines(lines));
    }
  }
  return paths;
}

// A LineRef copied out, so it outlives the reader.
struct ShardLine {
  std::string text;
  std::string file;
  int64_t line_number;
  int64_t global_index;
};

std::vector<ShardLine> ReadShard(const std::vector<std::string>& files, int rank, int world) {
  auto reader = ShardedLineReader::Create(files, rank, world);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<ShardLine> out;
  LineRef ref;
  for (;;) {
    auto got = (*reader)->Next(&ref);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok() || !*got) break;
    out.push_back({std::string(ref.text), *ref.file, ref.line_number, ref.global_index});
  }
  return out;
}

TEST(ShardedLineReaderTest, EveryLineReadByExactlyOneWorker) {
  const std::vector<std::vector<int>> file_sets = {
      {}, {0}, {1}, {0, 0}, {1, 0, 1}, {0, 1, 5, 0, 3, 7}, {2, 2, 2, 2}};
  for (const auto& counts : file_sets) {
    TempDir dir;
    std::vector<std::string> all;
    const auto files = MakeFiles(dir, counts, &all);
    for (int world = 1; world <= 4; ++world) {
      SCOPED_TRACE("files " + std::to_string(counts.size()) + " lines " +
                   std::to_string(all.size()) + " world " + std::to_string(world));
      std::vector<std::string> merged;
      for (int rank = 0; rank < world; ++rank) {
        const auto refs = ReadShard(files, rank, world);
        // Balanced within one line, and each line is the one the rule names.
        const size_t expected = (all.size() + world - 1 - rank) / world;
        EXPECT_EQ(refs.size(), expected) << "rank " << rank;
        for (size_t j = 0; j < refs.size(); ++j) {
          EXPECT_EQ(refs[j].global_index, static_cast<int64_t>(j * world + rank));
          EXPECT_EQ(refs[j].text, all[refs[j].global_index]);
          merged.push_back(refs[j].text);
        }
      }
      std::sort(merged.begin(), merged.end());
      std::vector<std::string> sorted_all = all;
      std::sort(sorted_all.begin(), sorted_all.end());
      EXPECT_EQ(merged, sorted_all);  // union is everything, with no duplicate
    }
  }
}

TEST(ShardedLineReaderTest, ReportsFileAndLineNumberAndRewinds) {
  TempDir dir;
  std::vector<std::string> all;
  const auto files = MakeFiles(dir, {2, 0, 3}, &all);
  const auto refs = ReadShard(files, 1, 2);
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs[0].file, files[0]);
  EXPECT_EQ(refs[0].line_number, 2);
  EXPECT_EQ(refs[1].file, files[2]);
  EXPECT_EQ(refs[1].line_number, 2);

  auto reader = ShardedLineReader::Create(files, 0, 1);
  ASSERT_TRUE(reader.ok());
  LineRef ref;
  for (int epoch = 0; epoch < 2; ++epoch) {
    int n = 0;
    while (*(*reader)->Next(&ref)) ++n;
    EXPECT_EQ(n, 5);
    (*reader)->Rewind();
  }
}

TEST(ShardedLineReaderTest, RejectsBadRank) {
  for (const auto& [rank, world] : {std::pair{0, 0}, std::pair{-1, 2}, std::pair{2, 2}}) {
    auto r = ShardedLineReader::Create({}, rank, world);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  }
}

// W workers with batch B see, step by step, the samples of one worker with
// batch W * B: the property sync-mode equivalence tests rely on.
TEST(ShardedLineReaderTest, WorkersWithBatchBMatchOneWorkerWithBatchWB) {
  TempDir dir;
  std::vector<std::string> lines;
  for (int i = 0; i < 23; ++i) lines.push_back(testing::CriteoLine(i));
  testing::WritePlain(dir.File("a"), testing::JoinLines({lines.begin(), lines.begin() + 10}));
  testing::WritePlain(dir.File("b"), testing::JoinLines({lines.begin() + 10, lines.end()}));
  const std::vector<std::string> files = {dir.File("a"), dir.File("b")};
  constexpr int kWorld = 2, kBatch = 3;
  auto batches_of = [&](int rank, int world, int batch) {
    CtrReaderOptions o;
    o.rank = rank;
    o.world_size = world;
    o.batch_size = batch;
    auto reader = CtrReader::Open(files, o);
    EXPECT_TRUE(reader.ok());
    std::vector<std::vector<uint64_t>> out;  // slot-0 keys per batch
    CtrBatch b;
    while (*(*reader)->Next(&b) > 0) out.push_back(b.slots[0].keys);
    return out;
  };
  const auto whole = batches_of(0, 1, kWorld * kBatch);
  const auto r0 = batches_of(0, kWorld, kBatch);
  const auto r1 = batches_of(1, kWorld, kBatch);
  ASSERT_EQ(whole.size(), r0.size());
  for (size_t step = 0; step < whole.size(); ++step) {
    std::vector<uint64_t> joined = r0[step];
    if (step < r1.size()) joined.insert(joined.end(), r1[step].begin(), r1[step].end());
    std::vector<uint64_t> expected = whole[step];
    std::sort(joined.begin(), joined.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(joined, expected) << "step " << step;
  }
}

}  // namespace
}  // namespace fleet::data
