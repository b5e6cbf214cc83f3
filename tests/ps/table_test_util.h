// Helpers shared by the PS table and checkpoint tests.
#pragma once

#include <string>

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
  std::string all;
  for (uint32_t s = t.owned_shards().begin; s < t.owned_shards().end; ++s) t.SerializeShard(s, SaveMode::kBase, &all);
  t.CommitSave();
  return all;
}

}  // namespace fleet::ps
