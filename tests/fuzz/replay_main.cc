// Runs a fuzz target without libFuzzer (the default g++ build): every file
// of the directories given on the command line goes through
// LLVMFuzzerTestOneInput once. A crash, abort or sanitizer report fails the
// ctest; a return is a pass. With --write_seeds DIR it writes the target's
// seeds (FleetFuzzSeeds) plus truncated and bit-flipped variants of each
// into DIR instead, which is how tests/fuzz/corpus/ was made.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <glog/logging.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) __attribute__((weak));

namespace {

// Deterministic variants of a valid input: prefixes and single-bit flips
// spread over the input.
std::vector<std::string> Variants(const std::string& seed) {
  std::vector<std::string> out = {seed};
  for (size_t cut : {seed.size() / 2, seed.size() * 9 / 10, seed.size() > 0 ? seed.size() - 1 : 0}) {
    if (cut < seed.size()) out.push_back(seed.substr(0, cut));
  }
  for (int i = 1; i <= 6 && !seed.empty(); ++i) {
    std::string flipped = seed;
    const size_t pos = (seed.size() * i * 37 / 223 + i * 11) % seed.size();
    flipped[pos] = static_cast<char>(flipped[pos] ^ (1 << (i % 8)));
    out.push_back(flipped);
  }
  return out;
}

int WriteSeeds(const std::filesystem::path& dir) {
  if (!FleetFuzzSeeds) {
    std::fprintf(stderr, "this target defines no seeds\n");
    return 2;
  }
  std::vector<std::string> seeds;
  FleetFuzzSeeds(&seeds);
  std::filesystem::create_directories(dir);
  int n = 0;
  for (const std::string& seed : seeds) {
    for (const std::string& v : Variants(seed)) {
      char name[32];
      std::snprintf(name, sizeof(name), "seed-%03d", n++);
      std::ofstream(dir / name, std::ios::binary).write(v.data(), v.size());
    }
  }
  std::printf("wrote %d inputs into %s\n", n, dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = false;
  FLAGS_minloglevel = 2;  // decoders log what they refuse; keep the run quiet
  if (argc == 3 && std::string(argv[1]) == "--write_seeds") return WriteSeeds(argv[2]);
  int runs = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (std::filesystem::exists(argv[i])) {
      files.push_back(argv[i]);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++runs;
    }
  }
  std::printf("replayed %d inputs\n", runs);
  return runs > 0 ? 0 : 1;
}
