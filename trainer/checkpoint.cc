#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fleet::trainer {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'T', 'C', 'K', 'P', 'T', '\0'};

// Bounds-checked reader: any overrun sets failed() instead of reading.
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  bool Get(T* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return Fail();
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n = 0;
    if (!Get(&n) || static_cast<size_t>(end_ - p_) < n) return Fail();
    s->assign(p_, n);
    p_ += n;
    return true;
  }
  const char* Take(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) {
      Fail();
      return nullptr;
    }
    const char* at = p_;
    p_ += n;
    return at;
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  bool Fail() {
    p_ = end_;
    return false;
  }
  const char* p_;
  const char* end_;
};

Status ErrnoStatus(std::string_view what, const std::string& path) {
  return Status::IOError(std::string(what) + " failed (" + std::strerror(errno) + ")", path);
}

Status WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write", path);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Result<std::vector<char>> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("checkpoint file does not exist", path);
    return ErrnoStatus("open for reading", path);
  }
  std::vector<char> bytes;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, chunk, sizeof(chunk));
    if (r < 0) {
      if (errno == EINTR) continue;
      Status st = ErrnoStatus("read", path);
      ::close(fd);
      return st;
    }
    if (r == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + r);
  }
  ::close(fd);
  return bytes;
}

// CRC-32 (zlib's) of `n` bytes continuing from `crc` (0 to start).
uint32_t Crc32(uint32_t crc, const char* data, size_t n) {
  uLong c = crc;
  while (n > 0) {  // zlib takes uInt lengths
    const uInt part = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(data), part);
    data += part;
    n -= part;
  }
  return static_cast<uint32_t>(c);
}

// Writes a checkpoint to "<path>.tmp" as it is produced, with a running
// CRC-32 of every byte, then syncs it and renames it over `path`, so that
// saving never holds a second whole copy of the parameters in host memory
// (a 10B model's would be 40 GB). Errors stick: after the first one every
// call does nothing and Commit returns it; the temporary file is removed
// unless Commit succeeded, and `path` is untouched.
class CheckpointFileWriter {
 public:
  explicit CheckpointFileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) status_ = ErrnoStatus("open for writing", tmp_);
  }
  ~CheckpointFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;

  template <typename T>
  void Put(const T& v) {
    Write(&v, sizeof(T));
  }
  void PutString(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    Write(s.data(), s.size());
  }
  void Write(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    crc_ = Crc32(crc_, p, n);
    if (pending_.size() + n <= kPendingBytes) {
      pending_.insert(pending_.end(), p, p + n);
      return;
    }
    Flush();
    if (status_.ok()) status_ = WriteAll(fd_, p, n, tmp_);
  }
  // `floats` floats of `backend` memory: written in place from host memory,
  // through a bounded staging buffer from a device's.
  void WriteFrom(Backend* backend, const float* src, size_t floats) {
    if (backend->device().is_cpu()) return Write(src, floats * sizeof(float));
    std::vector<float> staging(std::min(floats, kStagingFloats));
    for (size_t at = 0; at < floats && status_.ok(); at += staging.size()) {
      const size_t n = std::min(staging.size(), floats - at);
      backend->CopyToHost(staging.data(), src + at, n * sizeof(float));
      Write(staging.data(), n * sizeof(float));
    }
  }
  // Appends the CRC-32 of everything written before it, syncs the file,
  // renames it over the target and makes the rename durable.
  Status Commit() {
    const uint32_t crc = crc_;
    Put(crc);
    Flush();
    if (status_.ok() && ::fsync(fd_) != 0) status_ = ErrnoStatus("fsync", tmp_);
    if (fd_ >= 0 && ::close(fd_) != 0 && status_.ok()) status_ = ErrnoStatus("close", tmp_);
    fd_ = -1;
    if (status_.ok() && ::rename(tmp_.c_str(), path_.c_str()) != 0) {
      status_ = ErrnoStatus("rename to " + path_, tmp_);
    }
    if (!status_.ok()) return status_;
    committed_ = true;
    std::string dir = std::filesystem::path(path_).parent_path().string();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return Status::OK();
  }

 private:
  static constexpr size_t kPendingBytes = size_t{1} << 20;
  static constexpr size_t kStagingFloats = size_t{16} << 20;  // 64 MiB

  void Flush() {
    if (status_.ok() && !pending_.empty()) status_ = WriteAll(fd_, pending_.data(), pending_.size(), tmp_);
    pending_.clear();
  }

  const std::string path_;
  const std::string tmp_;
  int fd_ = -1;
  uint32_t crc_ = 0;
  std::vector<char> pending_;  // small writes gathered into one write(2)
  Status status_;
  bool committed_ = false;
};

