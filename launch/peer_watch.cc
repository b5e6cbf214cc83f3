#include "launch/peer_watch.h"

#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace fleet::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kFailedKey[] = "job/failed";
// What a last write gets once the store was lost (see FinalWriteBudget).
constexpr milliseconds kLostStoreWriteBudget{500};

std::string Seconds(Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

// "<beat>|<description>" -> description.
std::string Description(const std::string& value) { return value.substr(value.find('|') + 1); }

// A heartbeat "<incarnation>.<beat>.<quiet ms>|<name>": the fleetrun's
// incarnation, the beat's number and how long its sender had been without
// an answer of the store when it wrote it. nullopt for any other value
// ("done|...", "stopped|...").
struct BeatStamp {
  std::string incarnation;
  uint64_t beat = 0;
  int64_t quiet_ms = 0;
};
std::optional<BeatStamp> StampOf(const std::string& value) {
  const std::vector<std::string> parts = absl::StrSplit(value.substr(0, value.find('|')), '.');
  BeatStamp stamp;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &stamp.beat) ||
      !absl::SimpleAtoi(parts[2], &stamp.quiet_ms)) {
    return std::nullopt;
  }
  stamp.incarnation = parts[0];
  return stamp;
}

// A heartbeat's incarnation; "" for a value that is none.
std::string Incarnation(const std::string& value) {
  const std::optional<BeatStamp> stamp = StampOf(value);
  return stamp ? stamp->incarnation : std::string();
}

// Whether `value`, a beat of the incarnation a peer was judged gone in,
// makes it rejoin: counted while beat numbers increase past `*last` (a
// request delivered late may carry an older one), a rejoin from the
// second on once its sender had the store's answer within 1.5 beats. A
// fleetrun cut off writes beats whose quiet time grows (its requests go
// unanswered), and TCP may deliver them after the cut, after that fleetrun
// itself gave up and exited.
bool FreshBeatOfTheOldOne(int* fresh_beats, uint64_t* last, const std::string& value,
                          std::chrono::milliseconds beat_every) {
  const std::optional<BeatStamp> stamp = StampOf(value);
  if (!stamp || stamp->beat <= *last) return false;
  *last = stamp->beat;
  const bool answered = 2 * stamp->quiet_ms <= 3 * beat_every.count();
  return ++*fresh_beats >= 2 && answered;
}

bool Ended(const std::string& value) {
  return value.starts_with("done|") || value.starts_with("stopped|");
}

}  // namespace

PeerWatch::PeerWatch(KvStoreClient* kv, PeerWatchOptions options)
    : kv_(kv),
      options_(std::move(options)),
      incarnation_(absl::StrFormat("%08x", std::random_device()())),
      processes_(options_.processes) {
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

Status PeerWatch::SetSelf(const std::string& value, milliseconds budget) {
  Status first = kv_->Set("hosts/" + options_.self_id, value, budget);
  for (const std::string& id : options_.also_ids) {
    Status st = kv_->Set("hosts/" + id, value, budget);
    if (first.ok()) first = st;
  }
  return first;
}

std::optional<std::string> PeerWatch::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::string PeerWatch::SelfValue() {
  // "<incarnation>.<beat>.<quiet ms>|<name>": a fleetrun started again for
  // this host beats under another incarnation, which tells the peers it
  // rejoined; the quiet time (since the store last answered this watch)
  // tells a beat of a live fleetrun back from a cut from one it wrote
  // during the cut that the network delivered late.
  std::string name = options_.self_name + (processes_.empty() ? "" : " (" + processes_ + ")");
  const auto quiet =
      std::chrono::duration_cast<milliseconds>(Clock::now() - last_store_answer_.load());
  return absl::StrCat(incarnation_, ".", ++beat_, ".", quiet.count(), "|", name);
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
  // stop (or its stopped mark), or loses the store. A host that lost the
  // store leaves the marker be: its own loss is no news to the others.
  if (FinalWriteBudget().count() > 0) return;
  if (kv_->Get(kFailedKey).status().IsNotFound()) (void)kv_->Set(kFailedKey, text);
}

milliseconds PeerWatch::FinalWriteBudget() const {
  // Once the store was lost a write may still get through (the network
  // came back), which tells the peers at once; but it must not hold this
  // host's exit for a request timeout each.
  std::lock_guard<std::mutex> lock(mu_);
  return store_lost_ ? kLostStoreWriteBudget : milliseconds(0);
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
  (void)SetSelf(value, FinalWriteBudget());  // best effort, as SetMarker
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
    const bool store_failed = !Round();
    lock.lock();
    // A round the store did not answer waited out a request's timeout
    // already: the next follows at once, so the store's loss is known within
    // a request of peer_timeout.
    if (!store_failed) wake_.wait_for(lock, options_.beat_every, [this] { return stop_; });
  }
}

bool PeerWatch::StoreFailed(const Status& error) {
  // Without the store this host can judge no peer, and each further
  // request would wait out its own timeout (a store cut off silently
  // answers nothing), so the round ends here. The store is lost once it has
  // not answered for peer_timeout.
  const auto silent = Clock::now() - last_store_answer_.load();
  if (silent < options_.peer_timeout) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_ || ended_) return false;
  store_lost_ = true;
  failure_ = "lost the KV store at " + kv_->endpoint() + " for " + Seconds(silent) + " (" +
             error.message() +
             "): the fleetrun serving it stopped, or its host or the network failed";
  return false;
}

