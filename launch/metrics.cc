#include "launch/metrics.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <chrono>
#include <string_view>

#include "absl/strings/str_format.h"
#include "ps/ps.pb.h"

namespace fleet::launch {
namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

prometheus::Family<prometheus::Gauge>* GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name,
                                                   const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Counter>* CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

}  // namespace

std::string PrometheusFigureName(const std::string& figure) {
  // Prometheus spells units out: "tokens_per_sec" -> "..._per_second".
  constexpr std::string_view kAbbreviated = "_per_sec";
  std::string name = "fleet_training_" + figure;
  if (name.ends_with(kAbbreviated)) name += "ond";
  return name;
}

JobMetrics::JobMetrics(std::string job_id, const std::string& jsonl_path)
    : job_id_(std::move(job_id)),
      registry_(std::make_shared<prometheus::Registry>()),
      steps_(CounterFamily(*registry_, "fleet_process_steps_total", "Steps the process has done")),
      total_(GaugeFamily(*registry_, "fleet_process_total_steps", "Steps of the whole job")),
      throughput_(GaugeFamily(*registry_, "fleet_process_samples_per_second",
                              "Samples per second at the process's last report")),
      heartbeat_(GaugeFamily(*registry_, "fleet_process_last_report_timestamp_seconds",
                             "Unix time of the process's last progress report")),
      up_(GaugeFamily(*registry_, "fleet_process_up",
                      "1 while the process runs, 0 once it exited")),
      exit_code_(GaugeFamily(*registry_, "fleet_process_exit_code",
                             "Exit code of the process (128+N: killed by signal N)")),
      restarts_(CounterFamily(*registry_, "fleet_process_restarts_total",
                              "Times fleetrun restarted the process (--max_restart)")),
      server_requests_(CounterFamily(*registry_, "fleet_server_requests_total",
                                     "Requests a parameter server handled, by kind")),
      server_bytes_in_(CounterFamily(*registry_, "fleet_server_received_bytes_total",
                                     "Payload bytes a parameter server received, by request kind")),
      server_bytes_out_(
          CounterFamily(*registry_, "fleet_server_sent_bytes_total",
                        "Payload bytes a parameter server answered, by request kind")),
      server_handling_(CounterFamily(
          *registry_, "fleet_server_request_handling_seconds_total",
          "Seconds a parameter server spent in its handlers, by request kind (divided by the "
          "requests: the mean handling time)")),
      server_rejected_(CounterFamily(*registry_, "fleet_server_rejected_requests_total",
                                     "Requests a parameter server refused (bad input)")),
      server_rows_(GaugeFamily(*registry_, "fleet_server_table_rows",
                               "Rows (sparse) or elements (dense) a server holds, by table")),
      server_table_bytes_(GaugeFamily(*registry_, "fleet_server_table_bytes",
                                      "Memory a server's table holds, by table")),
      server_resident_(GaugeFamily(*registry_, "fleet_server_resident_memory_bytes",
                                   "Resident memory of the parameter server process")) {
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

void JobMetrics::SetTotal(prometheus::Family<prometheus::Counter>* family, const Labels& labels,
                          double value) {
  double& last = last_totals_[{family, labels}];
  // A smaller value: the process started again from 0.
  const double delta = value >= last ? value - last : value;
  last = value;
  if (delta > 0) family->Add(labels).Increment(delta);
}

void JobMetrics::WriteLine(const std::string& line) {
  if (jsonl_ == nullptr) return;
  std::fputs(line.c_str(), jsonl_);
  std::fputc('\n', jsonl_);
  std::fflush(jsonl_);
}

bool JobMetrics::Progress(const std::string& role, int rank, const ProgressValue& v) {
  std::lock_guard<std::mutex> lock(mu_);
  ProgressValue& last = last_[{role, rank}];
  if (last.unix_ms == v.unix_ms) return false;
  last = v;
  const Labels labels = {{"role", role}, {"rank", std::to_string(rank)}};
  SetTotal(steps_, labels, static_cast<double>(v.step));
  Gauge(total_, role, rank).Set(static_cast<double>(v.total_steps));
  Gauge(throughput_, role, rank).Set(v.samples_per_s);
  Gauge(heartbeat_, role, rank).Set(static_cast<double>(v.unix_ms) / 1000.0);
  std::string figures;
  for (const auto& [name, value] : v.figures) {
    prometheus::Family<prometheus::Gauge>*& family = figures_[name];
    if (family == nullptr) {
      family = GaugeFamily(*registry_, PrometheusFigureName(name),
                           "The training figure '" + name + "' at the process's last report");
    }
    family->Add(labels).Set(value);
    absl::StrAppendFormat(&figures, R"(, "%s": %.6g)", name, value);
  }
  WriteLine(absl::StrFormat(
      R"({"unix_ms": %d, "job": "%s", "role": "%s", "rank": %d, "step": %d, "total_steps": %d, "samples_per_s": %.3f%s})",
      v.unix_ms, job_id_, role, rank, v.step, v.total_steps, v.samples_per_s, figures));
  return true;
}

void JobMetrics::Started(const std::string& role, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  Gauge(up_, role, rank).Set(1);
  WriteLine(absl::StrFormat(
      R"({"unix_ms": %d, "job": "%s", "role": "%s", "rank": %d, "event": "started"})", NowUnixMs(),
      job_id_, role, rank));
}

void JobMetrics::Restarted(const std::string& role, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  restarts_->Add({{"role", role}, {"rank", std::to_string(rank)}}).Increment();
  Gauge(up_, role, rank).Set(1);
  WriteLine(absl::StrFormat(
      R"({"unix_ms": %d, "job": "%s", "role": "%s", "rank": %d, "event": "restarted"})",
      NowUnixMs(), job_id_, role, rank));
}

void JobMetrics::Exited(const std::string& role, int rank, int exit_code) {
  std::lock_guard<std::mutex> lock(mu_);
  Gauge(up_, role, rank).Set(0);
  Gauge(exit_code_, role, rank).Set(exit_code);
  WriteLine(absl::StrFormat(
      R"({"unix_ms": %d, "job": "%s", "role": "%s", "rank": %d, "event": "exited", "exit_code": %d})",
      NowUnixMs(), job_id_, role, rank, exit_code));
}

void JobMetrics::ServerStats(int rank, const pb::PsStatsReply& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string r = std::to_string(rank);
  for (const pb::PsCommandStats& c : stats.commands()) {
    const Labels labels = {{"rank", r}, {"command", c.command()}};
    SetTotal(server_requests_, labels, static_cast<double>(c.requests()));
    SetTotal(server_bytes_in_, labels, static_cast<double>(c.bytes_in()));
    SetTotal(server_bytes_out_, labels, static_cast<double>(c.bytes_out()));
    SetTotal(server_handling_, labels, static_cast<double>(c.handling_ns()) / 1e9);
  }
  SetTotal(server_rejected_, {{"rank", r}}, static_cast<double>(stats.requests_rejected()));
  for (const pb::PsTableStats& t : stats.tables()) {
    const Labels labels = {{"rank", r}, {"table", std::to_string(t.table_id())}};
    server_rows_->Add(labels).Set(static_cast<double>(t.rows()));
    server_table_bytes_->Add(labels).Set(static_cast<double>(t.bytes()));
  }
  server_resident_->Add({{"rank", r}}).Set(static_cast<double>(stats.resident_bytes()));
}

std::optional<double> JobMetrics::Throughput(const std::string& role) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<double> sum;
  for (const auto& [key, value] : last_) {
    if (key.first == role) sum = sum.value_or(0) + value.samples_per_s;
  }
  return sum;
}

std::string JobMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace fleet::launch
