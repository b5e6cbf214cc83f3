// CompletionScheduler: continuous batching of completion requests over one
// GptDecoder with a slot (KV cache rows) per running request.
//
// One scheduler thread owns the model. Each iteration it
//   1. admits waiting requests into free slots (PrefillSlot: the prompt's
//      forward pass, then the first token is sampled),
//   2. drops sequences whose client went away (Cancel),
//   3. runs ONE decode step for every running sequence together
//      (StepSlots: the GEMMs see one row per sequence, so the weights are
//      read once per step for all of them) and samples each one's next token
//      with its own sampler and seeded generator,
// and a sequence that finished (end-of-text, max_tokens, the context full)
// leaves its slot between steps. An admitted prompt's prefill runs before
// that iteration's step (in prefill_chunk pieces), so a long prompt delays
// the running sequences' next token by its prefill time. A request's tokens depend only on its own
// prompt, options and seed, never on what it is batched with (within float
// rounding of the logits).
//
// Handlers talk to the scheduler through a CompletionChannel per request:
// the scheduler only appends to it (never blocks on a client), the handler
// takes what arrived with a timeout.
//
// Thread-safe: Submit, PauseAdmission, WaitForQueueLength and the accessors
// may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "comm/status.h"
#include "examples/gpt/serve_metrics.h"
#include "examples/gpt/serve_request.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_decoder.h"
#include "trainer/models/gpt_sampling.h"

namespace fleet::examples::gpt {

// One request's tokens on their way from the scheduler to its handler.
class CompletionChannel {
 public:
  struct Update {
    std::vector<int32_t> tokens;  // generated since the last Take
    // Set once generation ended: finish (and error OK), or error.
    std::optional<FinishReason> finish;
    Status error;
    bool done() const { return finish.has_value() || !error.ok(); }
  };

  // ---- scheduler side (never blocks beyond the channel's own mutex) ----
  void Push(int32_t token);
  void Finish(FinishReason reason);
  void Fail(const Status& error);
  bool cancelled() const;

  // ---- handler side ----
  // Waits until tokens or the end arrived, at most `timeout`, and returns
  // what came since the last call (possibly nothing, after the timeout).
  Update Take(std::chrono::milliseconds timeout);
  // The client is gone: the scheduler frees the sequence's slot at its next
  // iteration and sends nothing more.
  void Cancel();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Update pending_;          // guarded by mu_
  bool cancelled_ = false;  // guarded by mu_
};

struct SchedulerOptions {
  // Sequences decoded together (decoder slots; --max_batch). More raise
  // throughput under load until a step's GEMMs stop being bound by reading
  // the weights; each costs 2 L maxT C floats of KV cache.
  int max_batch = 16;
  // Requests waiting for a slot (--max_queue); one more is refused with
  // Unavailable (HTTP 503) instead of waiting without bound.
  int max_queue = 64;
  // Prompt positions per prefill call (GptDecoderOptions::prefill_chunk).
  int prefill_chunk = 64;
  // The tokenizer's end-of-text (generation stops with "stop") and its
  // vocabulary size (ids of a padded vocabulary beyond it are never drawn).
  int32_t eot_id = -1;
  int64_t vocab_limit = 0;
};

class CompletionScheduler {
 public:
  // Starts the scheduler thread. `model` and `metrics` are not owned and must
  // outlive the scheduler; nothing else may use the model meanwhile.
  // InvalidArgument for max_batch, max_queue or prefill_chunk < 1.
  static Result<std::unique_ptr<CompletionScheduler>> Create(trainer::GptModel* model,
                                                             const SchedulerOptions& options,
                                                             ServeMetrics* metrics);
  // Shutdown(), then joins the thread.
  ~CompletionScheduler();

  // Queues `request` (checked by ParseCompletionRequest) and returns the
  // channel its tokens arrive on. Unavailable when max_queue requests are
  // waiting or the scheduler shut down; InvalidArgument when the sampling
  // options are refused by the sampler. Never blocks on the model.
  // REQUIRES: request.seed is set (the server draws one when the client
  // sent none).
  Result<std::shared_ptr<CompletionChannel>> Submit(const CompletionRequest& request);

  // While paused, requests wait in the queue and running ones go on (for
  // tests that fill the queue, and for draining).
  void PauseAdmission(bool paused);
  // Blocks until `n` requests wait in the queue; Timeout after `timeout`.
  Status WaitForQueueLength(size_t n, std::chrono::milliseconds timeout);

  // Fails every queued and running request with Unavailable and stops the
  // thread; Submit refuses from then on. Idempotent.
  void Shutdown();

 private:
  struct Sequence {
    std::vector<int32_t> prompt;
    int64_t max_tokens = 0;
    std::unique_ptr<trainer::TokenSampler> sampler;
    std::mt19937_64 rng;
    std::shared_ptr<CompletionChannel> channel;
    int slot = -1;
    int64_t generated = 0;
    int32_t last_token = 0;
  };

  CompletionScheduler(trainer::GptModel* model, const SchedulerOptions& options,
                      ServeMetrics* metrics, std::unique_ptr<trainer::GptDecoder> decoder);
  void Run();
  // Samples `seq`'s next token from `logits` and sends it; true when the
  // sequence ended (its channel is finished or failed).
  bool Emit(Sequence* seq, std::span<const float> logits);
  // Admits up to the free slots from the queue; returns them.
  std::vector<std::unique_ptr<Sequence>> Admit();
  // Adds an iteration's new tokens to the tokens/s window (>= 1 s of work);
  // 0 once nothing runs.
  void UpdateRate(int64_t tokens);

  // Fixed after construction.
  trainer::GptModel* const model_;
  const SchedulerOptions options_;
  ServeMetrics* const metrics_;
  const trainer::GenerateOptions generate_options_;

  // Owned by the scheduler thread alone.
  std::unique_ptr<trainer::GptDecoder> decoder_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<int> free_slots_;
  std::vector<float> sample_scratch_;
  std::chrono::steady_clock::time_point rate_start_;
  int64_t rate_tokens_ = 0;

  // Guarded by mu_.
  std::mutex mu_;
  std::condition_variable work_cv_;   // the scheduler waits for work or shutdown
  std::condition_variable queue_cv_;  // WaitForQueueLength
  std::deque<std::unique_ptr<Sequence>> queue_;
  bool paused_ = false;
  bool shutdown_ = false;

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace fleet::examples::gpt
