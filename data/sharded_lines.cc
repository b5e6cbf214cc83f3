#include "data/sharded_lines.h"

namespace fleet::data {

ShardedLineReader::ShardedLineReader(std::vector<std::string> files, int rank, int world_size)
    : files_(std::move(files)), rank_(rank), world_size_(world_size) {}

Result<std::unique_ptr<ShardedLineReader>> ShardedLineReader::Create(std::vector<std::string> files,
                                                                     int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("need 0 <= rank < world_size, got rank " + std::to_string(rank) +
                                   " of " + std::to_string(world_size));
  }
  return std::unique_ptr<ShardedLineReader>(
      new ShardedLineReader(std::move(files), rank, world_size));
}

void ShardedLineReader::Rewind() {
  file_index_ = 0;
  reader_.reset();
  next_global_index_ = 0;
}

Result<bool> ShardedLineReader::Next(LineRef* out) {
  while (file_index_ < files_.size()) {
    if (reader_ == nullptr) {
      FLEET_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> file, InputFile::Open(files_[file_index_]));
      reader_ = std::make_unique<LineReader>(std::move(file));
    }
    std::string_view text;
    FLEET_ASSIGN_OR_RETURN(const bool got, reader_->Next(&text));
    if (!got) {
      reader_.reset();
      ++file_index_;
      continue;
    }
    const int64_t index = next_global_index_++;
    if (index % world_size_ != rank_) continue;
    out->text = text;
    out->file = &files_[file_index_];
    out->line_number = reader_->line_number();
    out->global_index = index;
    return true;
  }
  return false;
}

}  // namespace fleet::data
