#include "launch/peer_watch.h"

#include <cstdio>

namespace fleet::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kFailedKey[] = "job/failed";

std::string Seconds(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

// "<beat>|<description>" -> description.
std::string Description(const std::string& value) { return value.substr(value.find('|') + 1); }

bool Ended(const std::string& value) {
  return value.starts_with("done|") || value.starts_with("stopped|");
}

}  // namespace

PeerWatch::PeerWatch(KvStoreClient* kv, PeerWatchOptions options)
    : kv_(kv), options_(std::move(options)), processes_(options_.processes) {
  thread_ = std::thread([this] { Loop(); });
}

PeerWatch::~PeerWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void PeerWatch::SetProcesses(const std::string& processes) {
  // Published before returning, so a caller that starts the processes next
  // has them named in the store before any of them runs.
  std::lock_guard<std::mutex> beat_lock(beat_mu_);
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    processes_ = processes;
    if (ended_) return;
    mine = SelfValue();
  }
  (void)SetSelf(mine);  // the next round retries a failure
}

Status PeerWatch::SetSelf(const std::string& value) {
  Status first = kv_->Set("hosts/" + options_.self_id, value);
  for (const std::string& id : options_.also_ids) {
    Status st = kv_->Set("hosts/" + id, value);
    if (first.ok()) first = st;
  }
  return first;
}

std::optional<std::string> PeerWatch::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::string PeerWatch::SelfValue() {
  std::string name = options_.self_name + (processes_.empty() ? "" : " (" + processes_ + ")");
  return std::to_string(++beat_) + "|" + name;
}

void PeerWatch::MarkFailed(const std::string& what) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    name = options_.self_name + (processes_.empty() ? "" : " (" + processes_ + ")");
  }
  // The first failure is the cause; later ones are its consequences.
  SetMarker(name + ": " + what);
  MarkEnded("stopped");
}

void PeerWatch::SetMarker(const std::string& text) {
  // Best effort: a peer that misses it still sees this host's heartbeat
  // stop, or loses the store.
  if (kv_->Get(kFailedKey).status().IsNotFound()) (void)kv_->Set(kFailedKey, text);
}

void PeerWatch::MarkEnded(const std::string& state) {
  // After any heartbeat in flight, so none overwrites the end.
  std::lock_guard<std::mutex> beat_lock(beat_mu_);
  std::string value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    ended_ = true;
    value = state + "|" + options_.self_name + (processes_.empty() ? "" : " (" + processes_ + ")");
  }
  (void)SetSelf(value);  // best effort, as SetMarker
}

void PeerWatch::AwaitPeersEnded(milliseconds limit) {
  const auto now = Clock::now(), deadline = now + limit;
  // Only peers alive at the last look can still read the marker.
  std::vector<std::string> alive;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, seen] : seen_) {
      if (seen.joined && !seen.ended && now - seen.changed < options_.peer_timeout)
        alive.push_back(id);
    }
  }
  while (!alive.empty() && Clock::now() < deadline) {
    std::erase_if(alive, [this](const std::string& id) {
      Result<std::string> v = kv_->Get("hosts/" + id);
      return v.ok() && Ended(*v);
    });
    if (!alive.empty()) std::this_thread::sleep_for(milliseconds(100));
  }
}

void PeerWatch::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    Round();
    lock.lock();
    wake_.wait_for(lock, options_.beat_every, [this] { return stop_; });
  }
}

void PeerWatch::StoreFailed(const Status& error) {
  // Without the store this host can judge no peer, and each further
  // request would wait out its own timeout (a store cut off silently
  // answers nothing), so the round ends here. The store is lost once it has
  // not answered for peer_timeout.
  const auto silent = Clock::now() - last_store_answer_;
  if (silent < options_.peer_timeout) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_ || ended_) return;
  failure_ = "lost the KV store at " + kv_->endpoint() + " for " + Seconds(silent) + " (" +
             error.message() +
             "): the fleetrun serving it stopped, or its host or the network failed";
}

