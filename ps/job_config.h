// JobConfig: the YAML job file every process of a job reads (configs/*.yaml),
// read by the one config reader (comm/yaml_config.h): it may name a base
// file (`_base_: ./base.yaml`, merged under it key by key), and `-o
// Key.sub=value` overrides apply last. The parameter server reads `tables`,
// `Distributed` and `server`; the trainer reads its own sections from the
// same document (JobConfig::root): `model`, `data`, `train`
// (worker/config.h). Any other top-level key, and any unknown key inside a
// section, is refused with an error naming it and the file (or -o) that set
// it, so a typo ("Distribued", "trian.epochs") never leaves a default in
// place silently. Every count and size has a maximum (below), so a huge
// value is an error naming the key, not a failed allocation.
//
// This block and the comments of DistributedConfig and ServerConfig below
// are where the PS keys are documented; tables' keys are in
// ps/table/table_config.h, the workers' in worker/config.h.
//
//   Distributed:
//     mode: sync            # sync | async | geo (default sync)
//     k_steps: 100          # geo: push deltas every k_steps local steps
//     max_merge: 10         # async: batches merged per key before a send
//     timeout_ms: 60000     # deadline of every PS request (<= 86400000, one day)
//     max_request_bytes: 1048576  # larger requests to one server go in pieces
//     max_message_bytes: 0  # the largest message frame accepted (0: derived)
//     busy_poll_us: 0       # poll this long before sleeping (latency vs CPU; <= 1000000)
//     auth: on              # authenticate the job's ZeroMQ traffic (on | off)
//     server_restart_timeout_ms: 30000  # with server.recovery_dir: resend to a crashed server
//     heter:                # jobs with heter workers (heter/): the CPU-worker side
//       pipeline_depth: 4   # micro-batches a CPU worker keeps in flight (async, geo)
//       micro_batches: 1    # pieces each mini-batch is cut into
//       down_timeout_ms: 4000  # a heter worker unreachable this long fails the job
//   server:
//     threads: 2            # shard-parallel table work per server (<= 256)
//     save_dir: ""          # save here when stopped (SIGTERM or stop request);
//                           # checked writable at start
//     load_dir: ""          # load this checkpoint at start
//     recovery_dir: ""      # crash recovery: checkpoints + push log (off)
//     checkpoint_every: 1000  # recovery checkpoint after this many logged updates
//     push_log_sync: batch  # none | batch | every (what a machine crash loses)
//   tables:                 # see ps/table/table_config.h for each key
//     - {id: 0, kind: sparse, dim: 8, ...}
//
// Thread safety: plain values.
#pragma once

#include <yaml-cpp/yaml.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/program_help.h"
#include "comm/van.h"
#include "comm/status.h"
#include "comm/yaml_config.h"
#include "ps/push_log.h"
#include "ps/table/table_config.h"

