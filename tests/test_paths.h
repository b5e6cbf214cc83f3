// Where tests that run the real programs or read files of the repository
// find them: fleet_add_test (cmake/FleetTest.cmake) gives every test
// FLEET_BIN_DIR (build/bin) and FLEET_SOURCE_DIR (the source tree); a test
// binary started by hand needs them set.
//
// A missing (or empty) variable throws std::runtime_error naming it, which
// GoogleTest reports as a failure of the SetUp, SetUpTestSuite or test body
// that asked. Thread-safe (reads the environment only).
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

namespace fleet::testing {

// The value of the environment variable `name`, which must be set.
inline std::string RequiredTestDir(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string(name) + " is not set: run under ctest or set " + name);
  }
  return value;
}

// The directory of the built programs: $FLEET_BIN_DIR.
inline std::string BinDir() { return RequiredTestDir("FLEET_BIN_DIR"); }

// The source tree: $FLEET_SOURCE_DIR.
inline std::string SourceDir() { return RequiredTestDir("FLEET_SOURCE_DIR"); }

// A built program, e.g. BinPath("fleetrun").
inline std::string BinPath(std::string_view program) {
  return BinDir() + "/" + std::string(program);
}

// A file of the source tree, e.g. SourcePath("configs/ctr_dnn.yaml").
inline std::string SourcePath(std::string_view relative) {
  return SourceDir() + "/" + std::string(relative);
}

}  // namespace fleet::testing
