// Reader for CTR data in the Criteo text format.
//
// Line format (one sample per line, "\n" or "\r\n"):
//   label \t I1 .. I13 \t C1 .. C26       (40 tab-separated fields)
//   label  "0" or "1"
//   I1-13  decimal integers, may be negative or empty (missing)
//   C1-26  hexadecimal values of 1 to 16 digits (either case), or empty
//
// Dense features: x > 0 becomes log(1 + x), the usual Criteo transform that
// tames the heavy tail; x <= 0 and a missing value become 0 (the few
// negative Criteo counts carry no signal worth a separate encoding).
//
// Sparse keys: categorical slot s (0-based) with value v becomes
//   CriteoKey(s, v) = Fmix64(v ^ SlotSeed(s)),
//   SlotSeed(s)     = Fmix64(0x9E3779B97F4A7C15 * (s + 1))
// where Fmix64 is MurmurHash3's 64-bit finaliser. Fmix64 is a bijection, so
// within one slot distinct values never share a key; across slots a clash
// has probability ~2^-64 per pair. The function is part of the data format:
// changing it invalidates every saved sparse table.
// A missing categorical is read as the value FFFFFFFFFFFFFFFF, so it gets
// its own per-slot key CriteoMissingKey(s) that the model learns like any
// other value ("missing" is often informative in CTR data). Hence every
// sample has exactly one key in every slot; the batch still uses offsets
// (CSR) so that multi-valued slots need no new layout.
//
// That is every field hashed into one key space, as PaddleRec does (one
// embedding table for all fields). With field_buckets = N > 0 each field is
// a table of its own instead, as DLRM and TorchRec do: slot s owns the N + 1
// keys FieldTableKey(s, 0..N), value v goes to bucket Fmix64(v) % N (values
// of one field may share a row; none crosses into another field's) and a
// missing value to bucket N. The rows of slot s are then a bounded table
// (N + 1 rows, whatever the data), held in disjoint key ranges of the one
// PS sparse table the communicators serve.
//
// Malformed lines (wrong field count, bad label, bad integer, bad hex, empty
// line) are skipped and counted; the first few are logged with file, line
// number and reason, and each epoch that skipped any ends with one summary
// warning. They never stop the reader. Errors of the files themselves
// (missing, unreadable, damaged gzip) do stop it with a Status.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "data/sharded_lines.h"

namespace fleet::data {

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoSlots = 26;
inline constexpr int kCriteoFields = 1 + kCriteoDense + kCriteoSlots;

uint64_t CriteoKey(int slot, uint64_t value);
inline uint64_t CriteoMissingKey(int slot) { return CriteoKey(slot, ~uint64_t{0}); }
// Row `bucket` of slot s's own table: (s + 1) << 40 | bucket.
inline uint64_t FieldTableKey(int slot, uint64_t bucket) {
  return (static_cast<uint64_t>(slot + 1) << 40) | bucket;
}
// The most buckets a field table may have (keys stay below the next slot's).
inline constexpr uint64_t kMaxFieldBuckets = (uint64_t{1} << 40) - 1;

struct CtrSample {
  float label = 0;
  std::array<float, kCriteoDense> dense{};    // transformed as above
  std::array<uint64_t, kCriteoSlots> keys{};  // one key per slot
};

// Parses one line (without its newline), keys as above (field_buckets 0:
// one key space; N: a table of N + 1 rows per field). On error returns
// InvalidArgument whose message says which field is wrong and quotes it;
// *out is then unspecified. REQUIRES: field_buckets <= kMaxFieldBuckets.
Status ParseCriteoLine(std::string_view line, CtrSample* out, uint64_t field_buckets = 0);

// Keys of one slot for a batch in CSR form: sample i owns
// keys[offsets[i] .. offsets[i + 1]).
struct SlotKeys {
  std::vector<uint64_t> keys;
  std::vector<uint32_t> offsets{0};  // [B + 1]
};

struct CtrBatch {
  std::vector<float> labels;  // [B]
  std::vector<float> dense;   // [B, kCriteoDense] row-major
  std::array<SlotKeys, kCriteoSlots> slots;

  size_t size() const { return labels.size(); }
  // Empties the batch, keeping capacity.
  void Clear();
  void Append(const CtrSample& sample);
};

struct CtrReaderOptions {
  // Samples per batch; the last batch of an epoch may be smaller.
  int batch_size = 512;
  // This worker's share of the lines: see ShardedLineReader.
  int rank = 0;
  int world_size = 1;
  // How many malformed lines are logged one by one over the reader's life;
  // the rest are only counted. Raise it when debugging a data set.
  int max_logged_errors = 5;
  // 0: every field hashed into one key space; N > 0: a table of N + 1 rows
  // per field (see the top of this file). At most kMaxFieldBuckets.
  uint64_t field_buckets = 0;
};

// Counts since the reader was opened, over all epochs.
struct CtrReaderStats {
  int64_t lines = 0;      // lines owned by this worker, parsed or not
  int64_t samples = 0;    // lines parsed into samples
  int64_t malformed = 0;  // lines skipped as malformed
};

class CtrReader {
 public:
  // InvalidArgument for batch_size < 1, field_buckets above
  // kMaxFieldBuckets or a bad rank/world_size. The files
  // are opened as the reader reaches them.
  static Result<std::unique_ptr<CtrReader>> Open(std::vector<std::string> files,
                                                 const CtrReaderOptions& options);

  // Replaces *batch with up to batch_size samples and returns how many; 0
  // means the epoch is over (call Rewind() to start the next). On error
  // (a file missing, unreadable or damaged) *batch holds the samples read
  // before it and the reader must be rewound or dropped.
  Result<size_t> Next(CtrBatch* batch);

  // Starts a new epoch from the first line. Stats keep accumulating.
  void Rewind();

  const CtrReaderStats& stats() const { return stats_; }

 private:
  CtrReader(std::unique_ptr<ShardedLineReader> lines, const CtrReaderOptions& options);
  void NoteMalformed(const LineRef& line, const Status& why);

  const CtrReaderOptions options_;
  std::unique_ptr<ShardedLineReader> lines_;
  CtrReaderStats stats_;
  int64_t epoch_lines_ = 0;
  int64_t epoch_malformed_ = 0;
};

}  // namespace fleet::data