namespace fleet::ps {

enum class SyncMode { kSync, kAsync, kGeo };

// The top-level sections of a job document the workers read (worker/config.h);
// the servers read Distributed, server and tables.
inline constexpr const char* kWorkerSections[] = {"model", "data", "train"};

// Maxima of the count and size keys (each key's comment names its own).
inline constexpr int64_t kMaxKSteps = 1'000'000;
inline constexpr int64_t kMaxMaxMerge = 1'000'000;
inline constexpr int64_t kMaxTimeoutMs = 86'400'000;         // one day
inline constexpr int64_t kMaxBusyPollUs = 1'000'000;
inline constexpr int64_t kMaxRequestBytes = int64_t{1} << 30;  // 1 GiB
inline constexpr int64_t kMinMessageBytes = int64_t{1} << 20;  // 1 MiB
inline constexpr int64_t kMaxMessageBytes = int64_t{1} << 34;  // 16 GiB
inline constexpr int64_t kMaxPipelineDepth = 1024;
inline constexpr int64_t kMaxMicroBatches = 1024;
inline constexpr int64_t kMaxServerThreads = 256;
inline constexpr int64_t kMaxCheckpointEvery = 1'000'000'000;

std::string_view SyncModeName(SyncMode mode);

// `Distributed.heter`: how CPU workers use heter workers. Ignored by jobs
// without heter workers.
struct HeterConfig {
  // `Distributed.heter.pipeline_depth`: default 4, 1..1024. Micro-batches a CPU
  // worker keeps in flight to heter workers in async and geo mode: while the
  // dense side computes, the worker reads, pulls and pools the next ones.
  // More hides more of the round trip and keeps more heter workers busy, at
  // the price of staler parameters and of the inputs held meanwhile (slots
  // x batch x dim floats each). Sync mode does not use it: a step's
  // micro-batches are all sent at once (their dense gradients are applied
  // as one step, and each reply waits for that) and the next step starts
  // once this one is applied.
  int pipeline_depth = 4;
  // `Distributed.heter.micro_batches`: default 1, 1..1024. Pieces each
  // mini-batch (train.batch_size samples) is cut into, each one call to a
  // heter worker. In sync mode this is what overlaps the two sides: the
  // worker pools piece m + 1 while piece m computes; a step's dense gradient
  // then has workers x micro_batches parts, summed in a fixed order. Smaller
  // pieces mean more, smaller GEMMs.
  int micro_batches = 1;
  // `Distributed.heter.down_timeout_ms`: default 4000, 1..86400000. How long a heter
  // worker may stay unreachable (its calls failing) before the job fails
  // naming it; meanwhile its micro-batches go to the others. Raise it when
  // a heter worker restarted by fleetrun --max_restart needs longer to come
  // back; a heter worker that stops answering is noticed after the
  // transport's 5 s heartbeat timeout, and fails the job this much later.
  std::chrono::milliseconds down_timeout{4000};
};

struct DistributedConfig {
  // `Distributed.mode`: default sync. sync is reproducible and converges
  // like one big batch but waits for the slowest worker every step; async
  // never waits but applies stale gradients; geo trains local copies and
  // exchanges deltas every k_steps, the least traffic of the three.
  SyncMode mode = SyncMode::kSync;
  // `Distributed.k_steps` (geo): default 100, 1..1000000. Fewer means fresher
  // parameters and more traffic.
  int k_steps = 100;
  // `Distributed.max_merge` (async): default 10, 1..1000000. How many batches of
  // gradients the communicator merges before one send; more means less
  // traffic and staler updates.
  int max_merge = 10;
  // `Distributed.timeout_ms`: default 60000, 1..86400000. No PS request
  // waits longer; raise it for very large saves or slow networks. A worker
  // waiting at a sync step or barrier for another that never comes is told
  // which worker is missing a tenth of this (at most 2 s) before it expires.
  std::chrono::milliseconds timeout{60000};
  // `Distributed.max_request_bytes`: default 1048576 (1 MiB), 0..2^30. A
  // worker's sparse pull, or async/geo push, carrying more values than this
  // to one server goes out as several requests of at most this size, back
  // to back, so the server serves the first while the rest are in flight.
  // 0 never cuts. Sync-mode pushes are never cut.
  int64_t max_request_bytes = int64_t{1} << 20;
  // `Distributed.max_message_bytes`: default 0 (derived, MessageLimit()),
  // else 1 MiB..2^34. The largest frame of a message a process of the job
  // accepts (ZeroMQ's ZMQ_MAXMSGSIZE) or sends: a peer announcing a larger
  // one is disconnected before its bytes are buffered, so a stranger's
  // connection costs a server at most this much before the greeting proves
  // (or fails to prove) the job secret. Derived: the largest of 64 MiB, four
  // times max_request_bytes and the largest dense table's floats. Raise it
  // only for sync pushes or dense tables past that (a larger send fails
  // naming this key).
  int64_t max_message_bytes = 0;
  // `Distributed.busy_poll_us`: default 0, 0..1000000. Servers and workers
  // keep polling their sockets for this long after a message (a worker: while
  // it waits for a reply) instead of sleeping at once, which saves the
  // wake-ups that dominate a small request's round trip on VMs, at the price
  // of a CPU busy meanwhile (VanOptions::busy_poll). For latency-bound jobs
  // with cores to spare; 0 never spins.
  std::chrono::microseconds busy_poll{0};
  // `Distributed.server_restart_timeout_ms`: default 30000, 0..86400000.
  // With server.recovery_dir set (a crashed server comes back with every
  // acknowledged update under fleetrun --max_restart), a worker's request
  // that fails because its server was lost (Unavailable after the server
  // had been reached) is sent again to the same server until it is
  // answered or this long has passed since the first failure, so a running
  // job rides out a server restart (PsClient: resends are never applied
  // twice). It must cover the restart: fleetrun noticing the death, the
  // new process loading the recovery checkpoint and replaying its log.
  // 0, or no recovery_dir: a lost server fails the call at once.
  std::chrono::milliseconds server_restart_timeout{30000};
  // `Distributed.auth`: default on. On: every message of the job's ZeroMQ
  // traffic (servers, workers, heter workers) is authenticated (comm/van_auth.h)
  // under keys derived from the job secret (comm/job_auth.h), so only the
  // job's processes get in; values travel in the clear. Off: plain TCP, anyone
  // who reaches a port can pull, push, save or stop; only for a trusted network.
  // On costs a round trip per connection and a MAC pass over every byte on each
  // side (README: figures). fleetrun --auth=off (FLEET_AUTH=off) turns it off
  // too, and also the KV store's request signing.
  bool auth = true;
  HeterConfig heter;
};

struct ServerConfig {
  // `server.threads`: default 2, 1..256. Threads working on table shards in
  // parallel, per server.
  int threads = 2;
  // `server.save_dir`: default empty (no save). When set, a server that is
  // told to stop (SIGTERM, or the launcher ending the job) first saves a base
  // checkpoint here. Created if missing and checked writable at start (a
  // probe file is created and removed): the server refuses to start
  // otherwise.
  std::string save_dir;
  // `server.load_dir`: default empty. When set, the server loads this
  // checkpoint before it starts serving (and refuses to start if it can't).
  std::string load_dir;
  // `server.recovery_dir`: default empty (off). When set, each server keeps
  // in <recovery_dir>/s<rank>/ a private checkpoint of its tables and a push
  // log (ps/push_log.h) of every update applied since, appended before the
  // update is acknowledged; a server restarted by fleetrun --max_restart
  // (FLEET_RESTART > 0) loads that checkpoint and replays the log, so no
  // acknowledged update is lost and sync steps continue where they were.
  // Costs one append per applied update (a sync step of a table, an
  // async/geo push) under one lock per server, the fsyncs of
  // push_log_sync, and a full checkpoint every checkpoint_every updates.
  // Use it on long jobs with --max_restart; must differ from save_dir and
  // load_dir. A server started afresh (not restarted) starts a new chain
  // over what is there. A clean stop leaves it alone (save_dir gets the
  // final checkpoint as before) and, once the job finished (the final save
  // succeeded), removes this server's recovery files unless keep_recovery.
  // Recovery checkpoints do not disturb the job's own base/delta saves;
  // after a restart the first save must be a base (the delta marks of
  // before the crash are gone).
  std::string recovery_dir;
  // `server.keep_recovery`: default false. Keep <recovery_dir>/s<rank>/ (the
  // last recovery checkpoint and its push log) after the job finished, e.g.
  // to inspect it; by default a finished job leaves nothing there. A job
  // that failed or was stopped always keeps it (a restart needs it).
  bool keep_recovery = false;
  // `server.checkpoint_every`: default 1000, 1..10^9. Logged updates between
  // two recovery checkpoints: a checkpoint writes every table (the update
  // that triggers it waits for that), and bounds the log a restart replays
  // and its disk use. Lower it for big updates or fast restarts; raise it
  // for big tables and small updates.
  int64_t checkpoint_every = 1000;
  // `server.checkpoint_every_mib`: default 256, 1..2^20. A recovery
  // checkpoint is also taken once the push log holds this many MiB, so
  // big updates (a dense table's gradient) cannot grow the log (and a
  // restart's replay) past it; each checkpoint starts a new log and removes
  // the older ones.
  int64_t checkpoint_every_mib = 256;
  // `server.push_log_sync`: default batch. When the push log reaches stable
  // storage. none: never fsynced; a process crash (kill -9) loses nothing
  // (the records are in the OS), a machine crash loses seconds of
  // acknowledged updates. batch: fsynced every 20 ms when something was
  // appended; a machine crash loses at most ~20 ms of acknowledged updates,
  // for one fsync per 20 ms. every: fsynced before each update is
  // acknowledged; nothing is lost even on power loss, at one fsync per
  // update (README has the measured costs).
  LogSync push_log_sync = LogSync::kBatch;
};

struct JobConfig {
  YAML::Node root;  // the whole document, overrides applied
  DistributedConfig distributed;
  ServerConfig server;
  std::vector<TableConfig> tables;

