// FileSystem: the seam between checkpoints and the OS. Checkpointer does all
// file work through it, so tests can wrap it to fail the Nth write, sync,
// rename or close (FaultInjectionFileSystem) without touching real disks'
// behaviour.
//
// Thread safety: implementations must be thread-safe (shard files are
// written from several pool threads at once). A WritableFile is used by one
// thread at a time.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"

namespace fleet::ps {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Errors: IOError naming the file.
  virtual Status Append(std::string_view data) = 0;
  // Flushes to stable storage (fsync). Errors: IOError naming the file.
  virtual Status Sync() = 0;
  // Errors: IOError naming the file. The destructor closes an unclosed file
  // and ignores errors.
  virtual Status Close() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or truncates path. The caller owns the returned file.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Errors: NotFound when absent, IOError otherwise.
  virtual Status Remove(const std::string& path) = 0;
  // The whole file. Errors: NotFound when absent, IOError otherwise.
  virtual Result<std::string> ReadFile(const std::string& path) = 0;
  // Names (not paths) of the entries of dir, excluding "." and "..".
  // Errors: NotFound when dir is absent, IOError otherwise.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Creates dir and missing parents; OK when it exists.
  virtual Status CreateDir(const std::string& dir) = 0;
  // fsyncs the directory so completed renames in it survive a crash.
  virtual Status SyncDir(const std::string& dir) = 0;
};

// The real file system (POSIX calls). Stateless.
class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Result<std::string> ReadFile(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Status CreateDir(const std::string& dir) override;
  Status SyncDir(const std::string& dir) override;
};

// Creates `dir` (and missing parents) and checks that a file can be
// created, written, closed and removed in it, with a probe file named
// ".fleet_write_probe.<pid>". For save and checkpoint directories, checked
// at start-up so that a typo or a read-only mount is reported before
// training rather than when the first save fails. Errors: IOError naming
// the directory and what failed.
Status CheckWritableDir(FileSystem* fs, const std::string& dir);

// Wraps another FileSystem and makes the Nth call of one kind fail with
// IOError("injected ...") (N counts from 1 over the life of the object, all
// threads together; 0 disables). After the failure, calls succeed again.
// For tests; thread-safe.
class FaultInjectionFileSystem final : public FileSystem {
 public:
  enum class Op { kAppend, kSync, kClose, kRename, kRemove, kCreate, kSyncDir };

  explicit FaultInjectionFileSystem(FileSystem* base) : base_(base) {}

  // Fails the nth call (from now) of op; replaces any earlier setting.
  void FailNth(Op op, int nth);
  // As FailNth, and from that call on every call of any kind fails too: the
  // process was killed there (kill -9 in the middle of a save), so whatever
  // it would have cleaned up stays behind.
  void DieAtNth(Op op, int nth);
  // Calls of op seen so far.
  int calls(Op op) const { return counters_[Index(op)].calls.load(); }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Result<std::string> ReadFile(const std::string& path) override { return base_->ReadFile(path); }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override { return base_->ListDir(dir); }
  Status CreateDir(const std::string& dir) override;
  Status SyncDir(const std::string& dir) override;

  // Counts a call of op; returns the injected error when it is the chosen one.
  Status Hit(Op op, std::string_view which);

 private:
  static constexpr int kOps = 7;
  static size_t Index(Op op) { return static_cast<size_t>(op); }
  struct Counter {
    std::atomic<int> calls{0};
    std::atomic<int> fail_at{0};  // absolute call number to fail; 0: none
    std::atomic<bool> dies{false};  // failing that call kills the "process"
  };
  std::atomic<bool> dead_{false};

  FileSystem* const base_;  // not owned
  Counter counters_[kOps];
};

}  // namespace fleet::ps
