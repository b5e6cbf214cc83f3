#include "serve/scheduler.h"

#include <glog/logging.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

namespace fleet::serve {

using Clock = std::chrono::steady_clock;

std::string_view FinishReasonName(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

// ---- RequestChannel ---------------------------------------------------------------

RequestChannel::RequestChannel(int choices, std::function<void()> notify,
                               std::function<bool()> client_open)
    : notify_(std::move(notify)),
      client_open_(std::move(client_open)),
      updates_(choices),
      cancelled_(choices, 0) {
  CHECK_GE(choices, 1);
}

void RequestChannel::Push(int choice, int32_t token, const TokenLogprob* logprob) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_[choice].tokens.push_back(token);
    if (logprob != nullptr) updates_[choice].logprobs.push_back(*logprob);
  }
  notify_();
}

void RequestChannel::PromptLogprobs(int choice, std::vector<TokenLogprob> logprobs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_[choice].prompt_logprobs = std::move(logprobs);
  }
  notify_();
}

void RequestChannel::Finish(int choice, FinishReason reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_[choice].finish = reason;
  }
  notify_();
}

void RequestChannel::Fail(int choice, const Status& error) {
  CHECK(!error.ok());
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_[choice].error = error;
  }
  notify_();
}

void RequestChannel::Drop(int choice) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_[choice].dropped = true;
  }
  notify_();
}

bool RequestChannel::cancelled(int choice) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (all_cancelled_ || cancelled_[choice]) return true;
  }
  return client_open_ && !client_open_();
}

std::vector<RequestChannel::ChoiceUpdate> RequestChannel::Take() {
  std::vector<ChoiceUpdate> out(updates_.size());
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t c = 0; c < updates_.size(); ++c) {
    ChoiceUpdate& u = updates_[c];
    out[c].tokens.swap(u.tokens);
    out[c].logprobs.swap(u.logprobs);
    out[c].prompt_logprobs.swap(u.prompt_logprobs);
    u.prompt_logprobs.reset();
    // The end stays set: a later Take still reports it.
    out[c].finish = u.finish;
    out[c].error = u.error;
    out[c].dropped = u.dropped;
  }
  return out;
}

void RequestChannel::Cancel(int choice) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_[choice] = 1;
}

void RequestChannel::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  all_cancelled_ = true;
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
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::GptDecoder> decoder,
                         trainer::GptDecoder::Create(model, {.batch = options.max_batch,
                                                             .prefill_chunk = options.prefill_chunk,
                                                             .max_lora_rank = options.max_lora_rank,
                                                             .prompt_logits = true}));
  return std::unique_ptr<CompletionScheduler>(
      new CompletionScheduler(model, options, metrics, std::move(decoder)));
}

CompletionScheduler::CompletionScheduler(trainer::GptModel* model, const SchedulerOptions& options,
                                         ServeMetrics* metrics,
                                         std::unique_ptr<trainer::GptDecoder> decoder)
    : model_(model), options_(options), metrics_(metrics), decoder_(std::move(decoder)) {
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
  for (auto& seq : queued) {
    seq->channel->Fail(seq->choice, Status::Unavailable("the server is shutting down"));
  }
  metrics_->QueueLength(0);
  if (thread_.joinable()) thread_.join();
}

Status CompletionScheduler::Submit(std::vector<SequenceRequest> sequences,
                                   std::shared_ptr<RequestChannel> channel) {
  CHECK_EQ(static_cast<int>(sequences.size()), channel->choices());
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < sequences.size(); ++i) {
    auto seq = std::make_unique<Sequence>();
    FLEET_ASSIGN_OR_RETURN(seq->sampler,
                           SequenceSampler::Create(sequences[i].sampling, options_.vocab_limit));
    seq->request = std::move(sequences[i]);
    seq->channel = channel;
    seq->choice = static_cast<int>(i);
    seqs.push_back(std::move(seq));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return Status::Unavailable("the server is shutting down");
    if (queue_.size() + seqs.size() > static_cast<size_t>(options_.max_queue)) {
      return Status::Unavailable(
          "the server is busy: " + std::to_string(queue_.size()) + " sequences wait for one of " +
          std::to_string(options_.max_batch) + " decoding slots and this request adds " +
          std::to_string(seqs.size()) + " (--max_queue " + std::to_string(options_.max_queue) +
          "); retry later");
    }
    for (auto& seq : seqs) queue_.push_back(std::move(seq));
    metrics_->QueueLength(queue_.size());
  }
  work_cv_.notify_all();
  queue_cv_.notify_all();
  return Status::OK();
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
    return Status::Timeout("waiting for " + std::to_string(n) + " queued sequences (" +
                           std::to_string(queue_.size()) + " queued after " +
                           std::to_string(timeout.count()) + " ms)");
  }
  return Status::OK();
}