// One entry of a checkpoint's tensor table.
struct StoredTensor {
  std::string name;
  std::vector<int64_t> dims;

  bool Matches(const ParamSpec& spec) const {
    if (name != spec.name || static_cast<int>(dims.size()) != spec.shape.ndim()) return false;
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d] != spec.shape[static_cast<int>(d)]) return false;
    return true;
  }
  std::string ToString() const {
    std::string s = "\"" + name + "\" [";
    for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
    return s + "]";
  }
};

std::string Describe(const ParamSpec& spec) {
  return "\"" + spec.name + "\" " + spec.shape.ToString();
}

// A checkpoint file read and checked against `arena`: magic, version,
// checksum, tensor table equal to the arena's, data of the stated length.
struct CheckedCheckpoint {
  std::vector<char> bytes;
  std::string optimizer;
  int64_t step = 0;
  uint32_t num_states = 0;
  const char* params = nullptr;  // into bytes: f32 [arena size], then the states
};

Result<CheckedCheckpoint> ReadCheckedCheckpoint(const std::string& path, const ParamArena& arena) {
  CheckedCheckpoint ck;
  FLEET_ASSIGN_OR_RETURN(ck.bytes, ReadFile(path));
  const std::vector<char>& bytes = ck.bytes;
  if (bytes.size() < sizeof(kMagic) + sizeof(uint32_t) * 2 ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Status::Corruption("not a FleetPS checkpoint (bad magic or too short)", path);
  }
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - sizeof(uint32_t), sizeof(uint32_t));
  const size_t body = bytes.size() - sizeof(uint32_t);
  if (Crc32(0, bytes.data(), body) != stored_crc) {
    return Status::Corruption("checkpoint checksum mismatch (truncated or damaged)", path);
  }
  Reader r(bytes.data() + sizeof(kMagic), body - sizeof(kMagic));
  const auto truncated = [&] { return Status::Corruption("checkpoint header is truncated", path); };

  uint32_t version = 0;
  if (!r.Get(&version)) return truncated();
  if (version != kCheckpointVersion) {
    return Status::Corruption("unsupported checkpoint version " + std::to_string(version), path);
  }
  uint32_t num_tensors = 0;
  if (!r.GetString(&ck.optimizer) || !r.Get(&ck.step) || !r.Get(&num_tensors)) return truncated();
  if (ck.step < 0) return Status::Corruption("negative step in checkpoint", path);
  // The whole table first, then the comparison, so that a model of another
  // shape is told the first tensor that differs.
  if (num_tensors > r.remaining() / (2 * sizeof(uint32_t))) return truncated();
  std::vector<StoredTensor> table(num_tensors);
  for (StoredTensor& t : table) {
    uint32_t ndim = 0;
    if (!r.GetString(&t.name) || !r.Get(&ndim)) return truncated();
    if (ndim > Shape::kMaxDims) return Status::Corruption("tensor with > 4 dims: " + t.name, path);
    t.dims.resize(ndim);
    for (int64_t& d : t.dims)
      if (!r.Get(&d)) return truncated();
  }
  const std::vector<ParamSpec>& model = arena.table();
  for (size_t i = 0; i < std::min(table.size(), model.size()); ++i) {
    if (!table[i].Matches(model[i])) {
      return Status::FailedPrecondition("checkpoint tensors differ from the model's at #" +
                                            std::to_string(i) + ": checkpoint " +
                                            table[i].ToString() + ", model " + Describe(model[i]),
                                        path);
    }
  }
  if (table.size() != model.size()) {
    const bool more = table.size() > model.size();
    const size_t first = std::min(table.size(), model.size());
    return Status::FailedPrecondition(
        "checkpoint has " + std::to_string(table.size()) + " tensors, the model has " +
            std::to_string(model.size()) + " (first " + (more ? "extra" : "missing") + ": " +
            (more ? table[first].ToString() : Describe(model[first])) + ")",
        path);
  }
  uint64_t n = 0;
  if (!r.Get(&n) || !r.Get(&ck.num_states)) return truncated();
  if (n != arena.size()) {
    return Status::Corruption("checkpoint sizes disagree with its own tensor table", path);
  }
  if (r.remaining() != (1 + uint64_t{ck.num_states}) * n * sizeof(float)) {
    return Status::Corruption("checkpoint data has the wrong length", path);
  }
  ck.params = r.Take(n * sizeof(float));
  return ck;
}

}  // namespace

