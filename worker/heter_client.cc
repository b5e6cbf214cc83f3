#include "worker/heter_client.h"

#include <algorithm>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace fleet::heter {
namespace {

using std::chrono::milliseconds;

// How often a heter worker marked down gets one micro-batch to find out
// whether it is back.
constexpr milliseconds kProbeInterval{200};
// Lines of a heter worker's log quoted when it fails the job.
constexpr size_t kLogTailLines = 10;

// Failures of the transport (the heter worker or the way to it), worth a
// resend; anything else is an answer and final.
bool Retryable(const Status& s) { return s.IsUnavailable() || s.IsTimeout(); }

int64_t Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<milliseconds>(d).count();
}

}  // namespace

HeterClient::HeterClient(HeterClientOptions options) : options_(std::move(options)) {}

HeterClient::~HeterClient() { Abort(); }

void HeterClient::Abort() {
  // Fails what is still in flight; the callbacks only touch mu_ and slots.
  if (rpc_) rpc_->Stop();
}

Result<std::unique_ptr<HeterClient>> HeterClient::Create(HeterClientOptions options) {
  const std::string who = absl::StrCat("worker ", options.worker_rank);
  if (options.heter_workers.empty()) {
    return Status::InvalidArgument("no heter workers given (--heter_workers / FLEET_HETER_WORKERS)",
                                   who);
  }
  if (options.num_workers < 1 || options.worker_rank < 0 ||
      options.worker_rank >= options.num_workers) {
    return Status::InvalidArgument(absl::StrCat("worker rank ", options.worker_rank, " not in [0, ",
                                                options.num_workers, ")"));
  }
  if (options.timeout.count() <= 0 || options.down_timeout.count() <= 0) {
    return Status::InvalidArgument("heter client timeouts must be > 0", who);
  }
  if (options.shape.slots < 0 || options.shape.embedding_dim < 1 ||
      options.shape.dense_features < 0) {
    return Status::InvalidArgument("bad dense section shape " + options.shape.ToString(), who);
  }
  std::unique_ptr<HeterClient> c(new HeterClient(std::move(options)));
  RpcNodeOptions ro;
  ro.name = absl::StrCat("worker:", c->options_.worker_rank);
  ro.handler_threads = 1;  // it serves nothing
  ro.default_timeout = c->options_.timeout;
  ro.van = c->options_.van;
  FLEET_ASSIGN_OR_RETURN(c->rpc_, RpcNode::Create(ro));
  for (size_t r = 0; r < c->options_.heter_workers.size(); ++r) {
    Heter h;
    h.endpoint = c->options_.heter_workers[r];
    auto peer = c->rpc_->Connect(h.endpoint);
    if (!peer.ok()) return peer.status().WithContext(absl::StrCat("heter worker ", r));
    h.peer = peer.value();
    c->heters_.push_back(std::move(h));
  }
  c->next_ = c->options_.worker_rank % static_cast<int>(c->heters_.size());
  return c;
}

std::string HeterClient::Describe(int h) const {
  std::string s = absl::StrCat("heter worker ", h, " (", heters_[h].endpoint);
  if (!options_.log_dir.empty()) absl::StrAppend(&s, ", log ", options_.log_dir, "/heterlog.", h);
  return s + ")";
}

std::string HeterClient::LogTail(int h) const {
  if (options_.log_dir.empty()) return "";
  // Only where the heter worker's log is on this machine (simulation).
  std::ifstream in(options_.log_dir + "/heterlog." + std::to_string(h));
  if (!in) return "";
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(std::move(line));
    if (lines.size() > kLogTailLines) lines.pop_front();
  }
  std::string tail = absl::StrCat("; the last ", lines.size(), " lines of its log:");
  for (const std::string& line : lines) absl::StrAppend(&tail, "\n  | ", line);
  return tail;
}

Status HeterClient::Fail(Status s) {
  if (error_.ok()) error_ = s;
  return error_;
}

double HeterClient::blocked_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocked_seconds_;
}

int64_t HeterClient::resends() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resends_;
}