  // nullptr when no table has this id.
  const TableConfig* table(uint32_t id) const;
};

// The largest message frame the job's processes send or accept:
// Distributed.max_message_bytes, or when 0 the largest of 64 MiB, four
// times max_request_bytes and the largest dense table's floats.
int64_t MessageLimit(const JobConfig& job);

// The transport options every process of a PS job uses: Distributed's
// busy_poll and message limit, with the job's credentials (null: auth off)
// and CURVE encryption when asked.
VanOptions JobVanOptions(const JobConfig& job, std::shared_ptr<const JobAuth> auth,
                         bool encrypt = false);

// One "Key.sub=value" override onto a YAML tree (comm/yaml_config.h).
using ::fleet::ApplyOverride;

// Reads `path` and its `_base_` chain and applies the overrides in order.
// Errors: NotFound (a file of the chain), InvalidArgument (YAML syntax with
// file and line, a `_base_` cycle, or an override that cannot apply, named
// "-o Key.sub=value: ...").
Result<ConfigDocument> LoadJobDocument(const std::string& path,
                                       const std::vector<std::string>& overrides);

// LoadJobDocument, then ParseJobConfig. Errors: as both; a bad key's error
// names the key and the file or -o that set it
// ("server.thread: unknown key (from -o server.thread=2); ...").
Result<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides);

// The job config named by --config (else FLEET_CONFIG) with the overrides
// of --override (else FLEET_OVERRIDES), both ';'-separated lists of
// "Key.sub=value". Errors: InvalidArgument when neither names a config,
// else as LoadJobConfig.
Result<JobConfig> JobConfigFromFlagsAndEnv(
    const std::function<std::optional<std::string>(const std::string&)>& env);

// --config and --override as --help shows them (ps_server, ps_worker, heter_worker).
HelpGroup JobConfigHelpGroup();

// Parses an already loaded document. Errors: InvalidArgument naming the key
// and its source.
Result<JobConfig> ParseJobConfig(const ConfigDocument& doc);
// The same for a tree built in code (tests, tools): errors name keys only.
Result<JobConfig> ParseJobConfig(YAML::Node root);

}  // namespace fleet::ps
