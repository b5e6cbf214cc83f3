#include "ps/push_log.h"

#include "absl/strings/str_cat.h"
#include "comm/byte_io.h"
#include "comm/checksum.h"

namespace fleet::ps {
namespace {

constexpr std::string_view kLogMagic = "FPSPLOG2";
constexpr size_t kFrameHeader = 2 * sizeof(uint32_t);

template <typename T>
void PutArray(ByteWriter& w, std::span<const T> v) {
  w.Put<uint64_t>(v.size());
  w.PutBytes(std::string_view(reinterpret_cast<const char*>(v.data()), v.size_bytes()));
}

template <typename T>
bool GetArray(ByteReader& r, std::vector<T>* out) {
  uint64_t n = 0;
  std::string_view bytes;
  if (!r.Get(&n) || n > r.remaining() / sizeof(T) || !r.GetBytes(n * sizeof(T), &bytes)) return false;
  out->resize(n);
  std::memcpy(out->data(), bytes.data(), bytes.size());
  return true;
}

bool DecodePayload(std::string_view payload, PushRecord* rec) {
  ByteReader r(payload);
  uint8_t op = 0;
  if (!r.Get(&op) || op < 1 || op > static_cast<uint8_t>(LogOp::kEndPass)) return false;
  rec->op = static_cast<LogOp>(op);
  return r.Get(&rec->table) && r.Get(&rec->step) && r.GetString(&rec->sender) &&
         r.Get(&rec->client) && r.Get(&rec->seq) &&
         GetArray(r, &rec->keys) && GetArray(r, &rec->values) && GetArray(r, &rec->shows) &&
         GetArray(r, &rec->clicks) && r.remaining() == 0;
}

}  // namespace

std::string_view LogSyncName(LogSync sync) {
  switch (sync) {
    case LogSync::kNone: return "none";
    case LogSync::kBatch: return "batch";
    case LogSync::kEvery: return "every";
  }
  return "?";
}

Result<std::unique_ptr<PushLog>> PushLog::Create(FileSystem* fs, std::string path, LogSync sync) {
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  FLEET_RETURN_IF_ERROR(file->Append(kLogMagic));
  FLEET_RETURN_IF_ERROR(file->Sync());
  return std::unique_ptr<PushLog>(new PushLog(std::move(file), std::move(path), sync));
}

PushLog::~PushLog() = default;

Status PushLog::Append(const PushRecordRef& rec) {
  buffer_.assign(kFrameHeader, '\0');
  ByteWriter w(&buffer_);
  w.Put<uint8_t>(static_cast<uint8_t>(rec.op));
  w.Put<uint32_t>(rec.table);
  w.Put<int64_t>(rec.step);
  w.PutString(rec.sender);
  w.Put<uint64_t>(rec.client);
  w.Put<uint64_t>(rec.seq);
  PutArray(w, rec.keys);
  PutArray(w, rec.values);
  PutArray(w, rec.shows);
  PutArray(w, rec.clicks);
  const std::string_view payload = std::string_view(buffer_).substr(kFrameHeader);
  const uint32_t len = static_cast<uint32_t>(payload.size());
  const uint32_t crc = Crc32(payload);
  std::memcpy(buffer_.data(), &len, sizeof(len));
  std::memcpy(buffer_.data() + sizeof(len), &crc, sizeof(crc));
  // One write: a crash leaves at most this record torn, never an earlier one.
  FLEET_RETURN_IF_ERROR(file_->Append(buffer_));
  ++records_;
  bytes_ += buffer_.size();
  if (sync_ == LogSync::kEvery) return file_->Sync();
  unsynced_ = true;
  return Status::OK();
}

Status PushLog::SyncPending() {
  if (sync_ != LogSync::kBatch || !unsynced_) return Status::OK();
  unsynced_ = false;
  return file_->Sync();
}

Status PushLog::Close() {
  if (sync_ != LogSync::kNone) FLEET_RETURN_IF_ERROR(file_->Sync());
  return file_->Close();
}

Result<PushLogContents> ReadPushLog(FileSystem* fs, const std::string& path) {
  Result<std::string> read = fs->ReadFile(path);
  if (!read.ok()) return read.status();
  const std::string_view data = read.value();
  if (!data.starts_with(kLogMagic)) {
    // A crash while the header was written leaves a shorter prefix of it.
    if (data.size() < kLogMagic.size() && kLogMagic.substr(0, data.size()) == data) return PushLogContents{};
    return Status::Corruption("push log header is not FPSPLOG2", path);
  }
  PushLogContents out;
  size_t pos = kLogMagic.size();
  while (pos < data.size()) {
    const size_t left = data.size() - pos;
    uint32_t len = 0, crc = 0;
    bool torn = left < kFrameHeader;
    if (!torn) {
      std::memcpy(&len, data.data() + pos, sizeof(len));
      std::memcpy(&crc, data.data() + pos + sizeof(len), sizeof(crc));
      torn = len > left - kFrameHeader;
    }
    const std::string_view payload =
        torn ? std::string_view() : data.substr(pos + kFrameHeader, len);
    if (torn || Crc32(payload) != crc) {
      // Only the last record can be cut short by a crash mid-append.
      if (torn || pos + kFrameHeader + len == data.size()) {
        out.dropped_torn_tail = true;
        return out;
      }
      return Status::Corruption(absl::StrCat("push log record at byte ", pos,
                                             " fails its checksum and is not the last"),
                                path);
    }
    PushRecord rec;
    if (!DecodePayload(payload, &rec)) {
      return Status::Corruption(absl::StrCat("push log record at byte ", pos, " does not parse"),
                                path);
    }
    out.records.push_back(std::move(rec));
    pos += kFrameHeader + len;
  }
  return out;
}

}  // namespace fleet::ps