std::optional<int> HeterClient::PickHeter(std::optional<int> avoid) {
  const int H = static_cast<int>(heters_.size());
  const auto now = Clock::now();
  auto take = [&](int h) {
    next_ = (h + 1) % H;
    // A probe: the next one only after another interval.
    if (heters_[h].down_since) heters_[h].last_failure = now;
    return h;
  };
  auto probe_due = [&](int h) {
    return heters_[h].down_since && now - heters_[h].last_failure >= kProbeInterval;
  };
  for (int k = 0; k < H; ++k) {
    const int h = (next_ + k) % H;
    const bool up = !heters_[h].down_since;
    if (avoid ? (up && h != *avoid) : (up || probe_due(h))) return take(h);
  }
  if (avoid) {
    // The one that failed it answers again (another call got through since
    // it failed this one, which cleared its down mark): with no other one
    // up, it takes the resend. Waiting for a probe instead waited forever,
    // since a probe is only due for one still marked down.
    if (!heters_[*avoid].down_since) return take(*avoid);
    for (int k = 0; k < H; ++k) {
      const int h = (next_ + k) % H;
      if (probe_due(h)) return take(h);
    }
  }
  return std::nullopt;
}

HeterClient::Clock::time_point HeterClient::NextProbe() const {
  auto t = Clock::time_point::max();
  for (const Heter& x : heters_) {
    if (x.down_since) t = std::min(t, x.last_failure + kProbeInterval);
  }
  return t;
}

void HeterClient::Send(InFlight& entry) {
  auto slot = std::make_shared<Slot>();
  entry.slot = slot;
  const Heter& h = heters_[entry.heter];
  RpcOptions ro;
  ro.timeout = options_.timeout;
  if (h.down_since) {
    // A probe of a heter worker that is down must not outlast its window.
    const auto left = *h.down_since + options_.down_timeout - Clock::now();
    ro.timeout = std::clamp(std::chrono::duration_cast<milliseconds>(left), milliseconds(1),
                            options_.timeout);
  }
  ro.what = absl::StrCat("heter_train ", entry.request.id.ToString());
  rpc_->CallAsync(h.peer, EncodeTrainRequest(entry.request, options_.shape), ro,
                  [this, slot](Result<Message> r) {
                    std::lock_guard<std::mutex> lock(mu_);
                    slot->result.emplace(std::move(r));
                    slot->done = true;
                    cv_.notify_all();
                  });
}

void HeterClient::MarkDown(int h, const Status& why, Clock::time_point now) {
  Heter& x = heters_[h];
  if (!x.down_since) {
    x.down_since = now;
    LOG(WARNING) << "worker " << options_.worker_rank << ": " << Describe(h)
                 << " failed, resending its micro-batches: " << why.ToString();
  }
  x.last_failure = now;
  x.last_error = why;
}

Status HeterClient::CheckDownTooLong(Clock::time_point now) const {
  for (size_t h = 0; h < heters_.size(); ++h) {
    const Heter& x = heters_[h];
    if (x.down_since && now - *x.down_since >= options_.down_timeout) {
      return Status::Unavailable(
          absl::StrCat(Describe(static_cast<int>(h)), " unreachable for ", Ms(now - *x.down_since),
                       " ms (Distributed.heter.down_timeout_ms is ", options_.down_timeout.count(),
                       "); last error: ", x.last_error.ToString(), LogTail(static_cast<int>(h))),
          absl::StrCat("worker ", options_.worker_rank));
    }
  }
  return Status::OK();
}

Status HeterClient::Submit(TrainRequest request) {
  FLEET_RETURN_IF_ERROR(error_);
  InFlight e;
  e.request = std::move(request);
  e.request.attempt = 0;
  // Every heter worker down and just probed: the least recently failed one;
  // the call fails at once if it is still down and is resent from WaitOldest.
  std::optional<int> h = PickHeter(std::nullopt);
  if (!h) {
    h = 0;
    for (int k = 1; k < num_heter_workers(); ++k) {
      if (heters_[k].last_failure < heters_[*h].last_failure) h = k;
    }
  }
  e.heter = *h;
  in_flight_.push_back(std::move(e));
  Send(in_flight_.back());
  return Status::OK();
}

