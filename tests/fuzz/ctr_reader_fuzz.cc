// Criteo CTR data (data/ctr_reader.h): the input is a data file,
// plain or gzip-compressed (detected by its magic), read by a CtrReader in
// batches of 3 for two epochs; every line also goes through
// ParseCriteoLine directly. Malformed lines must be counted, a damaged file
// must be a Status.
#include <zlib.h>

#include <glog/logging.h>

#include "data/ctr_reader.h"
#include "tests/fuzz/fuzz_util.h"

using namespace fleet;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::TempFile* file = new fuzz::TempFile("fleet_fuzz_ctr");
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  data::CtrSample sample;
  for (size_t start = 0; start <= bytes.size();) {
    size_t end = bytes.find('\n', start);
    if (end == std::string::npos) end = bytes.size();
    (void)data::ParseCriteoLine(std::string_view(bytes).substr(start, end - start), &sample);
    start = end + 1;
  }
  data::CtrReaderOptions options;
  options.batch_size = 3;
  auto reader = data::CtrReader::Open({file->Write(bytes)}, options);
  CHECK(reader.ok()) << reader.status().ToString();
  data::CtrBatch batch;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int i = 0; i < 10000; ++i) {
      auto n = reader.value()->Next(&batch);
      if (!n.ok() || n.value() == 0) break;
    }
    reader.value()->Rewind();
  }
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  std::string text;
  for (int line = 0; line < 4; ++line) {
    text += line % 2 ? "1" : "0";
    for (int i = 0; i < data::kCriteoDense; ++i) text += "\t" + (i == 3 ? "" : std::to_string(i * line));
    for (int i = 0; i < data::kCriteoSlots; ++i) {
      char hex[16];
      std::snprintf(hex, sizeof(hex), "%08x", 0x68fd1e64u + i * 977 + line);
      text += "\t" + (i == 5 ? std::string() : std::string(hex));
    }
    text += "\n";
  }
  seeds->push_back(text);
  seeds->push_back(text + "0\t1\t2\n\n-1\tx\n");  // malformed lines among good ones
  fuzz::TempFile gz("fleet_fuzz_ctr_seed.gz");
  gzFile f = gzopen(gz.path().c_str(), "wb");
  CHECK(f != nullptr);
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  std::ifstream in(gz.path(), std::ios::binary);
  seeds->push_back(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
}
