// Helpers shared by the data/ tests: a self-deleting temporary
// directory and writers for plain and gzip files.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fleet::data::testing {

// A fresh directory under the test temp dir, removed with its contents on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string File(std::string_view name) const;

 private:
  std::string path_;
};

// Write `bytes` to `path` (plain or gzip); fail the test on error.
void WritePlain(const std::string& path, std::string_view bytes);
void WriteGzip(const std::string& path, std::string_view bytes);

// `relative` under the source tree (FLEET_SOURCE_DIR, set by fleet_add_test;
// "." when unset): SourcePath("configs/gpt").
std::string SourcePath(std::string_view relative);

// A file of tests/data/fixtures/.
std::string Fixture(std::string_view name);

// Reads a whole plain file; fails the test on error.
std::string ReadPlain(const std::string& path);

// A valid Criteo line (no newline) whose values depend on i: label i % 2,
// dense I1 = i, C1 = hex(i).
std::string CriteoLine(int i);

// Joins lines, each followed by "\n".
std::string JoinLines(const std::vector<std::string>& lines);

}  // namespace fleet::data::testing
