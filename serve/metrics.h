// ServeMetrics: gpt_serve's Prometheus metrics (prometheus-cpp, as
// launch/metrics.h keeps fleetrun's), served as text at GET /metrics:
//
//   fleet_serve_requests_total{code}          answered requests by HTTP status:
//                                             every route and refusal (401,
//                                             404, 413, 499 a client gone)
//                                             but the probes' (/health,
//                                             /metrics) 200s
//   fleet_serve_prompt_tokens_total           prompt tokens admitted
//   fleet_serve_generated_tokens_total        tokens generated
//   fleet_serve_tokens_per_second             generated tokens/s over the last
//                                             second of work (0 when idle)
//   fleet_serve_queue_length                  sequences (choices) waiting for a
//                                             decoder slot
//   fleet_serve_running_batch_size            sequences decoded together
//   fleet_serve_request_latency_seconds       Summary (0.5, 0.9, 0.99) of a
//                                             completed request's time from
//                                             arrival to its last token
//   fleet_serve_time_to_first_token_seconds   Summary of arrival to first token
//
// Thread-safe (prometheus-cpp's metrics are).
#pragma once

#include <memory>
#include <string>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Summary;
template <typename T>
class Family;
}  // namespace prometheus

namespace fleet::serve {

class ServeMetrics {
 public:
  ServeMetrics();
  ~ServeMetrics();
  ServeMetrics(const ServeMetrics&) = delete;
  ServeMetrics& operator=(const ServeMetrics&) = delete;

  void RequestDone(int http_status);
  void PromptTokens(int64_t n);
  void GeneratedTokens(int64_t n);
  void TokensPerSecond(double rate);
  void QueueLength(size_t n);
  void RunningBatchSize(size_t n);
  void Latency(double seconds);
  void TimeToFirstToken(double seconds);

  // The Prometheus text exposition of every metric.
  std::string Text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generated_tokens_;
  prometheus::Gauge* tokens_per_second_;
  prometheus::Gauge* queue_length_;
  prometheus::Gauge* running_;
  prometheus::Summary* latency_;
  prometheus::Summary* first_token_;
};

}  // namespace fleet::serve
