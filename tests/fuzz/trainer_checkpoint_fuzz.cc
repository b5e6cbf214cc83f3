// Local training checkpoints (trainer/checkpoint.h): LoadCheckpoint into an
// arena with an Adam or SGD optimizer, and LoadCheckpointParams. The input
// is the file: u8 optimizer choice, then the file's bytes.
#include <glog/logging.h>

#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/kernels/cpu_backend.h"

namespace {

using namespace fleet;
using namespace fleet::trainer;

struct Model {
  CpuBackend backend;
  ParamArena arena;
  std::unique_ptr<Optimizer> optimizer;
  explicit Model(const std::string& type)
      : arena(ParamArena::Create({{"fc.weight", Shape{3, 4}}, {"fc.bias", Shape{4}}, {"emb", Shape{2, 2, 2}}},
                                 &backend)
                  .value()) {
    OptimizerConfig c;
    c.type = type;
    c.lr = 0.1f;
    optimizer = CreateOptimizer(c, &arena).value();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile* file = new fuzz::TempFile("fleet_fuzz_trainer_ckpt");
  static Model* adam = new Model("adam");
  static Model* sgd = new Model("sgd");
  fuzz::ByteReader in(data, size);
  Model* model = in.U8() & 1 ? sgd : adam;
  const std::string& path = file->Write(in.Rest());
  (void)LoadCheckpoint(path, &model->arena, model->optimizer.get());
  (void)LoadCheckpointParams(path, &model->arena);
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  fuzz::TempFile file("fleet_fuzz_trainer_ckpt_seed");
  for (int which = 0; which < 2; ++which) {
    Model model(which ? "sgd" : "adam");
    CHECK(SaveCheckpoint(file.path(), model.arena, *model.optimizer).ok());
    std::ifstream in(file.path(), std::ios::binary);
    std::string bytes(1, static_cast<char>(which));
    bytes.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    seeds->push_back(bytes);
  }
}
