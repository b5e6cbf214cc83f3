// PsServer's callers that wait for the other workers: sync-mode pushes
// held until every contributor's push of a step arrived (AddSyncContribution),
// barriers, and the watchdog that answers a waiting caller shortly before its
// deadline, naming the workers that did not come (ExpireWaits, WatchWaits).
// Dispatch is in server.cc, recovery in server_recovery.cc.
#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps/server.h"
#include "ps/server_request.h"

namespace fleet::ps {

using internal::Clock;
using internal::kWatchTick;
using internal::ParseMeta;
using internal::ReplyBy;

namespace {

// "worker(s) 1, 3 of 4" for the ranks that did not arrive.
std::string MissingRanks(const std::vector<int>& missing, int of) {
  return absl::StrCat(missing.size() == 1 ? "worker " : "workers ", absl::StrJoin(missing, ", "),
                      " of ", of);
}

}  // namespace

void PsServer::AddSyncContribution(uint32_t table, const pb::PsRequestMeta& meta,
                                   std::span<const uint64_t> keys, std::span<const float> values,
                                   Responder r, Clock::time_point reply_by) {
  const int64_t step = meta.step();
  std::vector<Responder> done;
  Status result;
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    SyncTable& st = sync_[table];
    sync_applying_step_ = step;  // read by the merger's apply callback
    auto added =
        st.merger->Add(step, meta.worker_rank(), keys, values,
                       {.contributors = meta.contributors(), .idempotent = meta.idempotent()});
    if (!added.ok()) {
      result = added.status().WithContext(absl::StrCat("table ", table, " step ", step));
      done.push_back(r);
    } else if (!added.value()) {
      st.waiting[step].push_back({r, reply_by});
      return;  // answered when the last worker's push for this step arrives
    } else {
      for (Waiter& w : st.waiting[step]) done.push_back(std::move(w.responder));
      st.waiting.erase(step);
      done.push_back(r);
      // A failed apply fails every push of the step.
      result = Status::OK();
    }
  }
  for (const Responder& waiting : done) {
    if (result.ok()) {
      served_.fetch_add(1, std::memory_order_relaxed);
      waiting.Reply(Message());
    } else {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      waiting.ReplyError(result);
    }
  }
}

void PsServer::Barrier(Message req, Responder r) {
  auto meta = ParseMeta(req);
  if (!meta.ok()) return r.ReplyError(meta.status());
  const std::string which = absl::StrCat("barrier ", meta->barrier_name());
  if (meta->barrier_size() < 1 || meta->barrier_size() > options_.num_workers) {
    return r.ReplyError(Status::InvalidArgument(
        absl::StrCat("barrier_size ", meta->barrier_size(), " is not in [1, ",
                     options_.num_workers, "] (the job's workers)"),
        which));
  }
  if (meta->worker_rank() < 0 || meta->worker_rank() >= meta->barrier_size()) {
    return r.ReplyError(Status::InvalidArgument(
        absl::StrCat("worker rank ", meta->worker_rank(), " is not in [0, ",
                     meta->barrier_size(), ")"),
        which));
  }
  // A caller counts once (a retry replaces its earlier arrival) and only
  // until shortly before its call's deadline, when ExpireWaits answers it:
  // one that gave up must not release the others of a later round. A
  // resend of an arrival that was released (its reply was lost) is
  // answered at once: the others have left, and it must not count for the
  // next round of the same name.
  Forget(meta->client_id(), meta->acked_below());
  std::vector<Responder> release;
  {
    std::lock_guard<std::mutex> lock(barrier_mu_);
    if (Applied(meta->client_id(), meta->sequence())) return r.Reply(Message());
    BarrierWait& wait = barriers_[meta->barrier_name()];
    if (!wait.arrived.empty() && wait.size != meta->barrier_size()) {
      return r.ReplyError(Status::InvalidArgument(
          absl::StrCat("barrier_size ", meta->barrier_size(), " differs from the ", wait.size,
                       " of the callers waiting"),
          which));
    }
    wait.size = meta->barrier_size();
    wait.came.insert(meta->worker_rank());
    wait.arrived.insert_or_assign(meta->worker_rank(),
                                  Waiter{r, ReplyBy(req, Clock::now()), meta->client_id(),
                                         meta->sequence()});
    if (static_cast<int>(wait.arrived.size()) < wait.size) return;
    for (auto& [rank, arrival] : wait.arrived) {
      release.push_back(arrival.responder);
      (void)Claim(arrival.client, arrival.seq);
    }
    barriers_.erase(meta->barrier_name());
  }
  for (const Responder& w : release) w.Reply(Message());
}

void PsServer::ExpireWaits(Clock::time_point now) {
  std::vector<std::pair<Responder, Status>> answers;
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    for (auto& [table, st] : sync_) {
      for (auto it = st.waiting.begin(); it != st.waiting.end();) {
        const int64_t step = it->first;
        auto first = std::min_element(it->second.begin(), it->second.end(),
                                      [](const Waiter& a, const Waiter& b) { return a.reply_by < b.reply_by; });
        if (first == it->second.end() || first->reply_by > now) {
          ++it;
          continue;
        }
        // The whole step fails: its contributions are dropped so that no
        // later arrival applies a step whose pushers were told it failed.
        int contributors = 0;
        const std::vector<int> missing = st.merger->Missing(step, &contributors);
        st.merger->Abandon(step);
        const Status timeout = Status::Timeout(
            absl::StrCat("sync step ", step, " of table ", table, ": no push from ",
                         MissingRanks(missing, contributors), " within the request deadline (",
                         "Distributed.timeout_ms ", options_.job.distributed.timeout.count(),
                         " ms; answered a tenth early); a worker that stopped or hangs"),
            absl::StrCat("server ", options_.rank));
        LOG(WARNING) << "server " << options_.rank << ": " << timeout.ToString();
        for (Waiter& w : it->second) answers.emplace_back(std::move(w.responder), timeout);
        it = st.waiting.erase(it);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(barrier_mu_);
    for (auto it = barriers_.begin(); it != barriers_.end();) {
      BarrierWait& wait = it->second;
      std::vector<int> missing;
      for (int rank = 0; rank < wait.size; ++rank) {
        if (!wait.came.contains(rank)) missing.push_back(rank);
      }
      for (auto a = wait.arrived.begin(); a != wait.arrived.end();) {
        if (a->second.reply_by > now) {
          ++a;
          continue;
        }
        answers.emplace_back(
            std::move(a->second.responder),
            Status::Timeout(
                absl::StrCat("barrier '", it->first, "' of ", wait.size, ": ",
                             MissingRanks(missing, wait.size),
                             " did not arrive within worker ", a->first, "'s deadline (",
                             "Distributed.timeout_ms ", options_.job.distributed.timeout.count(),
                             " ms unless the call set its own; answered a tenth early)"),
                absl::StrCat("server ", options_.rank)));
        a = wait.arrived.erase(a);
      }
      it = wait.arrived.empty() ? barriers_.erase(it) : std::next(it);
    }
  }
  for (auto& [responder, status] : answers) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    responder.ReplyError(status);
  }
}

void PsServer::WatchWaits() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  while (!watch_stop_) {
    watch_cv_.wait_for(lock, kWatchTick, [this] { return watch_stop_; });
    lock.unlock();
    ExpireWaits(Clock::now());
    SyncLog();
    lock.lock();
  }
}

}  // namespace fleet::ps
