#include "trainer/param_arena.h"

#include <set>

namespace fleet::trainer {

Result<ParamArena> ParamArena::Create(ParamTable table, Backend* backend, bool with_grads) {
  CHECK(backend != nullptr);
  ParamArena arena;
  std::set<std::string, std::less<>> seen;
  for (const ParamSpec& spec : table) {
    if (spec.name.empty()) return Status::InvalidArgument("parameter with an empty name");
    if (!seen.insert(spec.name).second) {
      return Status::InvalidArgument("duplicate parameter name", spec.name);
    }
    if (spec.shape.ndim() == 0 || spec.shape.numel() == 0) {
      return Status::InvalidArgument("parameter with an empty shape " + spec.shape.ToString(),
                                     spec.name);
    }
    arena.offsets_.push_back(arena.offsets_.back() + static_cast<size_t>(spec.shape.numel()));
  }
  arena.table_ = std::move(table);
  arena.backend_ = backend;
  const Shape flat{static_cast<int64_t>(arena.size())};
  arena.params_ = backend->AllocateTensor(flat);
  if (with_grads) arena.grads_ = backend->AllocateTensor(flat);
  return arena;
}

Tensor ParamArena::param(size_t i) const {
  CHECK_LT(i, table_.size());
  return Tensor(params_.data() + offsets_[i], table_[i].shape, params_.device());
}

Tensor ParamArena::grad(size_t i) const {
  CHECK_LT(i, table_.size());
  CHECK(has_grads()) << "frozen parameters have no gradients: " << table_[i].name;
  return Tensor(grads_.data() + offsets_[i], table_[i].shape, grads_.device());
}

Result<size_t> ParamArena::Find(std::string_view name) const {
  for (size_t i = 0; i < table_.size(); ++i)
    if (table_[i].name == name) return i;
  return Status::NotFound("no parameter named", name);
}

size_t ParamArena::IndexOf(std::string_view name) const {
  Result<size_t> i = Find(name);
  CHECK(i.ok()) << i.status().ToString();
  return *i;
}

void ParamArena::ZeroGrad() {
  if (has_grads()) backend_->Fill(grads_.data(), size(), 0.0f);
}

std::vector<float> ParamArena::ParamsToHost() const {
  std::vector<float> host(size());
  backend_->CopyToHost(host.data(), params_.data(), host.size() * sizeof(float));
  return host;
}

std::vector<float> ParamArena::GradsToHost() const {
  if (!has_grads()) return {};
  std::vector<float> host(size());
  backend_->CopyToHost(host.data(), grads_.data(), host.size() * sizeof(float));
  return host;
}

Status ParamArena::ParamsFromHost(std::span<const float> host) {
  if (host.size() != size()) {
    return Status::InvalidArgument("parameter buffer has " + std::to_string(host.size()) +
                                   " floats, arena has " + std::to_string(size()));
  }
  backend_->CopyFromHost(params_.data(), host.data(), host.size() * sizeof(float));
  return Status::OK();
}

}  // namespace fleet::trainer
