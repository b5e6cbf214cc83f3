// Megatron's indexed dataset (data/megatron_data.h): the input is a .idx
// (u16-length field) and the .bin (the rest), opened as PREFIX; what opens
// is sampled (Megatron's indices over a small split) and every sample read.
// A count, size or pointer declaring more than the files hold must be
// Corruption, never an allocation or a read of what it declares.
#include <glog/logging.h>

#include <vector>

#include "data/megatron_data.h"
#include "tests/fuzz/fuzz_util.h"

using namespace fleet;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile* idx = new fuzz::TempFile("fleet_fuzz_megatron_idx");
  static fuzz::TempFile* bin = new fuzz::TempFile("fleet_fuzz_megatron_bin");
  fuzz::ByteReader in(data, size);
  const std::string idx_path = idx->Write(in.Field());
  const std::string bin_path = bin->Write(in.Rest());
  // PREFIX.idx and PREFIX.bin for the reader (the temp names end in the pid),
  // then back to the names the TempFiles remove.
  const std::string prefix = idx_path + ".pair";
  std::filesystem::rename(idx_path, prefix + ".idx");
  std::filesystem::rename(bin_path, prefix + ".bin");
  auto opened = data::MegatronIndexedData::Open(prefix);
  std::filesystem::rename(prefix + ".idx", idx_path);
  std::filesystem::rename(prefix + ".bin", bin_path);
  if (!opened.ok()) return 0;
  data::MegatronSamplesOptions o;
  o.seq_len = 4;
  o.vocab_size = 300;
  o.split = {1};
  o.num_samples = 3;
  auto samples = data::MegatronGptSamples::Open(*opened, o);
  if (!samples.ok()) return 0;
  std::vector<int32_t> row(o.seq_len + 1);
  for (int64_t id = 0; id < (*samples)->num_samples(); ++id) {
    (void)(*samples)->ReadSample(id, row.data());
  }
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  auto put = [](std::string* s, auto v) { s->append(reinterpret_cast<const char*>(&v), sizeof v); };
  // Three sequences of 2, 3 and 4 uint16 tokens.
  std::string idx("MMIDIDX\0\0", 9);
  put(&idx, uint64_t{1});
  put(&idx, uint8_t{8});
  put(&idx, uint64_t{3});
  put(&idx, uint64_t{4});
  for (int32_t n : {2, 3, 4}) put(&idx, n);
  for (int64_t p : {0, 4, 10}) put(&idx, p);
  for (int64_t d : {0, 1, 2, 3}) put(&idx, d);
  std::string bin;
  for (uint16_t t = 0; t < 9; ++t) put(&bin, static_cast<uint16_t>(t * 31));
  std::string s;
  fuzz::PutField(&s, idx);
  seeds->push_back(s + bin);
}
