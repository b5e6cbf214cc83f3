#include "trainer/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/byte_io.h"
#include "comm/checksum.h"

namespace fleet::trainer {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'T', 'C', 'K', 'P', 'T', '\0'};
constexpr std::string_view kMagicBytes(kMagic, sizeof(kMagic));
// "<path>.tmp", renamed over the target; the directory synced after.
constexpr AtomicWriteOptions kCheckpointWrite{.temp_name = AtomicWriteOptions::TempName::kPathDotTmp,
                                              .sync_dir = true};

// Streams a checkpoint into an AtomicFileWriter as it is produced, with a
// running CRC-32 of every byte, so that saving never holds a second whole
// copy of the parameters in host memory (a 10B model's would be 40 GB).
// Errors stick: after the first one every call does nothing and Commit
// returns it; the temporary file is removed unless Commit succeeded, and
// `path` is untouched.
class CheckpointFileWriter {
 public:
  CheckpointFileWriter(const std::string& path, FileSystem* fs) {
    Result<std::unique_ptr<AtomicFileWriter>> file = AtomicFileWriter::Create(path, fs, kCheckpointWrite);
    if (file.ok()) {
      file_ = std::move(file).value();
    } else {
      status_ = file.status();
    }
  }

  void Write(std::string_view bytes) {
    if (!status_.ok()) return;
    crc_ = Crc32Extend(crc_, bytes.data(), bytes.size());
    status_ = file_->Append(bytes);
  }
  // `floats` floats of `backend` memory: written in place from host memory,
  // through a bounded staging buffer from a device's.
  void WriteFrom(Backend* backend, const float* src, size_t floats) {
    if (backend->device().is_cpu()) return Write(AsBytes(src, floats));
    std::vector<float> staging(std::min(floats, kStagingFloats));
    for (size_t at = 0; at < floats && status_.ok(); at += staging.size()) {
      const size_t n = std::min(staging.size(), floats - at);
      backend->CopyToHost(staging.data(), src + at, n * sizeof(float));
      Write(AsBytes(staging.data(), n));
    }
  }
  // Appends the CRC-32 of everything written before it, then commits the
  // file (sync, rename over the target, directory sync).
  Status Commit() {
    std::string tail;
    ByteWriter(&tail).Put<uint32_t>(crc_);
    Write(tail);
    if (!status_.ok()) return status_;
    return file_->Commit();
  }

 private:
  static constexpr size_t kStagingFloats = size_t{16} << 20;  // 64 MiB

  static std::string_view AsBytes(const float* p, size_t floats) {
    return std::string_view(reinterpret_cast<const char*>(p), floats * sizeof(float));
  }

  std::unique_ptr<AtomicFileWriter> file_;
  uint32_t crc_ = 0;
  Status status_;
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
  std::string bytes;
  std::string optimizer;
  int64_t step = 0;
  uint32_t num_states = 0;
  size_t params_offset = 0;  // in bytes: f32 [arena size], then the states

  const char* params() const { return bytes.data() + params_offset; }
};

Result<CheckedCheckpoint> ReadCheckedCheckpoint(const std::string& path, const ParamArena& arena,
                                                FileSystem* fs) {
  CheckedCheckpoint ck;
  Result<std::string> read = fs->ReadFile(path);
  if (!read.ok()) {
    if (read.status().IsNotFound()) return Status::NotFound("checkpoint file does not exist", path);
    return read.status();
  }
  ck.bytes = std::move(read).value();
  const std::string_view bytes = ck.bytes;
  if (bytes.size() < sizeof(kMagic) + sizeof(uint32_t) * 2 || !bytes.starts_with(kMagicBytes)) {
    return Status::Corruption("not a FleetPS checkpoint (bad magic or too short)", path);
  }
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - sizeof(uint32_t), sizeof(uint32_t));
  const std::string_view body = bytes.substr(0, bytes.size() - sizeof(uint32_t));
  if (Crc32(body) != stored_crc) {
    return Status::Corruption("checkpoint checksum mismatch (truncated or damaged)", path);
  }
  ByteReader r(body.substr(sizeof(kMagic)));
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
  ck.params_offset = sizeof(kMagic) + r.position();
  return ck;
}

}  // namespace

Status SaveCheckpoint(const std::string& path, const ParamArena& arena, const Optimizer& optimizer,
                      FileSystem* fs) {
  CheckpointFileWriter w(path, fs);
  std::string header(kMagicBytes);
  ByteWriter h(&header);
  h.Put<uint32_t>(kCheckpointVersion);
  h.PutString(optimizer.name());
  h.Put<int64_t>(optimizer.step());
  h.Put<uint32_t>(static_cast<uint32_t>(arena.num_tensors()));
  for (const ParamSpec& spec : arena.table()) {
    h.PutString(spec.name);
    h.Put<uint32_t>(static_cast<uint32_t>(spec.shape.ndim()));
    for (int d = 0; d < spec.shape.ndim(); ++d) h.Put<int64_t>(spec.shape[d]);
  }
  const size_t n = arena.size();
  h.Put<uint64_t>(n);
  h.Put<uint32_t>(static_cast<uint32_t>(optimizer.state().size()));
  w.Write(header);
  Backend* be = arena.backend();
  w.WriteFrom(be, arena.params().data(), n);
  for (const Tensor& s : optimizer.state()) w.WriteFrom(be, s.data(), n);
  return w.Commit();
}

Status LoadCheckpoint(const std::string& path, ParamArena* arena, Optimizer* optimizer,
                      FileSystem* fs) {
  CHECK(arena != nullptr && optimizer != nullptr);
  FLEET_ASSIGN_OR_RETURN(CheckedCheckpoint ck, ReadCheckedCheckpoint(path, *arena, fs));
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
  be->CopyFromHost(arena->params().data(), ck.params(), bytes);
  const char* state = ck.params() + bytes;
  for (const Tensor& s : optimizer->state()) {
    be->CopyFromHost(s.data(), state, bytes);
    state += bytes;
  }
  optimizer->RestoreStep(ck.step);
  return Status::OK();
}

Status LoadCheckpointParams(const std::string& path, ParamArena* arena, FileSystem* fs) {
  CHECK(arena != nullptr);
  FLEET_ASSIGN_OR_RETURN(CheckedCheckpoint ck, ReadCheckedCheckpoint(path, *arena, fs));
  arena->backend()->CopyFromHost(arena->params().data(), ck.params(), arena->size() * sizeof(float));
  return Status::OK();
}

}  // namespace fleet::trainer
