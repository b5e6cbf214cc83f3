#include "comm/progress_report.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "comm/cluster.h"
#include "comm/kv_store.h"

DEFINE_double(progress_every_s, 10,
              "Seconds between this process's progress lines (step, throughput, ETA to the end "
              "of the epoch and of the job) and its reports to fleetrun's /metrics; 0 = none.");

namespace fleet {

std::chrono::milliseconds ProgressIntervalFromFlag() {
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::max(0.0, FLAGS_progress_every_s) * 1000));
}

std::string FormatProgressValue(const ProgressValue& v) {
  std::string out =
      absl::StrFormat("%d %d %.3f %d", v.step, v.total_steps, v.samples_per_s, v.unix_ms);
  for (const auto& [name, value] : v.figures) absl::StrAppendFormat(&out, " %s=%.6g", name, value);
  return out;
}

Result<ProgressValue> ParseProgressValue(const std::string& text) {
  std::istringstream in(text);
  ProgressValue v;
  if (!(in >> v.step >> v.total_steps >> v.samples_per_s >> v.unix_ms)) {
    return Status::InvalidArgument(
        "progress is not 'step total samples_per_s unix_ms [name=value ...]'", text);
  }
  for (std::string pair; in >> pair;) {
    const size_t eq = pair.find('=');
    double value = 0;
    const std::string name = pair.substr(0, eq);
    if (eq == std::string::npos || name.empty() || FigureName(name) != name ||
        !absl::SimpleAtod(pair.substr(eq + 1), &value)) {
      return Status::InvalidArgument("progress figure is not name=value", pair);
    }
    v.figures.emplace_back(name, value);
  }
  return v;
}

std::string FigureName(std::string_view tag) {
  std::string name;
  if (tag.starts_with("train/")) {
    tag.remove_prefix(6);
  } else if (tag.starts_with("eval/")) {
    tag.remove_prefix(5);
    name = "eval_";
  }
  for (char c : tag) {
    if (c == '/') {
      name += '_';
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') {
      name += c;
    }
  }
  return name;
}

std::string ProgressKey(const std::string& role, int rank) {
  return absl::StrCat("progress/", role, "/", rank);
}

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

ProgressReporterOptions ProgressOptionsFor(const ClusterSpec& spec, std::string name,
                                           int64_t total_steps, int64_t steps_per_epoch,
                                           int64_t samples_per_step) {
  ProgressReporterOptions o;
  o.name = std::move(name);
  o.role = std::string(RoleName(spec.role));
  o.rank = spec.rank;
  o.total_steps = total_steps;
  o.steps_per_epoch = steps_per_epoch;
  o.samples_per_step = samples_per_step;
  o.interval = ProgressIntervalFromFlag();
  o.kv_endpoint = spec.kv_endpoint;
  o.job_id = spec.job_id;
  o.kv_auth = spec.credentials;
  return o;
}

ProgressReporter::ProgressReporter(ProgressReporterOptions options) : options_(std::move(options)) {
  if (options_.kv_endpoint) {
    kv_ = std::make_unique<KvStoreClient>(
        options_.kv_endpoint->ToString(), options_.job_id,
        KvStoreClientOptions{.request_timeout = std::chrono::seconds(2), .auth = options_.kv_auth});
  }
}

ProgressReporter::~ProgressReporter() = default;

void ProgressReporter::Step(int64_t steps_done) {
  if (options_.interval.count() <= 0) return;
  const Clock::time_point now = Clock::now();
  if (!started_) {
    started_ = true;
    first_ = last_ = now;
    first_step_ = last_step_ = steps_done;
    return;
  }
  if (now - last_ < options_.interval) {
    if (figures_pending_ && now - last_sent_ >= kFigureEvery) Send(steps_done, last_samples_per_s_);
    return;
  }
  const double seconds = std::chrono::duration<double>(now - last_).count();
  const double steps_per_s = (steps_done - last_step_) / seconds;
  last_ = now;
  last_step_ = steps_done;
  const int64_t spe = std::max<int64_t>(options_.steps_per_epoch, 1);
  const int64_t in_epoch = steps_done % spe == 0 && steps_done > 0 ? spe : steps_done % spe;
  const int64_t epoch = (steps_done - in_epoch) / spe;
  std::string line = absl::StrFormat(
      "%s: step %d/%d (epoch %d: %d/%d), %.2f steps/s, %.0f samples/s", options_.name, steps_done,
      options_.total_steps, epoch + options_.epoch_base, in_epoch, spe, steps_per_s,
      steps_per_s * static_cast<double>(options_.samples_per_step));
  if (steps_per_s > 0) {
    absl::StrAppend(&line, ", eta epoch ", FormatDuration((spe - in_epoch) / steps_per_s), ", job ",
                    FormatDuration((options_.total_steps - steps_done) / steps_per_s));
  }
  if (options_.log) {
    options_.log(line);
  } else {
    LOG(INFO) << line;
  }
  last_samples_per_s_ = steps_per_s * static_cast<double>(options_.samples_per_step);
  Send(steps_done, last_samples_per_s_);
}

void ProgressReporter::Figure(std::string_view tag, double value) {
  if (options_.interval.count() <= 0) return;
  const std::string name = FigureName(tag);
  auto it = std::find_if(figures_.begin(), figures_.end(),
                         [&name](const auto& f) { return f.first == name; });
  if (it == figures_.end()) {
    figures_.emplace_back(name, value);
  } else {
    it->second = value;
  }
  figures_pending_ = true;
  if (Clock::now() - last_sent_ >= kFigureEvery) Send(last_step_, last_samples_per_s_);
}

void ProgressReporter::Finish(int64_t steps_done) {
  if (options_.interval.count() <= 0 || !started_ || finished_) return;
  finished_ = true;
  const double seconds = std::chrono::duration<double>(Clock::now() - first_).count();
  if (seconds <= 0 || steps_done <= first_step_) return;
  last_step_ = steps_done;
  last_samples_per_s_ =
      (steps_done - first_step_) / seconds * static_cast<double>(options_.samples_per_step);
  Send(steps_done, last_samples_per_s_);
}

void ProgressReporter::Send(int64_t steps_done, double samples_per_s) {
  last_sent_ = Clock::now();
  figures_pending_ = false;
  if (kv_ == nullptr) return;
  ProgressValue value{steps_done, options_.total_steps, samples_per_s,
                      std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count(),
                      figures_};
  Status st = kv_->Set(ProgressKey(options_.role, options_.rank), FormatProgressValue(value));
  if (!st.ok()) LOG(WARNING) << options_.name << ": cannot report progress: " << st.ToString();
}

}  // namespace fleet
