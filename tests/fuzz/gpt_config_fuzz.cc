// The GPT job config (collective/config/gpt_config.h): the input is a world
// size (u8), a base file (u16-length field) and the config file (the rest);
// both are written to a private directory and the config, naming
// `_base_: ./base.yaml` or not, is loaded by LoadGptJobConfig as
// gpt_pretrain does. Any text must give a config or InvalidArgument.
#include <unistd.h>

#include "collective/config/gpt_config.h"
#include "tests/fuzz/config_seeds.h"
#include "tests/fuzz/fuzz_util.h"

using namespace fleet;

namespace {

struct Dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("fleet_fuzz_gpt." + std::to_string(getpid()));
  Dir() { std::filesystem::create_directories(path); }
  ~Dir() { std::filesystem::remove_all(path); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Dir* dir = new Dir();
  fuzz::ByteReader in(data, size);
  const int64_t world_size = in.U8() % 17;
  const std::string base = in.Field();
  std::ofstream(dir->path / "base.yaml", std::ios::trunc) << base;
  const std::string main = (dir->path / "main.yaml").string();
  std::ofstream(main, std::ios::trunc) << in.Rest();
  (void)trainer::config::LoadGptJobConfig(main, {}, world_size);
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  const std::string base = fuzz::RepoConfig("gpt/pretrain_gpt_base.yaml");
  for (const char* name : {"gpt/pretrain_gpt_tiny.yaml", "gpt/pretrain_gpt2_124M.yaml",
                           "gpt/pretrain_gpt_6.7B_sharding16.yaml"}) {
    std::string text = fuzz::RepoConfig(name);
    const std::string from = "./pretrain_gpt_base.yaml";
    text.replace(text.find(from), from.size(), "./base.yaml");
    std::string s(1, '\1');
    fuzz::PutField(&s, base);
    seeds->push_back(s + text);
  }
}
