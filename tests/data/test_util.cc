#include "tests/data/test_util.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "data/ctr_reader.h"
#include "tests/child_process.h"

namespace fleet::data::testing {

TempDir::TempDir() {
  std::string tmpl = ::testing::TempDir() + "fleet_data_XXXXXX";
  char* made = ::mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::File(std::string_view name) const { return path_ + "/" + std::string(name); }

void WritePlain(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "writing " << path;
}

void WriteGzip(const std::string& path, std::string_view bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << "gzopen " << path;
  if (!bytes.empty()) {
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK) << "gzclose " << path;
}

std::string ReadPlain(const std::string& path) {
  EXPECT_TRUE(std::filesystem::is_regular_file(path)) << "reading " << path;
  return fleet::testing::ReadAll(path);
}

std::string CriteoLine(int i) {
  std::string line = std::to_string(i % 2) + "\t" + std::to_string(i);
  for (int j = 1; j < kCriteoDense; ++j) line += "\t" + std::to_string(j);
  char hex[32];
  for (int s = 0; s < kCriteoSlots; ++s) {
    std::snprintf(hex, sizeof(hex), "%08x", s == 0 ? i : 0x1000 + s);
    line += "\t";
    line += hex;
  }
  return line;
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

std::string SourcePath(std::string_view relative) {
  const char* src = std::getenv("FLEET_SOURCE_DIR");
  return std::string(src != nullptr ? src : ".") + "/" + std::string(relative);
}

std::string Fixture(std::string_view name) {
  return SourcePath("tests/data/fixtures/" + std::string(name));
}

}  // namespace fleet::data::testing
