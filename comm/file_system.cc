#include "comm/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <glog/logging.h>

namespace fleet {
namespace {

Status PosixError(const std::string& what, const std::string& path, int err) {
  // O_NOFOLLOW's refusal of a link: say why in words.
  if (err == ELOOP) {
    return Status::IOError(what + " refused: it is a symbolic link, and FleetPS follows no link "
                                  "where it opens a file or uses a folder (name the real "
                                  "folder, or remove a link someone planted)",
                           path);
  }
  std::string msg = what + " failed: " + std::strerror(err);
  if (err == ENOENT) return Status::NotFound(msg, path);
  return Status::IOError(msg, path);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(std::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;  // interrupted before writing anything: retry
        return PosixError("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return Status::OK();
  }
  Status Sync() override {
    if (::fsync(fd_) != 0) return PosixError("fsync", path_, errno);
    return Status::OK();
  }
  Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return PosixError("close", path_, errno);
    return Status::OK();
  }

 private:
  const std::string path_;
  int fd_;
};

}  // namespace

Result<std::unique_ptr<WritableFile>> PosixFileSystem::NewWritableFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return PosixError("open for write", path, errno);
  return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(path, fd));
}

Status PosixFileSystem::Rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return PosixError("rename to " + to, from, errno);
  return Status::OK();
}

Status PosixFileSystem::Remove(const std::string& path) {
  if (::unlink(path.c_str()) != 0) return PosixError("unlink", path, errno);
  return Status::OK();
}

Result<std::string> PosixFileSystem::ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return PosixError("open for read", path, errno);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return PosixError("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<std::vector<std::string>> PosixFileSystem::ListDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return PosixError("open dir", dir, errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return PosixError("opendir", dir, err);
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  return names;
}

Status CheckWritableDir(FileSystem* fs, const std::string& dir) {
  auto fail = [&](const Status& s) {
    return Status::IOError("directory is not writable (" + s.message() + ")", dir);
  };
  if (Status s = fs->CreateDir(dir); !s.ok()) return fail(s);
  const std::string probe = dir + "/.fleet_write_probe." + std::to_string(::getpid());
  auto file = fs->NewWritableFile(probe);
  if (!file.ok()) return fail(file.status());
  Status s = file.value()->Append("probe");
  if (s.ok()) s = file.value()->Close();
  Status removed = fs->Remove(probe);
  if (!s.ok()) return fail(s);
  if (!removed.ok()) return fail(removed);
  return Status::OK();
}

Status PosixFileSystem::CreateDir(const std::string& dir) {
  // Create each missing component in turn.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return PosixError("mkdir", part, errno);
  }
  // The folder itself must be one (its parents are the caller's to name): a
  // link planted where FleetPS makes a folder is refused, not followed.
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return PosixError("stat", dir, errno);
  if (S_ISLNK(st.st_mode)) return PosixError("use as a folder", dir, ELOOP);
  if (!S_ISDIR(st.st_mode)) return Status::IOError("exists and is not a directory", dir);
  return Status::OK();
}

Status PosixFileSystem::SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return PosixError("open dir", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: this file system cannot sync a directory; there is nothing more to do.
  if (rc != 0 && err != EINVAL) return PosixError("fsync dir", dir, err);
  return Status::OK();
}

FileSystem* DefaultFileSystem() {
  static PosixFileSystem* const fs = new PosixFileSystem();  // never destroyed: used at exit
  return fs;
}

// ---- AtomicFileWriter ----

AtomicFileWriter::AtomicFileWriter(FileSystem* fs, std::string path, std::string tmp_path,
                                   std::unique_ptr<WritableFile> file, bool sync_dir)
    : fs_(fs),
      path_(std::move(path)),
      tmp_path_(std::move(tmp_path)),
      sync_dir_(sync_dir),
      file_(std::move(file)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (renamed_) return;
  file_.reset();  // closes an unfinished file, ignoring errors
  const Status rm = fs_->Remove(tmp_path_);
  if (!rm.ok() && !rm.IsNotFound()) LOG(WARNING) << "could not remove " << rm.ToString();
}

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path,
                                                                   FileSystem* fs,
                                                                   AtomicWriteOptions options) {
  CHECK(fs != nullptr);
  const std::filesystem::path p(path);
  if (p.filename().empty()) return Status::InvalidArgument("output path names no file", path);
  std::string tmp;
  if (options.temp_name == AtomicWriteOptions::TempName::kPathDotTmp) {
    tmp = path + ".tmp";
  } else {
    tmp = (p.parent_path() / ("." + p.filename().string() + "." + std::to_string(::getpid()) + ".tmp"))
              .string();
  }
  Result<std::unique_ptr<WritableFile>> file = fs->NewWritableFile(tmp);
  if (!file.ok()) {
    // A missing directory is the writer's I/O failure, not a missing input.
    if (file.status().IsNotFound()) return Status::IOError(file.status().message());
    return file.status();
  }
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(fs, path, std::move(tmp), std::move(file).value(), options.sync_dir));
}

