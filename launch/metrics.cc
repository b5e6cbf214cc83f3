#include "launch/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>

#include <glog/logging.h>

#include "absl/strings/str_format.h"

namespace fleet::launch {
namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

prometheus::Family<prometheus::Gauge>* Family(prometheus::Registry& registry, const char* name,
                                              const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

}  // namespace

JobMetrics::JobMetrics(const std::string& jsonl_path)
    : registry_(std::make_shared<prometheus::Registry>()),
      step_(Family(*registry_, "fleet_process_step", "Steps the process has done")),
      total_(Family(*registry_, "fleet_process_total_steps", "Steps of the whole job")),
      throughput_(Family(*registry_, "fleet_process_samples_per_second",
                         "Samples per second at the process's last report")),
      heartbeat_(Family(*registry_, "fleet_process_last_heartbeat_seconds",
                        "Unix time of the process's last progress report")),
      up_(Family(*registry_, "fleet_process_up", "1 while the process runs, 0 once it exited")),
      exit_code_(Family(*registry_, "fleet_process_exit_code",
                        "Exit code of the process (128+N: killed by signal N)")) {
  if (!jsonl_path.empty()) {
    // Never through a link planted in the log folder.
    const int fd = ::open(jsonl_path.c_str(),
                          O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) jsonl_ = ::fdopen(fd, "a");
    if (jsonl_ == nullptr) {
      PLOG(WARNING) << "fleetrun: not writing " << jsonl_path;
      if (fd >= 0) ::close(fd);
    }
  }
}

JobMetrics::~JobMetrics() {
  if (jsonl_ != nullptr) std::fclose(jsonl_);
}

prometheus::Gauge& JobMetrics::Gauge(prometheus::Family<prometheus::Gauge>* family,
                                     const std::string& role, int rank) {
  return family->Add({{"role", role}, {"rank", std::to_string(rank)}});
}

void JobMetrics::WriteLine(const std::string& line) {
  if (jsonl_ == nullptr) return;
  std::fputs(line.c_str(), jsonl_);
  std::fputc('\n', jsonl_);
  std::fflush(jsonl_);
}

void JobMetrics::Progress(const std::string& role, int rank, const ProgressValue& v) {
  std::lock_guard<std::mutex> lock(mu_);
  ProgressValue& last = last_[{role, rank}];
  if (last.unix_ms == v.unix_ms) return;
  last = v;
  Gauge(step_, role, rank).Set(static_cast<double>(v.step));
  Gauge(total_, role, rank).Set(static_cast<double>(v.total_steps));
  Gauge(throughput_, role, rank).Set(v.samples_per_s);
  Gauge(heartbeat_, role, rank).Set(static_cast<double>(v.unix_ms) / 1000.0);
  WriteLine(absl::StrFormat(
      R"({"unix_ms": %d, "role": "%s", "rank": %d, "step": %d, "total_steps": %d, "samples_per_s": %.3f})",
      v.unix_ms, role, rank, v.step, v.total_steps, v.samples_per_s));
}

void JobMetrics::Started(const std::string& role, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  Gauge(up_, role, rank).Set(1);
  WriteLine(absl::StrFormat(R"({"unix_ms": %d, "role": "%s", "rank": %d, "event": "started"})",
                            NowUnixMs(), role, rank));
}

void JobMetrics::Exited(const std::string& role, int rank, int exit_code) {
  std::lock_guard<std::mutex> lock(mu_);
  Gauge(up_, role, rank).Set(0);
  Gauge(exit_code_, role, rank).Set(exit_code);
  WriteLine(absl::StrFormat(
      R"({"unix_ms": %d, "role": "%s", "rank": %d, "event": "exited", "exit_code": %d})",
      NowUnixMs(), role, rank, exit_code));
}

double JobMetrics::Throughput(const std::string& role) const {
  std::lock_guard<std::mutex> lock(mu_);
  double sum = 0;
  for (const auto& [key, value] : last_) {
    if (key.first == role) sum += value.samples_per_s;
  }
  return sum;
}

std::string JobMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace fleet::launch
