// Sharded AdamW state files (collective/sharded_adamw.h): a
// checkpoint directory whose parameters file is valid and whose one state
// file (degree 1, step 2) is the input, resumed by a one-process
// ShardedAdamWUpdater. Every byte must give OK or a Status, never a crash.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "trainer/backend.h"
#include "collective/sharded_adamw.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/cpu_backend.h"

namespace {

using namespace fleet;
using namespace fleet::trainer;
namespace fs = std::filesystem;

struct Model {
  CpuBackend backend;
  CpuGptKernels kernels{nullptr};
  ParamArena arena;
  std::unique_ptr<collective::ShardedAdamWUpdater> updater;
  Model()
      : arena(ParamArena::Create({{"w", Shape{{8, 16}}}, {"b", Shape{{16}}}}, &backend).value()) {
    updater = collective::ShardedAdamWUpdater::Create({}, &arena, &kernels, AdamWConfig{},
                                                      1e-2f, {}, "m")
                  .value();
  }
};

// A directory holding a valid checkpoint of step 2.
const fs::path& Directory() {
  static const fs::path* dir = [] {
    auto* d = new fs::path(fs::temp_directory_path() /
                           ("fleet_fuzz_sharded_state." + std::to_string(::getpid())));
    fs::create_directories(*d);
    Model model;
    for (int step = 0; step < 2; ++step) {
      model.updater->BeginStep(1e-2f);
      model.arena.backend()->Fill(model.arena.grads().data(), model.arena.size(), 0.1f * (step + 1));
      CHECK(model.updater->Step().ok());
    }
    CHECK(model.updater->Save(*d).ok());
    return d;
  }();
  return *dir;
}

const fs::path kStateFile = "m.adamw.s2.0-of-1";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = Directory();
  std::ofstream(dir / kStateFile, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  Model model;
  (void)model.updater->Resume(dir);
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  std::ifstream in(Directory() / kStateFile, std::ios::binary);
  seeds->emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