int CompletionScheduler::max_adapters_per_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_adapters_per_step_;
}

std::vector<std::unique_ptr<CompletionScheduler::Sequence>> CompletionScheduler::Admit() {
  std::vector<std::unique_ptr<Sequence>> admitted, expired, cancelled;
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(queue_, [&](std::unique_ptr<Sequence>& seq) {
      if (seq->request.deadline <= now) {
        expired.push_back(std::move(seq));
      } else if (seq->channel->cancelled(seq->choice)) {
        cancelled.push_back(std::move(seq));
      } else {
        return false;
      }
      return true;
    });
    while (!paused_ && !queue_.empty() && admitted.size() < free_slots_.size()) {
      admitted.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    metrics_->QueueLength(queue_.size());
  }
  for (auto& seq : expired) {
    seq->channel->Fail(seq->choice,
                       Status::Timeout("the request waited for a decoding slot past its deadline "
                                       "(--request_timeout_s)"));
  }
  for (auto& seq : cancelled) seq->channel->Drop(seq->choice);
  if (!admitted.empty() || !expired.empty() || !cancelled.empty()) queue_cv_.notify_all();
  return admitted;
}

void CompletionScheduler::Release(Sequence* seq) {
  decoder_->ResetSlot(seq->slot);
  free_slots_.push_back(seq->slot);
}

bool CompletionScheduler::Start(Sequence* seq) {
  const SequenceRequest& r = seq->request;
  metrics_->PromptTokens(static_cast<int64_t>(r.prompt.size()));
  std::vector<TokenLogprob> prompt_logprobs;
  trainer::PromptLogitsFn each_position;
  if (r.prompt_logprobs) {
    // Position p's logits give the log-probability of prompt token p + 1.
    each_position = [&](int first, int rows, std::span<const float> logits) {
      const size_t V = logits.size() / rows;
      for (int j = 0; j < rows && first + j + 1 < static_cast<int>(r.prompt.size()); ++j) {
        prompt_logprobs.push_back(LogprobsOf(logits.subspan(j * V, V), options_.vocab_limit,
                                             r.prompt[first + j + 1], r.sampling.top_logprobs));
      }
    };
  }
  Result<std::span<const float>> logits =
      decoder_->PrefillSlot(seq->slot, r.prompt, r.adapters, each_position);
  if (!logits.ok()) {
    seq->channel->Fail(seq->choice, logits.status());
    return false;
  }
  if (r.prompt_logprobs) seq->channel->PromptLogprobs(seq->choice, std::move(prompt_logprobs));
  if (r.max_tokens == 0) {
    seq->channel->Finish(seq->choice, FinishReason::kLength);
    return false;
  }
  seq->next = seq->sampler->Next(*logits, &seq->next_logprob);
  return !Emit(seq);
}

bool CompletionScheduler::Emit(Sequence* seq) {
  if (!seq->next.ok()) {
    seq->channel->Fail(seq->choice, seq->next.status());
    return true;
  }
  const int32_t token = *seq->next;
  if (token == options_.eot_id) {
    seq->channel->Finish(seq->choice, FinishReason::kStop);
    return true;
  }
  seq->channel->Push(seq->choice, token,
                     seq->sampler->wants_logprobs() ? &seq->next_logprob : nullptr);
  seq->last_token = token;
  ++seq->generated;
  // Out of tokens, or no position left to feed this one back.
  if (seq->generated >= seq->request.max_tokens ||
      decoder_->position(seq->slot) >= decoder_->max_positions()) {
    seq->channel->Finish(seq->choice, FinishReason::kLength);
    return true;
  }
  return false;
}

