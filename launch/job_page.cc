#include "launch/job_page.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace fleet::launch {
namespace {

constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

// Keeps every other element, the first one included.
template <typename T>
void Halve(std::vector<T>& v) {
  size_t kept = 0;
  for (size_t i = 0; i < v.size(); i += 2) v[kept++] = v[i];
  v.resize(kept);
}

}  // namespace

JobPage::JobPage(std::string job_id, std::string mode)
    : job_id_(std::move(job_id)), mode_(std::move(mode)) {}

void JobPage::SetProcesses(std::vector<Process> processes) {
  std::lock_guard<std::mutex> lock(mu_);
  processes_ = std::move(processes);
}

void JobPage::SetRemoteProcesses(const std::string& host, const std::string& json) {
  // Published by another fleetrun, so checked like any outside input.
  const nlohmann::json parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_array()) return;
  std::lock_guard<std::mutex> lock(mu_);
  remote_[host] = parsed.dump();
}

void JobPage::AddReport(const std::string& name, const ProgressValue& value) {
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = series_[name];
  if (s.last_unix_ms == value.unix_ms) return;
  s.last_unix_ms = value.unix_ms;
  if (s.t.size() >= kMaxPoints) {
    Halve(s.t);
    for (auto& [key, values] : s.values) Halve(values);
  }
  const size_t before = s.t.size();
  s.t.push_back(value.unix_ms);
  std::vector<std::pair<std::string, double>> point = {{"step", static_cast<double>(value.step)}};
  // 0: no throughput measured yet (a report before the first interval's).
  if (value.samples_per_s > 0) point.emplace_back("samples_per_s", value.samples_per_s);
  point.insert(point.end(), value.figures.begin(), value.figures.end());
  for (const auto& [key, v] : point) {
    std::vector<double>& values = s.values[key];
    values.resize(before, kNoValue);  // a figure new in this report: none before
    values.push_back(v);
  }
  for (auto& [key, values] : s.values) values.resize(s.t.size(), kNoValue);
}

void JobPage::SetStatus(std::string status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = std::move(status);
}

std::string JobPage::ProcessesJson(const std::vector<Process>& processes) {
  nlohmann::json out = nlohmann::json::array();
  for (const Process& p : processes) {
    out.push_back({{"host", p.host},
                   {"name", p.name},
                   {"role", p.role},
                   {"rank", p.rank},
                   {"pid", p.pid},
                   {"state", p.state},
                   {"restarts", p.restarts},
                   {"endpoint", p.endpoint},
                   {"log", p.log},
                   {"tail", p.tail}});
  }
  // Log lines are whatever a process printed: invalid UTF-8 is replaced,
  // never an exception.
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string JobPage::StateJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out;
  out["job"] = job_id_;
  out["mode"] = mode_;
  out["status"] = status_;
  out["wall_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  nlohmann::json processes = nlohmann::json::parse(ProcessesJson(processes_));
  for (const auto& [host, json] : remote_) {
    for (const nlohmann::json& p : nlohmann::json::parse(json)) processes.push_back(p);
  }
  out["processes"] = std::move(processes);
  nlohmann::json series = nlohmann::json::object();
  for (const auto& [name, s] : series_) {
    nlohmann::json one = {{"t", s.t}};
    for (const auto& [key, values] : s.values) {
      nlohmann::json column = nlohmann::json::array();
      for (double v : values) column.push_back(std::isfinite(v) ? nlohmann::json(v) : nullptr);
      one[key] = std::move(column);
    }
    series[name] = std::move(one);
  }
  out["series"] = std::move(series);
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace fleet::launch