Status AtomicFileWriter::Append(std::string_view bytes) {
  if (finished_) return Status::FailedPrecondition("writer already finished", path_);
  return file_->Append(bytes);
}

Status AtomicFileWriter::Finish() {
  if (finished_) return Status::OK();
  finished_ = true;
  Status st = file_->Sync();
  const Status closed = file_->Close();  // release the descriptor either way
  file_.reset();
  return st.ok() ? closed : st;
}

Status AtomicFileWriter::Commit() {
  if (renamed_) return Status::FailedPrecondition("writer already committed", path_);
  FLEET_RETURN_IF_ERROR(Finish());
  FLEET_RETURN_IF_ERROR(fs_->Rename(tmp_path_, path_));
  renamed_ = true;
  if (!sync_dir_) return Status::OK();
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  return fs_->SyncDir(dir);
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes, FileSystem* fs,
                           AtomicWriteOptions options) {
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer,
                         AtomicFileWriter::Create(path, fs, options));
  FLEET_RETURN_IF_ERROR(writer->Append(bytes));
  return writer->Commit();
}

// ---- FaultInjectionFileSystem ----

namespace {

class FaultInjectionFile final : public WritableFile {
 public:
  FaultInjectionFile(FaultInjectionFileSystem* fs, std::unique_ptr<WritableFile> base, std::string path)
      : fs_(fs), base_(std::move(base)), path_(std::move(path)) {}
  Status Append(std::string_view data) override {
    FLEET_RETURN_IF_ERROR(fs_->Hit(FaultInjectionFileSystem::Op::kAppend, path_));
    const size_t fits = fs_->TakeSpace(data.size());
    if (fits < data.size()) {
      // A full disk takes what fits, as write(2) does before ENOSPC.
      FLEET_RETURN_IF_ERROR(base_->Append(data.substr(0, fits)));
      return Status::IOError("injected: no space left on device", path_);
    }
    return base_->Append(data);
  }
  Status Sync() override {
    FLEET_RETURN_IF_ERROR(fs_->Hit(FaultInjectionFileSystem::Op::kSync, path_));
    return base_->Sync();
  }
  Status Close() override {
    Status injected = fs_->Hit(FaultInjectionFileSystem::Op::kClose, path_);
    Status st = base_->Close();  // release the descriptor either way
    return injected.ok() ? st : injected;
  }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::unique_ptr<WritableFile> base_;
  const std::string path_;
};

constexpr const char* kOpNames[] = {"append", "sync", "close", "rename", "remove", "create", "syncdir"};

}  // namespace

void FaultInjectionFileSystem::FailNth(Op op, int nth) {
  Counter& c = counters_[Index(op)];
  c.fail_at.store(nth > 0 ? c.calls.load() + nth : 0);
  c.dies.store(false);
}

void FaultInjectionFileSystem::DieAtNth(Op op, int nth) {
  FailNth(op, nth);
  counters_[Index(op)].dies.store(true);
}

size_t FaultInjectionFileSystem::TakeSpace(size_t n) {
  int64_t left = space_left_.load();
  for (;;) {
    if (left < 0) return n;
    const int64_t take = std::min<int64_t>(left, static_cast<int64_t>(n));
    if (space_left_.compare_exchange_weak(left, left - take)) return static_cast<size_t>(take);
  }
}

Status FaultInjectionFileSystem::Hit(Op op, std::string_view which) {
  if (dead_.load()) return Status::IOError("injected: the process was killed", which);
  Counter& c = counters_[Index(op)];
  const int n = c.calls.fetch_add(1) + 1;
  if (n == c.fail_at.load()) {
    if (c.dies.load()) dead_.store(true);
    return Status::IOError(std::string("injected ") + kOpNames[Index(op)] + " failure", which);
  }
  return Status::OK();
}

Result<std::unique_ptr<WritableFile>> FaultInjectionFileSystem::NewWritableFile(const std::string& path) {
  FLEET_RETURN_IF_ERROR(Hit(Op::kCreate, path));
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, base_->NewWritableFile(path));
  return std::unique_ptr<WritableFile>(std::make_unique<FaultInjectionFile>(this, std::move(f), path));
}

Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to) {
  FLEET_RETURN_IF_ERROR(Hit(Op::kRename, from));
  return base_->Rename(from, to);
}

Status FaultInjectionFileSystem::Remove(const std::string& path) {
  FLEET_RETURN_IF_ERROR(Hit(Op::kRemove, path));
  return base_->Remove(path);
}

Status FaultInjectionFileSystem::CreateDir(const std::string& dir) { return base_->CreateDir(dir); }

Status FaultInjectionFileSystem::SyncDir(const std::string& dir) {
  FLEET_RETURN_IF_ERROR(Hit(Op::kSyncDir, dir));
  return base_->SyncDir(dir);
}

}  // namespace fleet
