// GlooStore: the Debian gloo::rendezvous::Store interface over the HTTP KV
// store, so Gloo's connectFullMesh() bootstraps from the same server as
// everything else.
//
// Every key is namespaced as "<prefix>/<key>" inside the client's job scope,
// the way gloo's PrefixStore does it, so two groups (or two jobs sharing a
// server) never read each other's keys. GlooCollective uses the prefix
// "gloo/<group>".
//
// Gloo expects a store to throw on failure: every error from the KV client
// is thrown as StoreException (a gloo::IoException that also carries the
// original Status, so GlooCollective can give back the exact code).
//
// Thread-safe (KvStoreClient is). Every call blocks at most its timeout.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include "comm/kv_store.h"
#include "comm/status.h"

namespace fleet {

// What GlooStore throws: gloo's IO error type plus the Status behind it.
class StoreException : public gloo::IoException {
 public:
  explicit StoreException(Status status)
      : gloo::IoException(status.ToString()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

class GlooStore : public gloo::rendezvous::Store {
 public:
  // `client` is not owned and must outlive this store. `prefix` must be
  // non-empty (checked by the callers that build it, not here: it is not
  // outside input). `default_timeout` bounds get() and the untimed wait().
  GlooStore(KvStoreClient& client, std::string prefix, std::chrono::milliseconds default_timeout);

  // Throws StoreException (Unavailable, InvalidArgument, ...).
  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the default timeout for the key, like gloo's FileStore;
  // throws StoreException (Timeout naming the key) when it never appears.
  std::vector<char> get(const std::string& key) override;
  // Waits up to the default timeout.
  void wait(const std::vector<std::string>& keys) override;
  // Waits up to `timeout` (the base class would ignore it; zero, gloo's
  // kNoTimeout, means the default timeout); throws
  // StoreException with a Timeout status naming the missing keys.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string Join(const std::string& key) const { return prefix_ + "/" + key; }

  // Fixed after construction.
  KvStoreClient& client_;
  const std::string prefix_;
  const std::chrono::milliseconds default_timeout_;
};

}  // namespace fleet
