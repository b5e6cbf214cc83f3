// Test fixture for collective tests: N ranks as threads, each with its own
// GlooCollective over one in-process KV server on a free port (helpers of
// tests/comm/collective_test_util.h). The first failure is rethrown after
// every rank ended; the group timeout bounds how long the others stay
// blocked.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/gloo_collective.h"
#include "tests/comm/collective_test_util.h"

namespace fleet::testing {

// body(rank, group) on `size` threads. Bodies fail by throwing.
inline void RunGlooRanks(int size, std::chrono::milliseconds timeout,
                         const std::function<void(int, Collective&)>& body) {
  LocalKvServer kv;
  const std::string job = UniqueJob();
  RunRanks(size, [&](int rank) {
    auto client = kv.Client(job);
    GlooCollectiveOptions options;
    options.group = "test";
    options.rank = rank;
    options.size = size;
    options.timeout = timeout;
    auto group = GlooCollective::Create(*client, options);
    ThrowIfError(group.status(), "gloo group of rank " + std::to_string(rank));
    body(rank, **group);
  });
}

}  // namespace fleet::testing
