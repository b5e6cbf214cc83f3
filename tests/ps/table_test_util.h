// Helpers shared by the PS table and checkpoint tests.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "ps/table/sparse_table.h"

namespace fleet::ps {

// A config from YAML; the test fails loudly on a typo.
inline TableConfig ConfigFromYaml(const std::string& yaml) {
  Result<TableConfig> c = ParseTableConfig(YAML::Load(yaml));
  CHECK(c.ok()) << c.status().ToString();
  return c.value();
}

// Every row of every held shard, in a canonical byte form (the base shard
// file images). Clears the change marks, so only for tests that do not
// exercise delta saves afterwards.
inline std::string DumpRows(SparseTable& t) {
  std::vector<ShardImage> images;
  for (size_t l = 0; l < t.local_shard_count(); ++l) {
    Result<std::vector<ShardImage>> local = t.SerializeLocalShard(l, SaveMode::kBase);
    CHECK(local.ok()) << local.status().ToString();
    for (ShardImage& im : *local) images.push_back(std::move(im));
  }
  t.CommitSave();
  std::sort(images.begin(), images.end(), [](const ShardImage& a, const ShardImage& b) { return a.shard < b.shard; });
  std::string all;
  for (const ShardImage& im : images) all += im.image;
  return all;
}

}  // namespace fleet::ps
