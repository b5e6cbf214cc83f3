// CompletionScheduler: continuous batching of generated sequences over one
// GptDecoder with a slot (KV cache rows) per running sequence.
//
// A request of n choices (and of several prompts) is several sequences,
// each with its own slot, sampler and seeded generator. One scheduler
// thread owns the model. Each iteration it
//   1. fails queued sequences past their deadline and admits waiting ones
//      into free slots (PrefillSlot: the prompt's forward pass, with the
//      sequence's LoRA adapters, then the first token is sampled),
//   2. drops sequences that were cancelled (client gone, stop string seen)
//      or ran past their deadline (queued ones too, every 100 ms while
//      admission is paused),
//   3. runs ONE decode step for every running sequence together
//      (StepSlots: the GEMMs see one row per sequence, so the weights are
//      read once per step for all of them, whatever their adapters), then
//      samples every row in parallel (`sampling_pool`), each with its own
//      sampler.
// A sequence that finished (end-of-text, max_tokens, the context full)
// leaves its slot between steps. An admitted prompt's prefill runs before
// that iteration's step (in prefill_chunk pieces), so a long prompt delays
// the running sequences' next token by its prefill time. A sequence's
// tokens depend only on its own prompt, adapters, options and seed, never
// on what it is batched with (within float rounding of the logits).
//
// Results travel to the request's owner through a RequestChannel: the
// scheduler only appends to it and calls its notifier (never blocks on a
// client); the owner takes what arrived whenever notified.
//
// Thread-safe: Submit, PauseAdmission, WaitForQueueLength, Shutdown and the
// accessors may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm/status.h"
#include "comm/thread_pool.h"
#include "serve/metrics.h"
#include "serve/sampling.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_decoder.h"
#include "trainer/models/gpt_lora.h"

namespace fleet::serve {

enum class FinishReason { kLength, kStop };
std::string_view FinishReasonName(FinishReason reason);  // "length", "stop"

// One sequence to generate: a choice of a request.
struct SequenceRequest {
  std::vector<int32_t> prompt = {};  // token ids, checked against the context
  // New tokens at most; 0: none (the prompt alone, for its log-probabilities).
  int64_t max_tokens = 16;
  SamplingParams sampling = {};
  // The LoRA adapters it runs with (not owned, outlive the scheduler); null:
  // the base model.
  trainer::GptLoraAdapters* adapters = nullptr;
  // Log-probabilities of the prompt's tokens too (each but the first, with
  // sampling.top_logprobs alternatives).
  bool prompt_logprobs = false;
  // Failed with Timeout when not finished by then.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

// One request's sequences on their way from the scheduler to the request's
// owner. The scheduler appends and notifies; the owner takes.
class RequestChannel {
 public:
  // One per choice, as Take returns them.
  struct ChoiceUpdate {
    std::vector<int32_t> tokens;         // generated since the last Take
    std::vector<TokenLogprob> logprobs;  // one per token when asked for
    // Set once: the prompt's log-probabilities (one per prompt token after
    // the first), before any token.
    std::optional<std::vector<TokenLogprob>> prompt_logprobs;
    // Set once generation ended: finish (and error OK), or error, or
    // dropped: the scheduler let the sequence go after a cancellation.
    std::optional<FinishReason> finish;
    Status error;
    bool dropped = false;
  };

  // `notify` is called after the scheduler appended anything (on the
  // scheduler's thread: keep it short and non-blocking). `client_open`,
  // when set, is asked each iteration; false cancels every choice.
  RequestChannel(int choices, std::function<void()> notify,
                 std::function<bool()> client_open = nullptr);

  int choices() const { return static_cast<int>(updates_.size()); }

  // ---- scheduler side (never blocks beyond the channel's own mutex) ----
  void Push(int choice, int32_t token, const TokenLogprob* logprob);
  void PromptLogprobs(int choice, std::vector<TokenLogprob> logprobs);
  void Finish(int choice, FinishReason reason);
  void Fail(int choice, const Status& error);
  // The sequence was cancelled and left the queue or its slot.
  void Drop(int choice);
  // Cancel(choice), CancelAll() or the client gone.
  bool cancelled(int choice) const;

  // ---- owner side ----
  // What arrived since the last Take, one entry per choice. Never blocks.
  std::vector<ChoiceUpdate> Take();
  // The choice needs nothing more (a stop string was seen): the scheduler
  // frees its slot at its next iteration and sends nothing more for it.
  void Cancel(int choice);
  void CancelAll();

