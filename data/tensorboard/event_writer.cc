#include "data/tensorboard/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "comm/file_system.h"
#include "data/tensorboard/event.pb.h"

namespace fleet::tensorboard {

Status ScalarTee::Scalar(std::string_view tag, int64_t step, double value) {
  Status first;
  for (ScalarSink* sink : sinks_) {
    if (sink == nullptr) continue;
    if (Status st = sink->Scalar(tag, step, value); !st.ok() && first.ok()) first = st;
  }
  return first;
}

namespace {

// The reflected CRC-32C table (polynomial 0x82f63b78), built at compile time.
constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t Crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (unsigned char b : data) crc = kTable[(crc ^ b) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::string TensorBoardDir(const std::string& flag_dir, const std::string& log_dir, bool enabled) {
  if (!flag_dir.empty()) return flag_dir;
  if (!enabled || log_dir.empty()) return "";
  return (std::filesystem::path(log_dir) / "tb").string();
}

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

Result<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& dir) {
  // Made like every folder FleetPS writes in: a link planted in its place
  // is refused.
  FLEET_RETURN_IF_ERROR(DefaultFileSystem()->CreateDir(dir).WithContext("TensorBoard directory"));
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const std::string path = (std::filesystem::path(dir) / absl::StrCat("events.out.tfevents.",
                                                                      static_cast<int64_t>(Now()),
                                                                      ".", host, ".", ::getpid()))
                               .string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  std::FILE* file = fd >= 0 ? ::fdopen(fd, "wb") : nullptr;
  if (file == nullptr) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    return Status::IOError(absl::StrCat("cannot create: ", std::strerror(err)), path);
  }
  std::unique_ptr<EventWriter> writer(new EventWriter(path, file));
  Event event;
  event.set_wall_time(Now());
  event.set_file_version("brain.Event:2");
  FLEET_RETURN_IF_ERROR(writer->WriteRecord(event.SerializeAsString()));
  return writer;
}

EventWriter::~EventWriter() { std::fclose(file_); }

Status EventWriter::Scalar(std::string_view tag, int64_t step, double value) {
  Event event;
  event.set_wall_time(Now());
  event.set_step(step);
  Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  return WriteRecord(event.SerializeAsString());
}

Status EventWriter::WriteRecord(const std::string& event) {
  char header[12];
  const uint64_t length = event.size();
  std::memcpy(header, &length, 8);
  const uint32_t length_crc = MaskCrc(Crc32c(std::string_view(header, 8)));
  std::memcpy(header + 8, &length_crc, 4);
  const uint32_t data_crc = MaskCrc(Crc32c(event));
  if (std::fwrite(header, 1, 12, file_) != 12 ||
      std::fwrite(event.data(), 1, event.size(), file_) != event.size() ||
      std::fwrite(&data_crc, 1, 4, file_) != 4 || std::fflush(file_) != 0) {
    return Status::IOError(absl::StrCat("cannot write a TensorBoard event: ", std::strerror(errno)),
                           path_);
  }
  return Status::OK();
}

}  // namespace fleet::tensorboard
