// File input shared by the data readers and the generator.
//
//   InputFile          reads a file byte by byte whether it is gzip-compressed
//                      or plain (decided by the magic bytes 1f 8b).
//   LineReader         splits an InputFile into lines ("\n" or "\r\n"; the
//                      last line may lack its newline).
//   ExpandFileSpec     turns "a.txt,dir/,parts/*.gz" into a sorted file list.
//
// Output goes through the persistence layer in comm/file_system.h
// (AtomicFileWriter, WriteFileAtomically), included here for the readers'
// callers that also write.
//
// Every function that touches the file system returns a Status naming the
// file. None of these classes is thread-safe; use one object per thread.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/file_system.h"
#include "comm/status.h"

namespace fleet::data {

class InputFile {
 public:
  // Opens `path` for reading. Returns NotFound when the file does not exist,
  // IOError when it cannot be opened or is not a regular file.
  static Result<std::unique_ptr<InputFile>> Open(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Reads up to n bytes into buf and returns how many were read; 0 means end
  // of file. Returns Corruption when a gzip stream is damaged or ends early,
  // IOError when the OS refuses the read. After an error the file is
  // unusable.
  Result<size_t> Read(char* buf, size_t n);

  // Reads everything left. Same errors as Read().
  Result<std::string> ReadAll();

  const std::string& path() const { return path_; }
  bool compressed() const { return compressed_; }

 private:
  InputFile(std::string path, gzFile file, bool compressed);

  const std::string path_;
  gzFile file_;
  const bool compressed_;
};

class LineReader {
 public:
  explicit LineReader(std::unique_ptr<InputFile> file);

  // Sets *line to the next line without its "\n" or "\r\n" and returns true,
  // or returns false at end of file. The view stays valid until the next
  // call. Errors are those of InputFile::Read().
  Result<bool> Next(std::string_view* line);

  // 1-based number of the line last returned (0 before the first).
  int64_t line_number() const { return line_number_; }
  const std::string& path() const { return file_->path(); }

 private:
  // Moves the unread tail to the front and appends more bytes; returns false
  // at end of file.
  Result<bool> Refill();

  std::unique_ptr<InputFile> file_;
  std::vector<char> buf_;
  size_t begin_ = 0;  // first unread byte in buf_
  size_t end_ = 0;    // one past the last valid byte in buf_
  bool eof_ = false;
  int64_t line_number_ = 0;
};

// Expands a comma-separated list of entries into file paths. An entry is a
// regular file, a directory (its regular files, hidden ones skipped, not
// recursive) or a glob(3) pattern (a hidden match is kept only when the
// pattern itself asks for it). Each entry's files are sorted by name; entries
// keep their order. Returns NotFound when an entry matches nothing, so a
// typo never silently trains on zero files; an existing empty directory is
// fine and contributes no files. InvalidArgument for an empty spec.
Result<std::vector<std::string>> ExpandFileSpec(std::string_view spec);

}  // namespace fleet::data
