// Seeds for the config fuzz targets: the repository's own configs.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace fleet::fuzz {

// The text of configs/<name> of the source tree: $FLEET_SOURCE_DIR, else
// the working directory.
inline std::string RepoConfig(const std::string& name) {
  const char* root = std::getenv("FLEET_SOURCE_DIR");
  const auto path = std::filesystem::path(root ? root : ".") / "configs" / name;
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace fleet::fuzz