void PeerWatch::Round() {
  const auto now = Clock::now();
  std::string mine;
  // Heartbeats are computed and written in one order (see SetProcesses).
  std::unique_lock<std::mutex> beat_lock(beat_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_ || failure_) return;
    // A round that came late (a request that hung): peers could not be
    // observed meanwhile, so the gap is not held against them.
    if (now - last_round_ > 3 * options_.beat_every) {
      for (auto& [id, seen] : seen_) seen.changed = now;
    }
    last_round_ = now;
    mine = SelfValue();
  }
  std::optional<std::string> why;
  const Status beat = SetSelf(mine);
  beat_lock.unlock();
  if (!beat.ok()) return StoreFailed(beat);
  last_store_answer_ = Clock::now();
  Result<std::string> marker = kv_->Get(kFailedKey);
  if (!marker.ok() && !marker.status().IsNotFound()) return StoreFailed(marker.status());
  if (marker.ok()) why = "job failed: " + *marker;
  bool from_peer = false;  // a peer died or was refused: tell the others
  std::vector<std::string> notes;
  for (const PeerWatchOptions::Peer& peer : options_.peers) {
    Result<std::string> value = kv_->Get("hosts/" + peer.id);
    if (!value.ok() && !value.status().IsNotFound()) return StoreFailed(value.status());
    std::optional<std::string> refused;
    if (options_.refused && !peer.address.empty()) refused = options_.refused(peer.address);
    std::lock_guard<std::mutex> lock(mu_);
    Seen& seen = seen_[peer.id];
    if (value.ok() && (!seen.joined || *value != seen.value)) {
      if (seen.awaiting_rejoin && !Ended(*value)) {
        notes.push_back(Description(*value) + " rejoined the job after " +
                        Seconds(now - seen.changed) + " without heartbeat");
      }
      seen = Seen{*value, now, true, Ended(*value)};
    }
    if (why) continue;
    const std::string name = seen.joined ? Description(seen.value) : peer.name;
    // A peer that marked itself stopped without a failure marker (it lost
    // the store in a network cut, say, and its mark got through later) is
    // gone as surely as a silent one, and known at once.
    const bool stopped = seen.joined && seen.value.starts_with("stopped|");
    const auto silent = now - seen.changed;
    const auto gone_after = stopped ? Clock::duration::zero() : Clock::duration(options_.peer_timeout);
    if (seen.joined && (!seen.ended || stopped) && silent >= gone_after) {
      const std::string how = stopped ? " stopped without the job finishing"
                                      : " stopped: no heartbeat for " + Seconds(silent);
      const bool may_rejoin = options_.rejoin_timeout.count() > 0;
      if (may_rejoin && silent < gone_after + options_.rejoin_timeout) {
        if (!seen.awaiting_rejoin) {
          seen.awaiting_rejoin = true;
          notes.push_back(name + how + "; waiting up to " + Seconds(options_.rejoin_timeout) +
                          " for a fleetrun started there again to rejoin (--max_restart)");
        }
      } else {
        why = name + how +
              (stopped ? std::string(" (its fleetrun failed or was stopped")
                       : std::string(" (its fleetrun was killed, or the host or the network failed")) +
              (may_rejoin ? "; no fleetrun rejoined for it within " +
                                Seconds(options_.rejoin_timeout) + ")"
                          : ")");
      }
    } else if (!seen.joined && refused) {
      why = name + " was refused by the KV store: " + *refused +
            "; every host needs the same --job_secret_file";
    } else if (!seen.joined && now - started_ >= options_.join_timeout) {
      why = name + " never joined through the KV store at " + kv_->endpoint() + " within " +
            Seconds(options_.join_timeout);
    }
    from_peer = why.has_value();
  }
  if (options_.note) {
    for (const std::string& line : notes) options_.note(line);
  }
  if (from_peer) SetMarker(*why);
  if (why) {
    std::lock_guard<std::mutex> lock(mu_);
    // A host that ended meanwhile (its own failure) needs no news.
    if (!failure_ && !ended_) failure_ = std::move(why);
  }
}

}  // namespace fleet::launch
