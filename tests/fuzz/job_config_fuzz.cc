// The PS job config (ps/job_config.h): the input is up to 3 "-o" overrides
// (u8 count, then u16-length fields) and the YAML file (the rest), loaded by
// LoadJobConfig as ps_server and ps_worker do. Any text must give a
// JobConfig or InvalidArgument: no uncaught yaml-cpp exception, no abort on
// a huge value.
#include "ps/job_config.h"
#include "tests/fuzz/config_seeds.h"
#include "tests/fuzz/fuzz_util.h"

using namespace fleet;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile* file = new fuzz::TempFile("fleet_fuzz_job.yaml");
  fuzz::ByteReader in(data, size);
  std::vector<std::string> overrides(in.U8() % 4);
  for (std::string& o : overrides) o = in.Field(200);
  (void)ps::LoadJobConfig(file->Write(in.Rest()), overrides);
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  for (const char* name : {"ctr_dnn.yaml", "ctr_dnn_heter.yaml", "mnist_mlp_ps.yaml"}) {
    std::string s(1, '\0');
    seeds->push_back(s + fuzz::RepoConfig(name));
  }
  std::string s(1, '\2');
  fuzz::PutField(&s, "Distributed.mode=async");
  fuzz::PutField(&s, "tables.0.dim=16");
  seeds->push_back(s + fuzz::RepoConfig("ctr_dnn.yaml"));
}