bool PeerWatch::Round() {
  const auto now = Clock::now();
  std::string mine;
  // Heartbeats are computed and written in one order (see SetProcesses).
  std::unique_lock<std::mutex> beat_lock(beat_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_ || failure_) return true;
    // A round that came late (a request that hung): peers could not be
    // observed meanwhile, so the gap is not held against them.
    if (now - last_round_ > 3 * options_.beat_every) {
      for (auto& [id, seen] : seen_) seen.changed = now;
    }
    last_round_ = now;
    mine = SelfValue();
  }
  std::optional<std::string> why;
  const Status beat = SetSelf(mine, options_.request_budget);
  beat_lock.unlock();
  if (!beat.ok()) return StoreFailed(beat);
  last_store_answer_.store(Clock::now());
  Result<std::string> marker = kv_->Get(kFailedKey, options_.request_budget);
  if (!marker.ok() && !marker.status().IsNotFound()) return StoreFailed(marker.status());
  if (marker.ok()) why = "job failed: " + *marker;
  bool from_peer = false;       // a peer died or was refused: tell the others
  bool judged_stopped = false;  // why: a peer's stopped mark
  std::vector<std::string> notes;
  for (const PeerWatchOptions::Peer& peer : options_.peers) {
    Result<std::string> value = kv_->Get("hosts/" + peer.id, options_.request_budget);
    if (!value.ok() && !value.status().IsNotFound()) return StoreFailed(value.status());
    std::optional<std::string> refused;
    if (options_.refused && !peer.address.empty()) refused = options_.refused(peer.address);
    std::lock_guard<std::mutex> lock(mu_);
    Seen& seen = seen_[peer.id];
    if (value.ok() && (!seen.joined || *value != seen.value)) {
      if (!seen.awaiting_rejoin) {
        seen = Seen{.value = *value, .changed = now, .joined = true, .ended = Ended(*value)};
      } else if (value->starts_with("stopped|")) {
        // Its stopped mark, late: still gone, the wait goes on.
        seen.value = *value;
        seen.ended = true;
      } else if (value->starts_with("done|") || Incarnation(*value) != seen.gone_incarnation ||
                 FreshBeatOfTheOldOne(&seen.fresh_beats, &seen.fresh_beat, *value,
                                      options_.beat_every)) {
        // A new fleetrun there, or the old one beating again after a
        // request the store answered.
        notes.push_back(Description(*value) + " rejoined the job after " +
                        Seconds(now - seen.changed) + " without heartbeat");
        seen = Seen{.value = *value, .changed = now, .joined = true, .ended = Ended(*value)};
      } else {
        seen.value = *value;
      }
    }
    if (why) continue;
    const std::string name = seen.joined ? Description(seen.value) : peer.name;
    // A peer that marked itself stopped without a failure marker (it lost
    // the store in a network cut, say, and its mark got through later) is
    // gone as surely as a silent one, and known at once.
    const bool stopped = seen.joined && seen.value.starts_with("stopped|");
    const auto silent = now - seen.changed;
    const auto gone_after =
        stopped ? Clock::duration::zero() : Clock::duration(options_.peer_timeout);
    if (seen.joined &&
        (seen.awaiting_rejoin || ((!seen.ended || stopped) && silent >= gone_after))) {
      const std::string how = stopped ? " stopped without the job finishing"
                                      : " stopped: no heartbeat for " + Seconds(silent);
      const bool may_rejoin = options_.rejoin_timeout.count() > 0;
      if (may_rejoin && !seen.awaiting_rejoin) {
        seen.awaiting_rejoin = true;
        seen.gone_since = now;
        seen.gone_incarnation = Incarnation(seen.value);
        seen.fresh_beats = 0;
        const std::optional<BeatStamp> last = StampOf(seen.value);
        seen.fresh_beat = last ? last->beat : 0;
        notes.push_back(name + how + "; waiting up to " + Seconds(options_.rejoin_timeout) +
                        " for a fleetrun started there again to rejoin (--max_restart)");
      } else if (!may_rejoin || now - seen.gone_since >= options_.rejoin_timeout) {
        judged_stopped = stopped;
        why = name + how +
              (stopped
                   ? std::string(" (its fleetrun failed or was stopped")
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
  if (judged_stopped) {
    // A host that failed wrote the marker before its stopped mark, so the
    // marker read at the top of this round may have come before both.
    if (Result<std::string> marker = kv_->Get(kFailedKey); marker.ok()) {
      why = "job failed: " + *marker;
      from_peer = false;
    }
  }
  if (from_peer) SetMarker(*why);
  if (why) {
    std::lock_guard<std::mutex> lock(mu_);
    // A host that ended meanwhile (its own failure) needs no news.
    if (!failure_ && !ended_) failure_ = std::move(why);
  }
  return true;
}

void AnnounceRefusal(const RefusalNotice& notice) {
  std::unique_ptr<KvStoreServer> store;
  if (notice.host_kv) {
    store = std::make_unique<KvStoreServer>(
        KvStoreServerOptions{.listen = notice.kv_listen, .auth = notice.auth});
    if (!store->Start().ok()) return;  // the port is taken: nobody can be told
  }
  KvStoreClient kv(notice.kv_endpoint, notice.job_id,
                   KvStoreClientOptions{.request_timeout = milliseconds(1000),
                                        .auth = notice.auth,
                                        .source_address = notice.source_address});
  const auto deadline = Clock::now() + notice.serve_for;
  // A store that is not up yet (its host starts later) is tried again.
  while (true) {
    Result<std::string> marker = kv.Get(kFailedKey);
    if (marker.ok()) break;  // another host's failure came first
    if (marker.status().IsNotFound() && kv.Set(kFailedKey, notice.text).ok()) break;
    if (Clock::now() >= deadline) return;
    std::this_thread::sleep_for(milliseconds(200));
  }
  // The store's host keeps the store up while the others read the marker.
  if (store != nullptr) std::this_thread::sleep_for(deadline - Clock::now());
}

}  // namespace fleet::launch