Result<Completed> HeterClient::WaitOldest() {
  FLEET_RETURN_IF_ERROR(error_);
  CHECK(!in_flight_.empty()) << "WaitOldest with nothing in flight";
  const auto t0 = Clock::now();
  auto account = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const auto now = Clock::now();
    bool waiting_for_heter = false;
    // Every finished call, oldest first: a failed one is resent now (not
    // when it becomes the oldest), so the pipeline refills at once. Answers
    // first: a heter worker that answers again takes resends in this pass.
    for (InFlight& e : in_flight_) {
      if (!e.slot->done || e.accounted || !e.slot->result->ok()) continue;
      heters_[e.heter].down_since.reset();  // it answers (again)
      e.accounted = true;
    }
    for (InFlight& e : in_flight_) {
      if (!e.slot->done) continue;
      const Result<Message>& r = *e.slot->result;
      if (r.ok()) continue;
      if (!Retryable(r.status())) {
        const Status s =
            r.status().WithContext(absl::StrCat(Describe(e.heter), ", ", e.request.id.ToString()));
        lock.unlock();
        account();
        return Fail(s);
      }
      if (!e.accounted) MarkDown(e.heter, r.status(), now);
      e.accounted = true;
      std::optional<int> to = PickHeter(e.heter);
      if (!to) {
        waiting_for_heter = true;  // every heter worker down: resend at the next probe
        continue;
      }
      e.heter = *to;
      e.accounted = false;
      ++e.request.attempt;
      ++resends_;
      lock.unlock();
      Send(e);
      lock.lock();
    }
    if (Status s = CheckDownTooLong(now); !s.ok()) {
      lock.unlock();
      account();
      return Fail(s);
    }
    InFlight& front = in_flight_.front();
    if (front.accounted && front.slot->result->ok()) {
      Message m = std::move(*front.slot->result).value();
      lock.unlock();
      account();
      auto reply = DecodeTrainReply(m, front.request, Describe(front.heter));
      if (!reply.ok()) return Fail(reply.status());
      Completed c{std::move(front.request), std::move(reply).value(), front.heter};
      in_flight_.pop_front();
      return c;
    }
    // Sleep until a call completes, a probe is due for a micro-batch that
    // waits for a heter worker, or a down heter worker's window closes
    // (bounded, so nothing is missed for long).
    auto until = now + std::chrono::seconds(1);
    if (waiting_for_heter) until = std::min(until, NextProbe());
    for (const Heter& x : heters_) {
      if (x.down_since) until = std::min(until, *x.down_since + options_.down_timeout);
    }
    cv_.wait_until(lock, until, [&] {
      for (const InFlight& e : in_flight_) {
        if (e.slot->done && !e.accounted) return true;
      }
      return false;
    });
  }
}

Status HeterClient::Flush() {
  FLEET_RETURN_IF_ERROR(error_);
  CHECK(in_flight_.empty()) << "Flush with micro-batches in flight";
  const auto t0 = Clock::now();
  const int H = static_cast<int>(heters_.size());
  std::vector<std::shared_ptr<Slot>> slots(H);
  auto send = [&](int h) {
    auto slot = std::make_shared<Slot>();
    slots[h] = slot;
    Message m;
    m.header.set_command(pb::HETER_FLUSH);
    m.header.set_table_id(-1);
    RpcOptions ro;
    ro.timeout = options_.timeout;
    ro.what = "heter_flush";
    rpc_->CallAsync(heters_[h].peer, std::move(m), ro, [this, slot](Result<Message> r) {
      std::lock_guard<std::mutex> lock(mu_);
      slot->result.emplace(std::move(r));
      slot->done = true;
      cv_.notify_all();
    });
  };
  for (int h = 0; h < H; ++h) send(h);
  std::vector<bool> flushed(H, false);
  Status result;
  while (result.ok()) {
    std::vector<int> retry;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kProbeInterval, [&] {
        for (int h = 0; h < H; ++h) {
          if (!flushed[h] && slots[h]->done) return true;
        }
        return false;
      });
      const auto now = Clock::now();
      for (int h = 0; h < H && result.ok(); ++h) {
        if (flushed[h] || !slots[h]->done) continue;
        const Result<Message>& r = *slots[h]->result;
        if (r.ok()) {
          flushed[h] = true;
          heters_[h].down_since.reset();
          // The heter worker's own failure (its push to the servers): final.
          if (Status failed = ReplyFailure(*r); !failed.ok()) {
            result = failed.WithContext(Describe(h) + ", flush");
          }
        } else if (!Retryable(r.status())) {
          result = r.status().WithContext(Describe(h) + ", flush");
        } else {
          MarkDown(h, r.status(), now);
          retry.push_back(h);
        }
      }
      if (result.ok()) result = CheckDownTooLong(now);
    }
    if (std::all_of(flushed.begin(), flushed.end(), [](bool f) { return f; })) break;
    if (!retry.empty()) {
      // The heter worker may be restarting: ask again shortly.
      std::this_thread::sleep_for(kProbeInterval);
      for (int h : retry) send(h);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (!result.ok()) return Fail(result);
  return Status::OK();
}

}  // namespace fleet::heter