Status SaveCheckpoint(const std::string& path, const ParamArena& arena,
                      const Optimizer& optimizer) {
  CheckpointFileWriter w(path);
  w.Write(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(kCheckpointVersion);
  w.PutString(optimizer.name());
  w.Put<int64_t>(optimizer.step());
  w.Put<uint32_t>(static_cast<uint32_t>(arena.num_tensors()));
  for (const ParamSpec& spec : arena.table()) {
    w.PutString(spec.name);
    w.Put<uint32_t>(static_cast<uint32_t>(spec.shape.ndim()));
    for (int d = 0; d < spec.shape.ndim(); ++d) w.Put<int64_t>(spec.shape[d]);
  }
  const size_t n = arena.size();
  w.Put<uint64_t>(n);
  w.Put<uint32_t>(static_cast<uint32_t>(optimizer.state().size()));
  Backend* be = arena.backend();
  w.WriteFrom(be, arena.params().data(), n);
  for (const Tensor& s : optimizer.state()) w.WriteFrom(be, s.data(), n);
  return w.Commit();
}

Status LoadCheckpoint(const std::string& path, ParamArena* arena, Optimizer* optimizer) {
  CHECK(arena != nullptr && optimizer != nullptr);
  FLEET_ASSIGN_OR_RETURN(CheckedCheckpoint ck, ReadCheckedCheckpoint(path, *arena));
  if (ck.optimizer != optimizer->name()) {
    return Status::FailedPrecondition("checkpoint was written by optimizer \"" + ck.optimizer +
                                          "\", this job uses \"" + std::string(optimizer->name()) +
                                          "\"",
                                      path);
  }
  if (ck.num_states != optimizer->state().size()) {
    return Status::Corruption("checkpoint of optimizer \"" + ck.optimizer + "\" has " +
                                  std::to_string(ck.num_states) + " state buffers, expected " +
                                  std::to_string(optimizer->state().size()),
                              path);
  }
  // Everything checked: only now touch the model.
  const size_t bytes = arena->size() * sizeof(float);
  Backend* be = arena->backend();
  be->CopyFromHost(arena->params().data(), ck.params, bytes);
  const char* state = ck.params + bytes;
  for (const Tensor& s : optimizer->state()) {
    be->CopyFromHost(s.data(), state, bytes);
    state += bytes;
  }
  optimizer->RestoreStep(ck.step);
  return Status::OK();
}

Status LoadCheckpointParams(const std::string& path, ParamArena* arena) {
  CHECK(arena != nullptr);
  FLEET_ASSIGN_OR_RETURN(CheckedCheckpoint ck, ReadCheckedCheckpoint(path, *arena));
  arena->backend()->CopyFromHost(arena->params().data(), ck.params, arena->size() * sizeof(float));
  return Status::OK();
}

}  // namespace fleet::trainer
