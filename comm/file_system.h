// The one filesystem seam (LevelDB's Env, cut down to files). Everything
// that persists state writes through a FileSystem: PS checkpoints and the
// push log (ps/), trainer checkpoints (trainer/checkpoint.h), sharded
// optimizer state (collective/), token caches and other outputs (data/).
// Tests wrap it (FaultInjectionFileSystem below) to fail the Nth write,
// sync, rename or close, or to run out of space, without touching a real
// disk's behaviour.
//
//   FileSystem / WritableFile   the interface; PosixFileSystem the real one,
//                               DefaultFileSystem() a shared instance of it.
//   AtomicFileWriter            the one atomic writer: writes a temporary
//                               file, fsyncs it, renames it over the target
//                               and fsyncs the directory, so a reader sees
//                               the old file or the new one, never half.
//   WriteFileAtomically         the same for bytes already in memory.
//   CheckWritableDir            start-up check of a save directory.
//
// Links: PosixFileSystem follows no symbolic link in place of a file it
// opens (O_NOFOLLOW) or a folder it uses (CreateDir, ListDir, SyncDir: the
// folder itself): a link planted there (at <log_dir>/recovery, at a
// checkpoint's file) is refused with an error saying so, never written
// through. A folder a user names must be a real folder too; the path to it
// may pass through links.
//
// Thread safety: FileSystem implementations are thread-safe (shard files are
// written from several pool threads at once). A WritableFile or an
// AtomicFileWriter is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"

namespace fleet {

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
  // Errors: NotFound when the directory is absent, IOError otherwise.
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

// A process-wide PosixFileSystem (never destroyed): the default of every
// function here that takes a FileSystem.
FileSystem* DefaultFileSystem();

// Creates `dir` (and missing parents) and checks that a file can be
// created, written, closed and removed in it, with a probe file named
// ".fleet_write_probe.<pid>". For save and checkpoint directories, checked
// at start-up so that a typo or a read-only mount is reported before
// training rather than when the first save fails. Errors: IOError naming
// the directory and what failed.
Status CheckWritableDir(FileSystem* fs, const std::string& dir);

// How an AtomicFileWriter names its temporary file and syncs the directory.
struct AtomicWriteOptions {
  enum class TempName {
    // ".<name>.<pid>.tmp", hidden: processes that write the same target at
    // once (every rank building one token cache) do not share a temporary
    // file; the last rename wins.
    kHiddenPerProcess,
    // "<path>.tmp": one writer per target; checkpoints use it, and their
    // clean-up of an interrupted save looks for these names.
    kPathDotTmp,
  };
  TempName temp_name = TempName::kHiddenPerProcess;
  // After the rename, fsync the directory so the rename survives a crash.
  // False only for a caller that writes several files into one directory
  // and syncs it once itself (ps/checkpoint's shard files).
  bool sync_dir = true;
};

// The one atomic writer. Bytes go to a temporary file beside `path`;
// Commit() syncs and closes it, renames it over `path` and (by default)
// syncs the directory. Until Commit() succeeds `path` is untouched, and a
// writer destroyed before that removes its temporary file.
class AtomicFileWriter {
 public:
  // Creates the temporary file. `fs` (not owned) must outlive the writer.
  // Errors: InvalidArgument when path names no file; IOError naming the
  // temporary file (missing directory included) when it cannot be created.
  static Result<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path,
                                                          FileSystem* fs = DefaultFileSystem(),
                                                          AtomicWriteOptions options = {});
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Errors: IOError naming the temporary file; FailedPrecondition after
  // Finish() or Commit().
  Status Append(std::string_view bytes);
  // Syncs and closes the temporary file without publishing it: a caller
  // that publishes several files in an order of its own (a checkpoint's
  // manifest last) finishes each, then commits. Commit() finishes first
  // when this was not called. Errors: IOError naming the temporary file.
  Status Finish();
  // Renames the temporary file over `path`, then syncs the directory when
  // the options ask. After a failed rename `path` is untouched and the
  // temporary file is removed (by the destructor); after a failed directory
  // sync the new file is in place but may not survive a crash.
  Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_path_; }

 private:
  AtomicFileWriter(FileSystem* fs, std::string path, std::string tmp_path,
                   std::unique_ptr<WritableFile> file, bool sync_dir);

  FileSystem* const fs_;
  const std::string path_;
  const std::string tmp_path_;
  const bool sync_dir_;
  std::unique_ptr<WritableFile> file_;  // open until Finish()
  bool finished_ = false;
  bool renamed_ = false;
};

// Writes `bytes` to `path` through an AtomicFileWriter.
Status WriteFileAtomically(const std::string& path, std::string_view bytes,
                           FileSystem* fs = DefaultFileSystem(), AtomicWriteOptions options = {});

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
  // A disk that holds `bytes` more bytes of appends (from now, all files
  // together): the append that crosses the limit writes what fits and fails
  // with IOError("injected: no space left on device"), as write(2) does
  // with ENOSPC, leaving a torn file. Negative: no limit (the default).
  void SetSpaceLeft(int64_t bytes) { space_left_.store(bytes); }
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
  // Takes up to n bytes of the space left; returns how many fit.
  size_t TakeSpace(size_t n);

 private:
  static constexpr int kOps = 7;
  static size_t Index(Op op) { return static_cast<size_t>(op); }
  struct Counter {
    std::atomic<int> calls{0};
    std::atomic<int> fail_at{0};  // absolute call number to fail; 0: none
    std::atomic<bool> dies{false};  // failing that call kills the "process"
  };
  std::atomic<bool> dead_{false};
  std::atomic<int64_t> space_left_{-1};  // < 0: unlimited

  FileSystem* const base_;  // not owned
  Counter counters_[kOps];
};

}  // namespace fleet
