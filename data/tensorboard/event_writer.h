// TensorBoard event files: scalar curves (loss, learning rate, throughput,
// evaluation) that `tensorboard --logdir DIR` shows while training runs.
//
// File format. DIR/events.out.tfevents.<seconds>.<host>.<pid> is a sequence
// of TFRecords:
//   u64 length, u32 masked CRC-32C of the length's 8 bytes,
//   length bytes of a serialized Event (event.proto), u32 masked CRC-32C of them
// (little-endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8). The
// first Event has file_version "brain.Event:2"; each scalar is an Event with
// a Summary of one simple_value. Each record is flushed when written, so
// TensorBoard sees a curve grow and a crash loses at most the record being
// written.
//
// Thread safety: an EventWriter is not thread-safe; one thread writes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/status.h"

namespace fleet::tensorboard {

// CRC-32C (Castagnoli) of `data`, continuing from `crc` (0 to start).
uint32_t Crc32c(std::string_view data, uint32_t crc = 0);
// TFRecord's masked form of a CRC.
uint32_t MaskCrc(uint32_t crc);

// Where training programs write scalars: the collective loop and the PS
// worker call Scalar on rank 0 only.
class ScalarSink {
 public:
  virtual ~ScalarSink() = default;
  // Records `value` of curve `tag` at `step`. IOError naming the file.
  virtual Status Scalar(std::string_view tag, int64_t step, double value) = 0;
};

// Hands each scalar to every sink it was given (not owned; null ones are
// skipped), e.g. TensorBoard's files and the process's progress reports
// (comm/progress_report.h). Returns the first sink's failure, after every
// sink was given the scalar.
class ScalarTee final : public ScalarSink {
 public:
  explicit ScalarTee(std::vector<ScalarSink*> sinks) : sinks_(std::move(sinks)) {}
  Status Scalar(std::string_view tag, int64_t step, double value) override;

 private:
  const std::vector<ScalarSink*> sinks_;
};

// Hands each scalar to a function; never fails.
class ScalarFunction final : public ScalarSink {
 public:
  explicit ScalarFunction(std::function<void(std::string_view tag, int64_t step, double value)> f)
      : f_(std::move(f)) {}
  Status Scalar(std::string_view tag, int64_t step, double value) override {
    f_(tag, step, value);
    return Status::OK();
  }

 private:
  const std::function<void(std::string_view, int64_t, double)> f_;
};

class EventWriter final : public ScalarSink {
 public:
  // Creates `dir` (and parents) and a new event file in it, with its
  // file_version event. IOError naming the directory or file.
  static Result<std::unique_ptr<EventWriter>> Create(const std::string& dir);
  ~EventWriter() override;
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  Status Scalar(std::string_view tag, int64_t step, double value) override;
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  // Frames and appends one serialized Event, then flushes.
  Status WriteRecord(const std::string& event);

  const std::string path_;
  std::FILE* const file_;  // owned
};

// Where a training program writes its event files: `flag_dir` when given
// (--tensorboard_dir), else <log_dir>/tb when `enabled` (Engine.tensorboard,
// or the program's default) and a log directory is set (fleetrun's
// --log_dir, FLEET_LOG_DIR), else "" (none).
std::string TensorBoardDir(const std::string& flag_dir, const std::string& log_dir, bool enabled);

}  // namespace fleet::tensorboard