void CompletionScheduler::UpdateRate(int64_t tokens) {
  const auto now = Clock::now();
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
  // How often a paused queue is looked at for expired deadlines.
  constexpr std::chrono::milliseconds kDeadlineCheck{100};
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto ready = [&] {
        return shutdown_ || !running_.empty() || (!paused_ && !queue_.empty());
      };
      while (!ready()) {
        if (queue_.empty()) {
          // Idle: nothing is owed to anyone until a request arrives, so
          // this wait has no deadline; Submit and Shutdown wake it.
          work_cv_.wait(lock);
        } else if (work_cv_.wait_for(lock, kDeadlineCheck) == std::cv_status::timeout) {
          break;  // admission paused: look at the queue's deadlines and clients
        }
      }
      if (shutdown_) break;
    }
    int64_t new_tokens = 0;
    for (std::unique_ptr<Sequence>& seq : Admit()) {
      seq->slot = free_slots_.back();
      free_slots_.pop_back();
      if (seq->channel->cancelled(seq->choice)) {
        seq->channel->Drop(seq->choice);
      } else if (Start(seq.get())) {
        running_.push_back(std::move(seq));
        ++new_tokens;
        continue;
      }
      new_tokens += seq->generated;
      Release(seq.get());
    }
    // Sequences whose client left, whose stop string was seen or whose
    // deadline passed leave before the step.
    const Clock::time_point now = Clock::now();
    std::erase_if(running_, [&](const std::unique_ptr<Sequence>& seq) {
      const bool expired = seq->request.deadline <= now;
      if (!expired && !seq->channel->cancelled(seq->choice)) return false;
      if (expired) {
        seq->channel->Fail(seq->choice,
                           Status::Timeout("the completion did not finish within "
                                           "--request_timeout_s (" +
                                           std::to_string(seq->generated) + " tokens generated)"));
      } else {
        seq->channel->Drop(seq->choice);
      }
      Release(seq.get());
      return true;
    });
    // Rows of one adapter side by side: the decoder adds each adapter's
    // terms once per run of rows.
    std::stable_sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
      return a->request.adapters < b->request.adapters;
    });
    metrics_->RunningBatchSize(running_.size());
    if (!running_.empty()) {
      slots.clear();
      tokens.clear();
      std::set<const trainer::GptLoraAdapters*> adapters;
      for (const auto& seq : running_) {
        slots.push_back(seq->slot);
        tokens.push_back(seq->last_token);
        adapters.insert(seq->request.adapters);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        max_adapters_per_step_ =
            std::max(max_adapters_per_step_, static_cast<int>(adapters.size()));
      }
      Result<std::span<const float>> logits = decoder_->StepSlots(slots, tokens);
      if (!logits.ok()) {
        // A broken invariant of ours: fail the batch, keep serving.
        for (const auto& seq : running_) seq->next = logits.status().WithContext("decode step");
      } else {
        // Every row's draw at once: each sequence has its own sampler and
        // generator, so the rows are independent.
        const auto sample = [&](size_t i) {
          Sequence* seq = running_[i].get();
          seq->next = seq->sampler->Next(logits->subspan(i * V, V), &seq->next_logprob);
        };
        if (options_.sampling_pool != nullptr && running_.size() > 1) {
          options_.sampling_pool->ParallelFor(running_.size(), sample);
        } else {
          for (size_t i = 0; i < running_.size(); ++i) sample(i);
        }
      }
      std::erase_if(running_, [&](const std::unique_ptr<Sequence>& seq) {
        const int64_t before = seq->generated;
        const bool done = Emit(seq.get());
        new_tokens += seq->generated - before;
        if (done) Release(seq.get());
        return done;
      });
    }
    metrics_->GeneratedTokens(new_tokens);
    UpdateRate(new_tokens);
  }
  for (auto& seq : running_) {
    seq->channel->Fail(seq->choice, Status::Unavailable("the server is shutting down"));
  }
  running_.clear();
  metrics_->RunningBatchSize(0);
}

}  // namespace fleet::serve
