#include <algorithm>
#include <string>
#include <unordered_map>

#include "worker/communicator.h"

namespace fleet::worker {

GeoCommunicator::GeoCommunicator(ps::PsClient* client, CommunicatorOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.sparse_table) {
    const ps::TableConfig* t = client_->job().table(*options_.sparse_table);
    sparse_dim_ = client_->PullDim(*options_.sparse_table);
    sparse_rule_ = ps::MakeOptimizerRule(t->optimizer);
  }
  if (options_.dense_table) {
    const ps::TableConfig* t = client_->job().table(*options_.dense_table);
    dense_dim_ = t->dim;
    dense_rule_ = ps::MakeOptimizerRule(t->optimizer);
  }
}

Status GeoCommunicator::FetchMissing(std::span<const uint64_t> keys) {
  // Keys the local copy lacks come from the servers once per exchange.
  std::vector<uint64_t> missing;
  for (uint64_t k : keys) {
    if (!rows_.contains(k)) missing.push_back(k);
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  if (missing.empty()) return Status::OK();
  std::vector<float> fresh(missing.size() * sparse_dim_);
  FLEET_RETURN_IF_ERROR(
      client_->PullSparse(*options_.sparse_table, missing, fresh, {options_.timeout}));
  for (size_t i = 0; i < missing.size(); ++i) {
    Row& r = rows_[missing[i]];
    r.value.assign(fresh.begin() + i * sparse_dim_, fresh.begin() + (i + 1) * sparse_dim_);
    r.synced = r.value;
    auto [st, created] = state_.try_emplace(missing[i]);
    if (created) {
      st->second.resize(sparse_rule_->state_size(sparse_dim_));
      sparse_rule_->InitState(sparse_dim_, st->second);
    }
  }
  return Status::OK();
}

Status GeoCommunicator::Pull(const PullRequest& request) {
  const ps::PullOptions po{options_.timeout};
  if (options_.sparse_table && !request.sparse_keys.empty()) {
    if (request.sparse_values.size() != request.sparse_keys.size() * sparse_dim_) {
      return Status::InvalidArgument("geo pull: values must be keys * dim",
                                     std::to_string(request.sparse_values.size()));
    }
    FLEET_RETURN_IF_ERROR(FetchMissing(request.sparse_keys));
    for (size_t i = 0; i < request.sparse_keys.size(); ++i) {
      const Row& r = rows_.at(request.sparse_keys[i]);
      std::copy(r.value.begin(), r.value.end(), request.sparse_values.begin() + i * sparse_dim_);
    }
  }
  if (options_.dense_table && !request.dense_values.empty()) {
    if (request.dense_values.size() != dense_dim_) {
      return Status::InvalidArgument("geo pull: dense values must have the table's dim",
                                     std::to_string(request.dense_values.size()));
    }
    if (!dense_loaded_) {
      dense_value_.resize(dense_dim_);
      FLEET_RETURN_IF_ERROR(client_->PullDense(*options_.dense_table, dense_value_, po));
      dense_synced_ = dense_value_;
      if (dense_state_.empty()) {
        dense_state_.resize(dense_rule_->state_size(dense_dim_));
        dense_rule_->InitState(dense_dim_, dense_state_);
      }
      dense_loaded_ = true;
    }
    std::copy(dense_value_.begin(), dense_value_.end(), request.dense_values.begin());
  }
  return Status::OK();
}

Status GeoCommunicator::Push(const PushRequest& request) {
  if (request.sparse_grads.size() != request.sparse_keys.size() * sparse_dim_) {
    return Status::InvalidArgument("geo push: sparse grads must be keys * dim",
                                   std::to_string(request.sparse_grads.size()));
  }
  if (!request.dense_grads.empty() && request.dense_grads.size() != dense_dim_) {
    return Status::InvalidArgument("geo push: dense grads must have the table's dim",
                                   std::to_string(request.dense_grads.size()));
  }
  FLEET_RETURN_IF_ERROR(CheckCounts(request, "geo push"));
  if (!request.sparse_keys.empty()) {
    // A key pulled before the last exchange (a heter pipeline pulls steps
    // ahead) is read again: its gradient applies to the fresh value.
    FLEET_RETURN_IF_ERROR(FetchMissing(request.sparse_keys));
    // One update per distinct key with the summed gradient, as the servers
    // apply a push with duplicate keys.
    std::unordered_map<uint64_t, std::vector<float>> summed;
    const bool counts = !request.sparse_shows.empty();
    for (size_t i = 0; i < request.sparse_keys.size(); ++i) {
      auto& g = summed[request.sparse_keys[i]];
      g.resize(sparse_dim_, 0.0f);
      for (size_t j = 0; j < sparse_dim_; ++j) g[j] += request.sparse_grads[i * sparse_dim_ + j];
      Row& row = rows_.at(request.sparse_keys[i]);
      row.show += counts ? request.sparse_shows[i] : 1.0f;
      row.click += counts ? request.sparse_clicks[i] : 0.0f;
    }
    counts_ = counts_ || counts;
    for (auto& [key, g] : summed) sparse_rule_->Update(rows_.at(key).value, state_.at(key), g);
  }
  if (!request.dense_grads.empty()) {
    if (!dense_loaded_) {
      return Status::InvalidArgument("geo push: dense gradient before any dense pull");
    }
    dense_rule_->Update(dense_value_, dense_state_, request.dense_grads);
  }
  if (++pushes_ % options_.k_steps == 0) return Flush();
  return Status::OK();
}

Status GeoCommunicator::Flush() {
  ps::PushOptions po;
  po.timeout = options_.timeout;
  // Each worker sends its share of the change: with W workers training on
  // disjoint data, the servers' value moves by the average of their deltas
  // (model averaging every k_steps).
  const float scale = 1.0f / static_cast<float>(options_.num_workers);
  if (options_.sparse_table && !rows_.empty()) {
    std::vector<uint64_t> keys;
    std::vector<float> deltas, shows, clicks;
    keys.reserve(rows_.size());
    deltas.reserve(rows_.size() * sparse_dim_);
    for (const auto& [key, r] : rows_) {
      keys.push_back(key);
      for (size_t j = 0; j < sparse_dim_; ++j) deltas.push_back((r.value[j] - r.synced[j]) * scale);
      // The counts are this worker's own (not averaged): every sighting counts once.
      if (counts_) shows.push_back(r.show), clicks.push_back(r.click);
    }
    po.shows = shows;
    po.clicks = clicks;
    FLEET_RETURN_IF_ERROR(client_->PushSparseDelta(*options_.sparse_table, keys, deltas, po)
                              .WithContext("geo exchange"));
    // Dropped, not refreshed: the next Pull reads what it needs, fresh, and
    // rows this worker stopped using do not pile up.
    rows_.clear();
    counts_ = false;
  }
  if (options_.dense_table && dense_loaded_) {
    std::vector<float> delta(dense_dim_);
    for (size_t j = 0; j < dense_dim_; ++j) delta[j] = (dense_value_[j] - dense_synced_[j]) * scale;
    FLEET_RETURN_IF_ERROR(
        client_->PushDenseDelta(*options_.dense_table, delta, po).WithContext("geo exchange"));
    dense_loaded_ = false;  // re-read at the next Pull
  }
  ++exchanges_;
  return Status::OK();
}

}  // namespace fleet::worker
