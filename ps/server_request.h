// What the request handlers of PsServer share across its files (server.cc
// dispatches, server_waits.cc holds callers that wait for the others):
// reading a request's metadata and when to answer a caller that waits.
// Internal to ps/.
#pragma once

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "comm/message.h"
#include "comm/status.h"
#include "ps/ps.pb.h"

namespace fleet::ps::internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often the watchdog looks for waits to answer; the reply margin below
// is larger, so an answer is never late because of it.
constexpr milliseconds kWatchTick{20};

// When to answer a caller that waits for others: a little before its own
// deadline (the request's budget, counted from arrival here, so a bit after
// the caller's), so that our explanation reaches it before its call gives
// up with a bare timeout.
inline Clock::time_point ReplyBy(const Message& req, Clock::time_point now) {
  if (req.header.deadline_ms() == 0) return Clock::time_point::max();
  const milliseconds budget(req.header.deadline_ms());
  const milliseconds margin = std::clamp(budget / 10, 2 * kWatchTick, milliseconds(2000));
  return now + budget - std::min(margin, budget);
}

inline Result<pb::PsRequestMeta> ParseMeta(const Message& req) {
  pb::PsRequestMeta meta;
  if (!req.header.meta().empty() && !meta.ParseFromString(req.header.meta())) {
    return Status::InvalidArgument("request metadata does not parse",
                                   absl::StrCat("from ", req.header.sender()));
  }
  return meta;
}

}  // namespace fleet::ps::internal
