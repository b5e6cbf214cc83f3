#include "examples/gpt/serve_scheduler.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>
#include <utility>

namespace fleet::examples::gpt {

// ---- CompletionChannel ----------------------------------------------------------

void CompletionChannel::Push(int32_t token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.tokens.push_back(token);
  }
  cv_.notify_all();
}

void CompletionChannel::Finish(FinishReason reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.finish = reason;
  }
  cv_.notify_all();
}

void CompletionChannel::Fail(const Status& error) {
  CHECK(!error.ok());
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.error = error;
  }
  cv_.notify_all();
}

bool CompletionChannel::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

CompletionChannel::Update CompletionChannel::Take(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !pending_.tokens.empty() || pending_.done(); });
  Update out;
  out.tokens.swap(pending_.tokens);
  out.finish = pending_.finish;
  out.error = pending_.error;
  return out;
}

void CompletionChannel::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

// ---- CompletionScheduler ----------------------------------------------------------

Result<std::unique_ptr<CompletionScheduler>> CompletionScheduler::Create(
    trainer::GptModel* model, const SchedulerOptions& options, ServeMetrics* metrics) {
  CHECK(model != nullptr && metrics != nullptr);
  if (options.max_batch < 1) {
    return Status::InvalidArgument("max_batch must be >= 1, got " +
                                   std::to_string(options.max_batch));
  }
  if (options.max_queue < 1) {
    return Status::InvalidArgument("max_queue must be >= 1, got " +
                                   std::to_string(options.max_queue));
  }
  FLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<trainer::GptDecoder> decoder,
      trainer::GptDecoder::Create(
          model, {.batch = options.max_batch, .prefill_chunk = options.prefill_chunk}));
  return std::unique_ptr<CompletionScheduler>(
      new CompletionScheduler(model, options, metrics, std::move(decoder)));
}

CompletionScheduler::CompletionScheduler(trainer::GptModel* model, const SchedulerOptions& options,
                                         ServeMetrics* metrics,
                                         std::unique_ptr<trainer::GptDecoder> decoder)
    : model_(model),
      options_(options),
      metrics_(metrics),
      generate_options_({.min_dec_len = 0,
                         .max_dec_len = 1,  // unused: max_tokens is per request
                         .eot_id = options.eot_id,
                         .vocab_limit = options.vocab_limit}),
      decoder_(std::move(decoder)) {
  // Lowest slot first, so a lone request always decodes in slot 0.
  for (int s = options.max_batch - 1; s >= 0; --s) free_slots_.push_back(s);
  thread_ = std::thread([this] { Run(); });
}

CompletionScheduler::~CompletionScheduler() { Shutdown(); }

void CompletionScheduler::Shutdown() {
  std::deque<std::unique_ptr<Sequence>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    queued.swap(queue_);
  }
  work_cv_.notify_all();
  queue_cv_.notify_all();
  for (auto& seq : queued) seq->channel->Fail(Status::Unavailable("the server is shutting down"));
  metrics_->QueueLength(0);
  if (thread_.joinable()) thread_.join();
}

Result<std::shared_ptr<CompletionChannel>> CompletionScheduler::Submit(
    const CompletionRequest& request) {
  auto seq = std::make_unique<Sequence>();
  if (request.temperature == 0) {
    seq->sampler = std::make_unique<trainer::GreedySampler>();
  } else {
    FLEET_ASSIGN_OR_RETURN(
        seq->sampler,
        trainer::RandomSampler::Create(
            {.temperature = request.temperature, .top_k = request.top_k, .top_p = request.top_p}));
  }
  CHECK(request.seed.has_value()) << "the server picks a seed for a request without one";
  seq->rng.seed(*request.seed);
  seq->prompt = request.prompt;
  seq->max_tokens = request.max_tokens;
  seq->channel = std::make_shared<CompletionChannel>();
  std::shared_ptr<CompletionChannel> channel = seq->channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return Status::Unavailable("the server is shutting down");
    if (queue_.size() >= static_cast<size_t>(options_.max_queue)) {
      return Status::Unavailable("the server is busy: " + std::to_string(queue_.size()) +
                                 " requests wait for one of " + std::to_string(options_.max_batch) +
                                 " decoding slots (--max_queue); retry later");
    }
    queue_.push_back(std::move(seq));
    metrics_->QueueLength(queue_.size());
  }
  work_cv_.notify_all();
  queue_cv_.notify_all();
  return channel;
}

void CompletionScheduler::PauseAdmission(bool paused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = paused;
  }
  work_cv_.notify_all();
}

Status CompletionScheduler::WaitForQueueLength(size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!queue_cv_.wait_for(lock, timeout, [&] { return queue_.size() == n || shutdown_; }) ||
      queue_.size() != n) {
    return Status::Timeout("waiting for " + std::to_string(n) + " queued requests (" +
                           std::to_string(queue_.size()) + " queued after " +
                           std::to_string(timeout.count()) + " ms)");
  }
  return Status::OK();
}

