#include "comm/file_io.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace fleet::data {
namespace {

constexpr size_t kInitialLineBuffer = size_t{1} << 20;
// A longer "line" means the file is not line-oriented text at all; refusing
// it bounds memory instead of buffering the whole file.
constexpr size_t kMaxLineBytes = size_t{64} << 20;

std::string ErrnoText() { return std::strerror(errno); }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IsHiddenName(const std::filesystem::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

}  // namespace

// ---------------------------------------------------------------- InputFile

InputFile::InputFile(std::string path, gzFile file, bool compressed)
    : path_(std::move(path)), file_(file), compressed_(compressed) {}

InputFile::~InputFile() { gzclose(file_); }

Result<std::unique_ptr<InputFile>> InputFile::Open(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound("no such file", path);
    return Status::IOError("cannot stat (" + ErrnoText() + ")", path);
  }
  if (!S_ISREG(st.st_mode)) return Status::IOError("not a regular file", path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError("cannot open (" + ErrnoText() + ")", path);
  unsigned char magic[2] = {0, 0};
  const ssize_t got = ::pread(fd, magic, sizeof(magic), 0);
  if (got < 0) {
    const std::string err = ErrnoText();
    ::close(fd);
    return Status::IOError("cannot read (" + err + ")", path);
  }
  const bool compressed = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  // zlib reads plain files unchanged ("transparent" mode), so one code path
  // serves both; gzdopen takes ownership of fd.
  gzFile file = gzdopen(fd, "rb");
  if (file == nullptr) {
    ::close(fd);
    return Status::IOError("cannot start zlib reader", path);
  }
  gzbuffer(file, 1 << 17);
  return std::unique_ptr<InputFile>(new InputFile(path, file, compressed));
}

Result<size_t> InputFile::Read(char* buf, size_t n) {
  const unsigned want = static_cast<unsigned>(std::min<size_t>(n, INT_MAX));
  const int got = gzread(file_, buf, want);
  int errnum = Z_OK;
  const char* msg = gzerror(file_, &errnum);
  // zlib reports a gzip stream cut short as Z_BUF_ERROR while still
  // returning the bytes before the cut, so the error is checked on every
  // call, not only when gzread returns -1.
  if (got < 0 || errnum != Z_OK) {
    if (errnum == Z_ERRNO) return Status::IOError("read failed (" + ErrnoText() + ")", path_);
    return Status::Corruption(std::string("damaged gzip stream (") + msg + ")", path_);
  }
  return static_cast<size_t>(got);
}

Result<std::string> InputFile::ReadAll() {
  std::string out;
  size_t size = 0;
  for (;;) {
    if (out.size() - size < (size_t{1} << 16))
      out.resize(std::max<size_t>(out.size() * 2, 1 << 20));
    FLEET_ASSIGN_OR_RETURN(const size_t got, Read(out.data() + size, out.size() - size));
    if (got == 0) break;
    size += got;
  }
  out.resize(size);
  return out;
}

// --------------------------------------------------------------- LineReader

LineReader::LineReader(std::unique_ptr<InputFile> file)
    : file_(std::move(file)), buf_(kInitialLineBuffer) {}

Result<bool> LineReader::Refill() {
  if (begin_ > 0) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buf_.size()) {
    if (buf_.size() >= kMaxLineBytes) {
      return Status::Corruption("line " + std::to_string(line_number_ + 1) + " is longer than " +
                                    std::to_string(kMaxLineBytes) + " bytes",
                                file_->path());
    }
    buf_.resize(buf_.size() * 2);
  }
  FLEET_ASSIGN_OR_RETURN(const size_t got, file_->Read(buf_.data() + end_, buf_.size() - end_));
  end_ += got;
  return got > 0;
}

Result<bool> LineReader::Next(std::string_view* line) {
  size_t scanned = begin_;  // bytes before this offset hold no newline
  for (;;) {
    const char* start = buf_.data() + scanned;
    const void* nl = std::memchr(start, '\n', end_ - scanned);
    if (nl != nullptr) {
      const size_t pos = static_cast<const char*>(nl) - buf_.data();
      *line = std::string_view(buf_.data() + begin_, pos - begin_);
      begin_ = pos + 1;
      break;
    }
    if (!eof_) {
      const size_t scanned_len = end_ - begin_;
      FLEET_ASSIGN_OR_RETURN(const bool more, Refill());
      eof_ = !more;
      scanned = begin_ + scanned_len;
      continue;
    }
    if (begin_ == end_) return false;
    *line = std::string_view(buf_.data() + begin_, end_ - begin_);  // last line, no newline
    begin_ = end_;
    break;
  }
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  ++line_number_;
  return true;
}

// ----------------------------------------------------------- ExpandFileSpec

Result<std::vector<std::string>> ExpandFileSpec(std::string_view spec) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  bool any_entry = false;
  while (true) {
    const size_t comma = spec.find(',');
    const std::string entry(Trim(spec.substr(0, comma)));
    if (!entry.empty()) {
      any_entry = true;
      std::vector<std::string> files;
      std::error_code ec;
      const fs::file_status st = fs::status(entry, ec);
      if (!ec && fs::is_directory(st)) {
        for (const auto& de : fs::directory_iterator(entry, ec)) {
          if (!IsHiddenName(de.path()) && de.is_regular_file()) files.push_back(de.path().string());
        }
        if (ec) return Status::IOError("cannot list directory (" + ec.message() + ")", entry);
      } else if (!ec && fs::is_regular_file(st)) {
        files.push_back(entry);
      } else if (entry.find_first_of("*?[") != std::string::npos) {
        glob_t g;
        const int rc = ::glob(entry.c_str(), 0, nullptr, &g);
        if (rc == 0) {
          for (size_t i = 0; i < g.gl_pathc; ++i) {
            if (fs::is_regular_file(g.gl_pathv[i], ec)) files.emplace_back(g.gl_pathv[i]);
          }
        }
        globfree(&g);
        if (rc != 0 && rc != GLOB_NOMATCH) return Status::IOError("glob failed", entry);
        if (files.empty()) return Status::NotFound("pattern matches no file", entry);
      } else {
        return Status::NotFound("no such file or directory", entry);
      }
      std::sort(files.begin(), files.end());
      out.insert(out.end(), files.begin(), files.end());
    }
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  if (!any_entry) return Status::InvalidArgument("empty file list");
  return out;
}

}  // namespace fleet::data
