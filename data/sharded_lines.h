// ShardedLineReader: reads the lines of a list of files that belong to one
// worker, so that over one epoch every line is read by exactly one worker.
//
// Rule: the lines of all files are numbered in order, files in the order
// given (ExpandFileSpec sorts each directory or glob), starting at 0 with the
// first line of the first file and not restarting at a file boundary. Worker
// `rank` of `world_size` owns the lines whose global index i has
// i % world_size == rank. Every physical line counts, empty ones included, so
// the split depends only on the files' bytes, never on which lines parse.
//
// Why round-robin rather than contiguous byte ranges: workers get equal
// shares (within one line) even when files differ in size or a file is
// empty, and the j-th line of worker r is global line j * W + r, so W
// workers reading batches of B see, step by step, exactly the lines one
// worker would see with batches of W * B. The cost is that every worker scans
// (but does not parse) every file; scanning runs at memchr speed.
//
// Not thread-safe; one reader per worker thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "comm/file_io.h"

namespace fleet::data {

struct LineRef {
  std::string_view text;              // without "\n" / "\r\n"; valid until the next Next()
  const std::string* file = nullptr;  // path of the file holding the line
  int64_t line_number = 0;            // 1-based, within that file
  int64_t global_index = 0;           // 0-based, across all files
};

class ShardedLineReader {
 public:
  // InvalidArgument unless 0 <= rank < world_size. Files are opened lazily,
  // so a missing file is reported by Next() when the reader reaches it.
  static Result<std::unique_ptr<ShardedLineReader>> Create(std::vector<std::string> files, int rank,
                                                           int world_size);

  // Fills *out with this worker's next line and returns true, or returns
  // false when all files are done (until Rewind()). Errors are those of
  // InputFile::Open and LineReader::Next, prefixed with nothing extra (the
  // message already names the file); after an error, call Rewind() or stop.
  Result<bool> Next(LineRef* out);

  // Starts again from the first line of the first file (a new epoch).
  void Rewind();

  const std::vector<std::string>& files() const { return files_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  ShardedLineReader(std::vector<std::string> files, int rank, int world_size);

  // Fixed after construction.
  const std::vector<std::string> files_;
  const int rank_;
  const int world_size_;

  // Position in the epoch.
  size_t file_index_ = 0;               // file the current reader_ reads
  std::unique_ptr<LineReader> reader_;  // null between files
  int64_t next_global_index_ = 0;       // index the next physical line gets
};

}  // namespace fleet::data
