// IDX files (data/idx_reader.h), MNIST's format, plain or gzip: the
// input is an images file and a labels file (u16-length field, then the
// rest), read by ReadIdxImages, ReadIdxLabels and ReadIdxDataset with 10
// classes. A header declaring more than the file holds must be Corruption,
// never an allocation of what it declares.
#include <glog/logging.h>

#include "data/idx_reader.h"
#include "tests/fuzz/fuzz_util.h"

using namespace fleet;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile* images = new fuzz::TempFile("fleet_fuzz_idx_images");
  static fuzz::TempFile* labels = new fuzz::TempFile("fleet_fuzz_idx_labels");
  fuzz::ByteReader in(data, size);
  images->Write(in.Field());
  labels->Write(in.Rest());
  (void)data::ReadIdxImages(images->path());
  (void)data::ReadIdxLabels(labels->path());
  (void)data::ReadIdxDataset(images->path(), labels->path(), 10);
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  auto be32 = [](std::string* s, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) s->push_back(static_cast<char>((v >> shift) & 0xff));
  };
  const uint32_t count = 3, rows = 4, cols = 5;
  std::string img = {0, 0, 8, 3};
  be32(&img, count);
  be32(&img, rows);
  be32(&img, cols);
  for (uint32_t i = 0; i < count * rows * cols; ++i) img.push_back(static_cast<char>(i * 7));
  std::string lab = {0, 0, 8, 1};
  be32(&lab, count);
  lab += std::string{1, 9, 0};
  std::string s;
  fuzz::PutField(&s, img);
  seeds->push_back(s + lab);
}