 private:
  const std::function<void()> notify_;
  const std::function<bool()> client_open_;
  mutable std::mutex mu_;
  std::vector<ChoiceUpdate> updates_;  // guarded by mu_
  std::vector<char> cancelled_;        // guarded by mu_
  bool all_cancelled_ = false;         // guarded by mu_
};

struct SchedulerOptions {
  // Sequences decoded together (decoder slots; --max_batch). More raise
  // throughput under load until a step's GEMMs stop being bound by reading
  // the weights; each costs 2 L maxT C floats of KV cache.
  int max_batch = 16;
  // Sequences waiting for a slot (--max_queue); a request whose sequences
  // would pass it is refused with Unavailable (HTTP 503) instead of waiting
  // without bound.
  int max_queue = 64;
  // Prompt positions per prefill call (GptDecoderOptions::prefill_chunk).
  int prefill_chunk = 64;
  // The largest rank of the adapters requests may name (0: none).
  int max_lora_rank = 0;
  // The tokenizer's end-of-text (generation stops with "stop") and its
  // vocabulary size (ids of a padded vocabulary beyond it are never drawn).
  int32_t eot_id = -1;
  int64_t vocab_limit = 0;
  // Threads that sample a step's rows besides the scheduler's (not owned;
  // the CPU kernels' pool suits: it idles between steps). Null: the
  // scheduler samples every row itself.
  ThreadPool* sampling_pool = nullptr;
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

  // Queues `sequences` (checked by the request parser), sequence i as
  // choice i of `channel`. Unavailable (nothing queued) when they would pass
  // max_queue or the scheduler shut down; InvalidArgument when a sampler
  // refuses its options. Never blocks on the model.
  Status Submit(std::vector<SequenceRequest> sequences, std::shared_ptr<RequestChannel> channel);

  // While paused, sequences wait in the queue and running ones go on (for
  // tests that fill the queue, and for draining).
  void PauseAdmission(bool paused);
  // Blocks until `n` sequences wait in the queue; Timeout after `timeout`.
  Status WaitForQueueLength(size_t n, std::chrono::milliseconds timeout);

  // Fails every queued and running sequence with Unavailable and stops the
  // thread; Submit refuses from then on. Idempotent.
  void Shutdown();

  // The most distinct adapters (the base counting as one) decoded in one
  // step so far: tests see that requests for different adapters shared one.
  int max_adapters_per_step() const;

 private:
  struct Sequence {
    SequenceRequest request;
    std::unique_ptr<SequenceSampler> sampler;
    std::shared_ptr<RequestChannel> channel;
    int choice = 0;
    int slot = -1;
    int64_t generated = 0;
    int32_t last_token = 0;
    // The step's draw, made on a sampling thread.
    Result<int32_t> next = 0;
    TokenLogprob next_logprob;
  };

  CompletionScheduler(trainer::GptModel* model, const SchedulerOptions& options,
                      ServeMetrics* metrics, std::unique_ptr<trainer::GptDecoder> decoder);
  void Run();
  // Admits up to the free slots from the queue, after failing the expired.
  std::vector<std::unique_ptr<Sequence>> Admit();
  // Prefills `seq` into its slot; true when it runs on (else it ended).
  bool Start(Sequence* seq);
  // Sends `seq`'s drawn token (seq->next); true when the sequence ended.
  bool Emit(Sequence* seq);
  // Adds an iteration's new tokens to the tokens/s window (>= 1 s of work);
  // 0 once nothing runs.
  void UpdateRate(int64_t tokens);
  void Release(Sequence* seq);

  // Fixed after construction.
  trainer::GptModel* const model_;
  const SchedulerOptions options_;
  ServeMetrics* const metrics_;

  // Owned by the scheduler thread alone.
  std::unique_ptr<trainer::GptDecoder> decoder_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<int> free_slots_;
  std::chrono::steady_clock::time_point rate_start_;
  int64_t rate_tokens_ = 0;

  // Guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // the scheduler waits for work or shutdown
  std::condition_variable queue_cv_;  // WaitForQueueLength
  std::deque<std::unique_ptr<Sequence>> queue_;
  bool paused_ = false;
  bool shutdown_ = false;
  int max_adapters_per_step_ = 0;

  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace fleet::serve
