// Failing together: the fleetruns of a multi-host job watch each other
// through the KV store, so any host's death or refusal fails every host
// within seconds, each naming the host and what it ran.
//
// Each fleetrun publishes a heartbeat under hosts/<id> ("<beat>|<what this
// host runs>") every `beat_every` from a thread of its own (a main loop
// busy stopping processes still beats), under each of its addresses in the
// job (a host named twice is watched under both), and reads its peers' and the job's
// failure marker (job/failed, "<host>: <what failed>"). A peer is dead when
// its heartbeat has not changed for `peer_timeout` (its fleetrun was
// killed, or its host or the network failed); a peer that never beat within
// `join_timeout` never joined. The fleetrun serving the store also hears of
// requests it refused (a wrong job secret): one from a peer's address that
// has not joined fails the job at once (a stranger on a host that joined
// cannot fail it so). The first to see a peer dead or refused writes the
// marker, so every host learns of it. A host that finished or stopped
// marks its heartbeat so and is no longer watched. With `rejoin_timeout`
// (fleetrun --max_restart) a peer whose heartbeat stopped may come back:
// the job fails only when it has not beaten again within that much more.
//
// Thread-safe: the watch thread and the caller share state under a mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/kv_store.h"

namespace fleet::launch {

struct PeerWatchOptions {
  // This host's key under hosts/ and how others name it ("host 10.0.0.3").
  std::string self_id;
  std::string self_name;
  // This host's other keys (its other addresses in the job): beaten too.
  std::vector<std::string> also_ids;
  // What this host runs, from the first heartbeat on (SetProcesses
  // changes it).
  std::string processes;
  struct Peer {
    std::string id;
    std::string name;     // until the peer's own heartbeat names it
    std::string address;  // IPv4, to match refused requests; "" when unknown
  };
  std::vector<Peer> peers;
  std::chrono::milliseconds beat_every{1000};
  // What one request of a round may take (retries included): a store that
  // does not answer within it fails the round, and peer_timeout of failed
  // rounds fails the job, so the store's loss is known within about one
  // budget of peer_timeout.
  std::chrono::milliseconds request_budget{1000};
  std::chrono::milliseconds peer_timeout{5000};
  std::chrono::milliseconds join_timeout{120000};
  // 0: a peer without heartbeat for peer_timeout fails the job. Else it may
  // rejoin (a fleetrun started again there) within this much longer.
  std::chrono::milliseconds rejoin_timeout{0};
  // Lines for the user about peers leaving and rejoining (with
  // rejoin_timeout); called from the watch thread.
  std::function<void(const std::string& line)> note;
  // Why the KV store refused a request from `address` (401/403), nullopt
  // when it refused none; set on the host serving the store. Thread-safe.
  std::function<std::optional<std::string>(const std::string& address)> refused;
};

class PeerWatch {
 public:
  // `kv` must outlive the watch. Starts beating and watching at once.
  PeerWatch(KvStoreClient* kv, PeerWatchOptions options);
  ~PeerWatch();  // stops the thread (within one request timeout)
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // What this host runs, appended to its name in peers' messages; written
  // to the store before it returns (best effort: a failed write is retried
  // by the next heartbeat).
  void SetProcesses(const std::string& processes);
  // Why the job must end, once a peer died, never joined, was refused, or
  // marked the job failed; nullopt while all is well.
  std::optional<std::string> failure() const;
  // This host failed: marks the job failed with "<self name>: <what>" (the
  // first marker stays: later failures are its consequences) and this host
  // stopped.
  void MarkFailed(const std::string& what);
  // This host ended (finished, or stopped because of another's failure):
  // peers no longer watch it. `state` is "done" or "stopped".
  void MarkEnded(const std::string& state);
  // For the host serving the store, after the job failed: waits up to
  // `limit` until every peer alive at the last look has marked itself
  // ended (so each has read the marker before the store goes).
  void AwaitPeersEnded(std::chrono::milliseconds limit);

 private:
  // (Every member has an initializer, for designated initializers.)
  struct Seen {
    std::string value = {};
    std::chrono::steady_clock::time_point changed = {};
    bool joined = false;
    bool ended = false;
    bool awaiting_rejoin = false;                           // gone, within rejoin_timeout
    std::chrono::steady_clock::time_point gone_since = {};  // when awaiting_rejoin began
    std::string gone_incarnation = {};                      // of its last beat then
    // New beats since then of that incarnation, counted while their
    // numbers increase; a rejoin once one of them, after the first, was
    // sent by a watch the store answered within the last 1.5 beats.
    int fresh_beats = 0;
    uint64_t fresh_beat = 0;  // the number of the last one counted
  };
  void Loop();
  // One round: beat, read the marker and the peers. Sets failure_.
  // False when the store did not answer it (the round ended there).
  bool Round();
  std::string SelfValue();
  // Writes `value` under every key of this host; the first failure.
  Status SetSelf(const std::string& value,
                 std::chrono::milliseconds budget = std::chrono::milliseconds(0));
  void SetMarker(const std::string& text);

  KvStoreClient* const kv_;
  const PeerWatchOptions options_;
  const std::string incarnation_;  // this fleetrun's, in its heartbeats
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  // Held while a heartbeat is computed and written, so writes reach the
  // store in the order of their beats. Taken before mu_.
  std::mutex beat_mu_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool ended_ = false;
  std::string processes_;
  std::optional<std::string> failure_;
  uint64_t beat_ = 0;
  std::map<std::string, Seen> seen_;  // by peer id
  std::chrono::steady_clock::time_point last_round_ = started_;
  // A request of the round failed: fails the watch once the store has not
  // answered for peer_timeout. Watch thread only.
  // Returns false (for Round to return).
  bool StoreFailed(const Status& error);
  // The budget of the final writes (marker, end mark): short once the
  // store was lost, else the client's own (0).
  std::chrono::milliseconds FinalWriteBudget() const;
  // The watch failed for the store's loss.
  bool store_lost_ = false;  // guarded by mu_
  // When the store last answered a request of the watch thread (written
  // there; read by every beat, SetProcesses' too).
  std::atomic<std::chrono::steady_clock::time_point> last_store_answer_{started_};
  std::thread thread_;
};

// A host of a multi-host job that refuses to start (its log folder, its
// config, ...) tells the others, so that they fail within seconds naming it
// and the reason instead of waiting out --rendezvous_timeout: it writes the
// job's failure marker (job/failed), serving the store itself for
// `serve_for` first when it is the store's host (the others wait for that
// store). Best effort, bounded by `serve_for`; a host that starts only
// later finds no marker (the store lives in its host's fleetrun).
struct RefusalNotice {
  std::string job_id;
  std::string kv_endpoint;  // where the store is (or will be)
  std::string kv_listen;    // with host_kv: where this host serves it
  bool host_kv = false;
  std::shared_ptr<const JobAuth> auth = nullptr;
  std::string source_address = {};
  std::string text = {};  // "host 10.0.0.2 refused to start: <reason>"
  std::chrono::milliseconds serve_for{6000};
};
void AnnounceRefusal(const RefusalNotice& notice);

}  // namespace fleet::launch
