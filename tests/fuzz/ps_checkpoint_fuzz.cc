// PS checkpoints (ps/checkpoint.h): a directory of manifests, shard files
// and dense files, loaded by Checkpointer::Load through the FileSystem seam.
// The fuzzer writes the whole directory: the input is a list of
// (u16-length name, u16-length bytes) files put under /ckpt of an in-memory
// FileSystem, then Load runs into a sparse (sgd), a CTR sparse (adam) and a
// dense (adam) table. Load must return a Status for any directory.
#include <glog/logging.h>

#include "ps/checkpoint.h"
#include "ps/table/partition.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace fleet;
using namespace fleet::ps;

TableConfig Config(const std::string& yaml) {
  auto c = ParseTableConfig(YAML::Load(yaml));
  CHECK(c.ok()) << c.status().ToString();
  return c.value();
}

struct Tables {
  std::unique_ptr<SparseTable> sparse, ctr;
  std::unique_ptr<DenseTable> dense;
  Tables() {
    const TableConfig s = Config("{id: 0, kind: sparse, dim: 4, shard_num: 4, optimizer: {rule: sgd}}");
    const TableConfig c = Config(
        "{id: 1, kind: sparse, dim: 3, accessor: ctr, shard_num: 4, optimizer: {rule: adam},"
        " ctr: {embedx_threshold: 2, nonclk_coeff: 1, delete_after_unseen_passes: 1}}");
    const TableConfig d = Config("{id: 2, kind: dense, dim: 10, optimizer: {rule: adam}}");
    sparse = SparseTable::Create(s, AssignShards(s.shard_num, 1, 0).value(), nullptr).value();
    ctr = SparseTable::Create(c, AssignShards(c.shard_num, 1, 0).value(), nullptr).value();
    dense = DenseTable::Create(d, SplitDenseRange(d.dim, 1, 0).value()).value();
  }
  ServerTables all() const { return {{sparse.get(), ctr.get()}, {dense.get()}}; }
};

const std::string kDir = "/ckpt";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::ByteReader in(data, size);
  fuzz::MemFileSystem fs;
  (void)fs.CreateDir(kDir);
  while (!in.done()) {
    std::string name = in.Field(200);
    fs.Put(kDir + "/" + name, in.Field());
  }
  Tables tables;
  Checkpointer checkpointer(&fs, 0, 1, nullptr);
  (void)checkpointer.Load(kDir, tables.all());
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  fuzz::MemFileSystem fs;
  Tables tables;
  Checkpointer checkpointer(&fs, 0, 1, nullptr);
  const std::vector<uint64_t> keys = {1, 2, 3, 5, 8, 13};
  auto push = [&](float scale) {
    CHECK(tables.sparse->PushGrad(keys, std::vector<float>(keys.size() * 4, scale)).ok());
    CHECK(tables.ctr->PushGrad(keys, std::vector<float>(keys.size() * tables.ctr->push_dim(), scale),
                               std::vector<float>(keys.size(), 3), std::vector<float>(keys.size(), 1))
              .ok());
    CHECK(tables.dense->PushGrad(std::vector<float>(10, scale)).ok());
  };
  auto archive = [&] {
    std::string s;
    for (const auto& [path, bytes] : fs.files()) {
      fuzz::PutField(&s, path.substr(kDir.size() + 1));
      fuzz::PutField(&s, bytes);
    }
    return s;
  };
  push(0.5f);
  CHECK(checkpointer.Save(kDir, SaveMode::kBase, tables.all()).ok());
  seeds->push_back(archive());
  push(0.25f);
  CHECK(checkpointer.Save(kDir, SaveMode::kDelta, tables.all()).ok());
  seeds->push_back(archive());
}
