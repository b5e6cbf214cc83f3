#include "serve/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/summary.h>
#include <prometheus/text_serializer.h>

namespace fleet::serve {
namespace {

prometheus::Gauge* Gauge(prometheus::Registry& registry, const char* name, const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Counter* Counter(prometheus::Registry& registry, const char* name, const char* help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Summary* Summary(prometheus::Registry& registry, const char* name, const char* help) {
  // Quantiles with their allowed error; over the last 60 s (prometheus-cpp's
  // default window), so they follow the current load.
  const prometheus::Summary::Quantiles quantiles = {{0.5, 0.05}, {0.9, 0.01}, {0.99, 0.001}};
  return &prometheus::BuildSummary().Name(name).Help(help).Register(registry).Add({}, quantiles);
}

}  // namespace

ServeMetrics::ServeMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(&prometheus::BuildCounter()
                     .Name("fleet_serve_requests_total")
                     .Help("Answered requests by HTTP status")
                     .Register(*registry_)),
      prompt_tokens_(
          Counter(*registry_, "fleet_serve_prompt_tokens_total", "Prompt tokens admitted")),
      generated_tokens_(
          Counter(*registry_, "fleet_serve_generated_tokens_total", "Tokens generated")),
      tokens_per_second_(Gauge(*registry_, "fleet_serve_tokens_per_second",
                               "Generated tokens per second over the last second of work")),
      queue_length_(
          Gauge(*registry_, "fleet_serve_queue_length", "Sequences waiting for a decoder slot")),
      running_(Gauge(*registry_, "fleet_serve_running_batch_size",
                     "Sequences decoded together in the last step")),
      latency_(Summary(*registry_, "fleet_serve_request_latency_seconds",
                       "Time from a request's arrival to its last token")),
      first_token_(Summary(*registry_, "fleet_serve_time_to_first_token_seconds",
                           "Time from a request's arrival to its first token")) {}

ServeMetrics::~ServeMetrics() = default;

void ServeMetrics::RequestDone(int http_status) {
  requests_->Add({{"code", std::to_string(http_status)}}).Increment();
}
void ServeMetrics::PromptTokens(int64_t n) { prompt_tokens_->Increment(static_cast<double>(n)); }
void ServeMetrics::GeneratedTokens(int64_t n) {
  generated_tokens_->Increment(static_cast<double>(n));
}
void ServeMetrics::TokensPerSecond(double rate) { tokens_per_second_->Set(rate); }
void ServeMetrics::QueueLength(size_t n) { queue_length_->Set(static_cast<double>(n)); }
void ServeMetrics::RunningBatchSize(size_t n) { running_->Set(static_cast<double>(n)); }
void ServeMetrics::Latency(double seconds) { latency_->Observe(seconds); }
void ServeMetrics::TimeToFirstToken(double seconds) { first_token_->Observe(seconds); }

std::string ServeMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace fleet::serve
