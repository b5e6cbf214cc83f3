#include "comm/gloo_store.h"

namespace fleet {
namespace {

void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StoreException(status);
}

}  // namespace

GlooStore::GlooStore(KvStoreClient& client, std::string prefix,
                     std::chrono::milliseconds default_timeout)
    : client_(client), prefix_(std::move(prefix)), default_timeout_(default_timeout) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  ThrowIfError(client_.Set(Join(key), std::string(data.begin(), data.end())));
}

std::vector<char> GlooStore::get(const std::string& key) {
  Result<std::string> value = client_.WaitGet(Join(key), default_timeout_);
  ThrowIfError(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, default_timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const std::string& key : keys) joined.push_back(Join(key));
  // gloo spells "no timeout" as zero; FleetPS never waits without one, so
  // that means the store's default.
  ThrowIfError(client_.Wait(joined, timeout == gloo::kNoTimeout ? default_timeout_ : timeout));
}

}  // namespace fleet
