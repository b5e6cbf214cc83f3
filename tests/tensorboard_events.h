// Reads TensorBoard event files for tests through tests/read_tb_events.py
// (python3-protobuf and an independent CRC-32C): the check that what FleetPS
// writes is what TensorBoard reads. Used by tests/data/tensorboard_test
// and the programs' tests.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/child_process.h"

namespace fleet::testing {

struct TbScalar {
  int64_t step = 0;
  std::string tag;
  double value = 0;
};

// Why the decoder cannot run here (no /usr/bin/python3 or no
// python3-protobuf), or empty.
inline std::string TbDecoderMissing() {
  if (::access("/usr/bin/python3", X_OK) != 0) return "/usr/bin/python3 is missing";
  if (fleet::testing::RunCommand("/usr/bin/python3 -c 'import google.protobuf'").exit_code != 0) {
    return "python3-protobuf is missing (apt-get install python3-protobuf)";
  }
  return "";
}

// Decodes every events.out.tfevents.* file in `dir` (protoc and the script
// paths from the build: FLEET_PROTOC, FLEET_TEST_SOURCE_DIR). Sets *error to
// the decoder's complaint when a record is damaged.
inline std::vector<TbScalar> ReadTbScalars(const std::string& protoc, const std::string& source_dir,
                                           const std::filesystem::path& dir, std::string* error,
                                           std::string* file_version = nullptr) {
  namespace fs = std::filesystem;
  const fs::path pb2 = dir / ".pb2";
  fs::create_directories(pb2);
  std::string cmd = protoc + " --proto_path=" + source_dir +
                    "/data/tensorboard --python_out=" + pb2.string() + " " + source_dir +
                    "/data/tensorboard/event.proto";
  if (fleet::testing::RunCommand(cmd).exit_code != 0) {
    *error = "protoc failed: " + cmd;
    return {};
  }
  cmd = "/usr/bin/python3 " + source_dir + "/tests/read_tb_events.py " + pb2.string();
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      cmd += " " + e.path().string();
    }
  }
  const fleet::testing::CommandResult decoded = fleet::testing::RunCommand(cmd);
  const std::string& out = decoded.output;
  const int rc = decoded.exit_code;
  std::vector<TbScalar> scalars;
  if (rc != 0) {
    *error = out;
    return scalars;
  }
  size_t at = 0;
  while (at < out.size()) {
    const size_t end = out.find('\n', at);
    const std::string line = out.substr(at, end - at);
    at = end == std::string::npos ? out.size() : end + 1;
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    if (line.rfind("file_version\t", 0) == 0) {
      if (file_version != nullptr) *file_version = line.substr(t1 + 1);
      continue;
    }
    if (t1 == std::string::npos || t2 == std::string::npos) continue;
    scalars.push_back({std::stoll(line.substr(0, t1)), line.substr(t1 + 1, t2 - t1 - 1),
                       std::stod(line.substr(t2 + 1))});
  }
  return scalars;
}

}  // namespace fleet::testing