std::vector<std::unique_ptr<CompletionScheduler::Sequence>> CompletionScheduler::Admit() {
  std::vector<std::unique_ptr<Sequence>> admitted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!paused_ && !queue_.empty() && admitted.size() < free_slots_.size()) {
      admitted.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    metrics_->QueueLength(queue_.size());
  }
  if (!admitted.empty()) queue_cv_.notify_all();
  return admitted;
}

bool CompletionScheduler::Emit(Sequence* seq, std::span<const float> logits) {
  Result<int32_t> token = trainer::SampleNextToken(logits, *seq->sampler, &seq->rng, seq->generated,
                                                   generate_options_, &sample_scratch_);
  if (!token.ok()) {
    seq->channel->Fail(token.status());
    return true;
  }
  if (*token == options_.eot_id) {
    seq->channel->Finish(FinishReason::kStop);
    return true;
  }
  seq->channel->Push(*token);
  seq->last_token = *token;
  ++seq->generated;
  // Out of tokens, or no position left to feed this one back.
  if (seq->generated >= seq->max_tokens ||
      decoder_->position(seq->slot) >= decoder_->max_positions()) {
    seq->channel->Finish(FinishReason::kLength);
    return true;
  }
  return false;
}

void CompletionScheduler::UpdateRate(int64_t tokens) {
  const auto now = std::chrono::steady_clock::now();
  if (running_.empty()) {  // idle until the next request
    metrics_->TokensPerSecond(0);
    rate_tokens_ = 0;
    return;
  }
  if (rate_tokens_ == 0) rate_start_ = now;
  rate_tokens_ += tokens;
  const double seconds = std::chrono::duration<double>(now - rate_start_).count();
  if (seconds >= 1.0) {
    metrics_->TokensPerSecond(static_cast<double>(rate_tokens_) / seconds);
    rate_tokens_ = 0;
  }
}

void CompletionScheduler::Run() {
  const size_t V = model_->config().vocab_size;
  std::vector<int> slots;
  std::vector<int32_t> tokens;
  for (;;) {
    {
      // Idle: nothing is owed to anyone until a request arrives, so this wait
      // has no deadline; Shutdown wakes it.
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(
          lock, [&] { return shutdown_ || !running_.empty() || (!paused_ && !queue_.empty()); });
      if (shutdown_) break;
    }
    int64_t new_tokens = 0;
    for (std::unique_ptr<Sequence>& seq : Admit()) {
      seq->slot = free_slots_.back();
      free_slots_.pop_back();
      if (seq->channel->cancelled()) {
        free_slots_.push_back(seq->slot);
        continue;
      }
      metrics_->PromptTokens(static_cast<int64_t>(seq->prompt.size()));
      Result<std::span<const float>> logits = decoder_->PrefillSlot(seq->slot, seq->prompt);
      if (!logits.ok()) {
        seq->channel->Fail(logits.status());
      } else if (!Emit(seq.get(), *logits)) {
        running_.push_back(std::move(seq));
        ++new_tokens;
        continue;
      } else {
        new_tokens += seq->generated;
      }
      decoder_->ResetSlot(seq->slot);
      free_slots_.push_back(seq->slot);
    }
    // Clients that went away leave before the step.
    std::erase_if(running_, [&](const std::unique_ptr<Sequence>& seq) {
      if (!seq->channel->cancelled()) return false;
      decoder_->ResetSlot(seq->slot);
      free_slots_.push_back(seq->slot);
      return true;
    });
    metrics_->RunningBatchSize(running_.size());
    if (!running_.empty()) {
      slots.clear();
      tokens.clear();
      for (const auto& seq : running_) {
        slots.push_back(seq->slot);
        tokens.push_back(seq->last_token);
      }
      Result<std::span<const float>> logits = decoder_->StepSlots(slots, tokens);
      std::vector<char> done(running_.size(), 0);
      for (size_t i = 0; i < running_.size(); ++i) {
        Sequence* seq = running_[i].get();
        if (!logits.ok()) {  // a broken invariant of ours: fail the batch, keep serving
          seq->channel->Fail(logits.status().WithContext("decode step"));
          done[i] = 1;
          continue;
        }
        const int64_t before = seq->generated;
        done[i] = Emit(seq, logits->subspan(i * V, V));
        new_tokens += seq->generated - before;
      }
      size_t i = 0;
      std::erase_if(running_, [&](const std::unique_ptr<Sequence>& seq) {
        if (!done[i++]) return false;
        decoder_->ResetSlot(seq->slot);
        free_slots_.push_back(seq->slot);
        return true;
      });
    }
    metrics_->GeneratedTokens(new_tokens);
    UpdateRate(new_tokens);
  }
  for (auto& seq : running_) seq->channel->Fail(Status::Unavailable("the server is shutting down"));
  running_.clear();
  metrics_->RunningBatchSize(0);
}

}  // namespace fleet::examples::gpt
