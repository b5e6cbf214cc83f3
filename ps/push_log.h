// PushLog: a server's append-only log of the updates it applied since its
// last recovery checkpoint (server.recovery_dir), so that a server that
// crashed can be rebuilt exactly: load the checkpoint, replay the log in
// order through the same apply code (PsServer).
//
// File layout: "FPSPLOG2", then records, each
//   u32 payload length, u32 crc32 of the payload, payload
// where the payload is u8 op, u32 table, i64 step, string sender, u64
// client, u64 seq (who sent it, so a restarted server still recognises a
// resend of it: PsRequestMeta client_id/sequence, 0 when not numbered), then
// u64 count + elements for keys, values, shows and clicks (little-endian).
// A record is appended with one write(2), before the update it describes is
// acknowledged. A crash in the middle of an append leaves a short or
// mismatching LAST record: ReadPushLog drops it (its update was never
// acknowledged) and says so. A bad record followed by more data is not a
// torn append but damage, and is reported as Corruption.
//
// Durability (LogSync, the server.push_log_sync key):
//   kNone   records reach the OS page cache at once: a process crash
//           (kill -9, abort) loses nothing; a machine crash or power loss
//           loses what the kernel had not written back (seconds).
//   kBatch  as kNone, and SyncPending() (called by the server every 20 ms)
//           fsyncs what was appended since: a machine crash loses at most
//           the last ~20 ms of acknowledged updates. One fsync per tick,
//           whatever the push rate.
//   kEvery  every Append fsyncs before it returns: nothing acknowledged is
//           lost even on power loss, at one fsync (0.1-10 ms) per update.
//
// Thread safety: not thread-safe; PsServer serialises every use under its
// log mutex. Append and SyncPending block for the write (and fsync).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/file_system.h"
#include "comm/status.h"

namespace fleet::ps {

enum class LogSync { kNone, kBatch, kEvery };

std::string_view LogSyncName(LogSync sync);

// What one record does to the tables when replayed (PsServer::ApplyRecord).
enum class LogOp : uint8_t {
  kSparseGrad = 1,   // an async/geo gradient push (keys, values, shows, clicks)
  kSparseDelta = 2,  // a delta push
  kDenseGrad = 3,
  kDenseDelta = 4,
  kSyncSparse = 5,   // a sync step's merged gradient: keys, rows of dim + 2
  kSyncDense = 6,    // a sync step's merged dense gradient
  kDenseAssign = 7,  // init_dense
  kShrink = 8,       // table, or every sparse table when table == kAllTables
  kEndPass = 9,
};
inline constexpr uint32_t kAllTables = 0xffffffffu;

// A record to append; the spans are only read during Append.
struct PushRecordRef {
  LogOp op = LogOp::kSparseGrad;
  uint32_t table = 0;
  int64_t step = -1;  // sync ops: the step applied; -1 otherwise
  std::string_view sender = {};
  uint64_t client = 0;  // PsRequestMeta client_id and sequence; 0: none
  uint64_t seq = 0;
  std::span<const uint64_t> keys = {};
  std::span<const float> values = {};
  std::span<const float> shows = {};
  std::span<const float> clicks = {};
};

// A record read back.
struct PushRecord {
  LogOp op = LogOp::kSparseGrad;
  uint32_t table = 0;
  int64_t step = -1;
  std::string sender;
  uint64_t client = 0;
  uint64_t seq = 0;
  std::vector<uint64_t> keys;
  std::vector<float> values, shows, clicks;
};

class PushLog {
 public:
  // Creates (or truncates) path, writes the header and syncs it.
  // Errors: IOError naming the file.
  static Result<std::unique_ptr<PushLog>> Create(FileSystem* fs, std::string path, LogSync sync);
  ~PushLog();  // closes without syncing (a clean stop calls Close first)

  // Appends one record (one write), and fsyncs it under kEvery. Errors:
  // IOError naming the file; the file may then end in a partial record, so
  // the caller must not append to it again (PsServer refuses updates until
  // the next checkpoint starts a new log).
  Status Append(const PushRecordRef& record);
  // kBatch: fsyncs when something was appended since the last sync; no-op
  // otherwise and under kNone/kEvery. Errors: IOError naming the file.
  Status SyncPending();
  // Syncs (unless kNone) and closes. Errors: IOError naming the file.
  Status Close();

  const std::string& path() const { return path_; }
  uint64_t records() const { return records_; }
  // Bytes of records appended (the header not counted).
  uint64_t bytes() const { return bytes_; }

 private:
  PushLog(std::unique_ptr<WritableFile> file, std::string path, LogSync sync)
      : file_(std::move(file)), path_(std::move(path)), sync_(sync) {}

  std::unique_ptr<WritableFile> file_;
  const std::string path_;
  const LogSync sync_;
  std::string buffer_;  // reused encoding buffer
  uint64_t records_ = 0;
  uint64_t bytes_ = 0;
  bool unsynced_ = false;
};

struct PushLogContents {
  std::vector<PushRecord> records;
  // A torn last record (a crash mid-append) was dropped: its update was
  // never acknowledged.
  bool dropped_torn_tail = false;
};

// Reads a whole log. Errors: NotFound when absent, Corruption naming the
// file and byte offset (bad header, a bad record that is not the last, a
// record whose checksum holds but whose contents do not parse), IOError.
Result<PushLogContents> ReadPushLog(FileSystem* fs, const std::string& path);

}  // namespace fleet::ps
