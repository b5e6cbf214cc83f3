// Helpers shared by the fuzz targets (tests/fuzz/*_fuzz.cc): a reader that
// splits the fuzzer's bytes into fields, an in-memory FileSystem for the
// checkpoint seam, and a private temp file for decoders that take a path.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <set>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/file_system.h"

namespace fleet::fuzz {

// Consumes the fuzzer's input front to back; reads past the end give zeros
// and empty strings, so every input decodes to something.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  // A field of up to `max` bytes whose length is a u16 in front of it.
  std::string Field(size_t max = 65535) {
    size_t n = U16();
    n = std::min({n, max, size_ - pos_});
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::string Rest() {
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return s;
  }
  bool done() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Writers for the same layout, used to build seeds.
inline void PutU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}
inline void PutField(std::string* out, std::string_view s) {
  PutU16(out, static_cast<uint16_t>(s.size()));
  out->append(s.substr(0, 65535));
}

// Files as a map from path to bytes. Thread-safe. Directories exist when a
// file below them does or CreateDir made them.
class MemFileSystem final : public FileSystem {
 public:
  class File final : public WritableFile {
   public:
    File(MemFileSystem* fs, std::string path) : fs_(fs), path_(std::move(path)) {}
    Status Append(std::string_view data) override {
      std::lock_guard<std::mutex> l(fs_->mu_);
      fs_->files_[path_].append(data);
      return Status::OK();
    }
    Status Sync() override { return Status::OK(); }
    Status Close() override { return Status::OK(); }

   private:
    MemFileSystem* fs_;
    std::string path_;
  };

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    std::lock_guard<std::mutex> l(mu_);
    files_[path].clear();
    return std::unique_ptr<WritableFile>(new File(this, path));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = files_.find(from);
    if (it == files_.end()) return Status::NotFound("no file " + from);
    files_[to] = std::move(it->second);
    files_.erase(from);
    return Status::OK();
  }
  Status Remove(const std::string& path) override {
    std::lock_guard<std::mutex> l(mu_);
    return files_.erase(path) ? Status::OK() : Status::NotFound("no file " + path);
  }
  Result<std::string> ReadFile(const std::string& path) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = files_.find(path);
    if (it == files_.end()) return Status::NotFound("no file " + path);
    return it->second;
  }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    std::lock_guard<std::mutex> l(mu_);
    const std::string prefix = dir + "/";
    std::vector<std::string> names;
    bool exists = dirs_.count(dir) > 0;
    auto add = [&](const std::string& path) {
      if (path.compare(0, prefix.size(), prefix) != 0 || path.size() == prefix.size()) return;
      exists = true;
      std::string name = path.substr(prefix.size());
      name = name.substr(0, name.find('/'));
      if (names.empty() || names.back() != name) names.push_back(name);
    };
    for (const auto& [path, bytes] : files_) add(path);
    for (const std::string& d : dirs_) add(d);
    if (!exists) return Status::NotFound("no directory " + dir);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }
  Status CreateDir(const std::string& dir) override {
    std::lock_guard<std::mutex> l(mu_);
    dirs_.insert(dir);
    return Status::OK();
  }
  Status SyncDir(const std::string& dir) override { return Status::OK(); }

  void Clear() {
    std::lock_guard<std::mutex> l(mu_);
    files_.clear();
    dirs_.clear();
  }
  std::map<std::string, std::string> files() {
    std::lock_guard<std::mutex> l(mu_);
    return files_;
  }
  void Put(const std::string& path, std::string bytes) {
    std::lock_guard<std::mutex> l(mu_);
    files_[path] = std::move(bytes);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> files_;
  std::set<std::string> dirs_;
};

// A file only this process uses, rewritten for every input, for decoders
// whose entry point takes a path. Removed at exit.
class TempFile {
 public:
  explicit TempFile(const std::string& stem)
      : path_(std::filesystem::temp_directory_path() /
              (stem + "." + std::to_string(getpid()))) {}
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& Write(std::string_view bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Seeds: a target may define FleetFuzzSeeds to hand replay_main --write_seeds
// the valid inputs it starts from (replay_main adds truncated and
// bit-flipped variants).
extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds);

}  // namespace fleet::fuzz
