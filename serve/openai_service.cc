#include "serve/openai_service.h"

#include <glog/logging.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <utility>

#include "comm/splitmix.h"
#include "serve/choice_text.h"

namespace fleet::serve {
namespace {

using Clock = std::chrono::steady_clock;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int HttpStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kTimeout:
      return 504;
    default:
      return 500;
  }
}

std::string_view ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 401:
    case 404:
    case 413:
      return "invalid_request_error";
    case 503:
      return "server_busy";
    case 504:
      return "timeout";
    default:
      return "server_error";
  }
}

// A's bytes equal B's, in time that depends on their lengths only.
bool SameKey(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// comm/http_server.h's HttpResponse (designated initializers would leave
// members without initializers out, which GCC's -Wextra reports).
HttpResponse Response(int status, std::string content_type, std::string body,
                      std::vector<std::pair<std::string, std::string>> headers = {}) {
  HttpResponse r;
  r.status = status;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  r.headers = std::move(headers);
  return r;
}

constexpr std::string_view kEndpoints =
    "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics";

}  // namespace

// One request's generation, from Submit to its answer. The scheduler's
// notifications schedule Drain on the worker threads; Drain runs on one of
// them at a time (`pending_`), so what it touches needs no lock.
class OpenAiService::Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(OpenAiService* service, uint64_t id, ResponseInfo info, GenerationRequest request,
             std::shared_ptr<Responder> responder, Clock::time_point arrival)
      : service_(service),
        id_(id),
        info_(std::move(info)),
        request_(std::move(request)),
        responder_(std::move(responder)),
        arrival_(arrival) {}

  // Submits the sequences; OK means the generation answers by itself.
  Status Start(std::vector<SequenceRequest> sequences) {
    const data::Tokenizer* tokenizer = service_->tokenizer_;
    for (size_t c = 0; c < sequences.size(); ++c) {
      Choice& ch = choices_.emplace_back(tokenizer, request_.stop);
      if (request_.echo) {
        const std::vector<int32_t>& prompt = sequences[c].prompt;
        FLEET_ASSIGN_OR_RETURN(std::string bytes, tokenizer->Decode(prompt));
        ch.echo = ToValidUtf8(bytes);
        ch.echo_pending = true;
        ch.prompt_ready = !sequences[c].prompt_logprobs;
      }
    }
    for (const auto& prompt : request_.prompts) usage_.prompt_tokens += prompt.size();
    std::weak_ptr<Generation> weak = weak_from_this();
    std::weak_ptr<Responder> responder = responder_;
    channel_ = std::make_shared<RequestChannel>(
        static_cast<int>(sequences.size()),
        [weak] {
          if (auto self = weak.lock()) self->Notify();
        },
        [responder] {
          auto r = responder.lock();
          return r != nullptr && r->open();
        });
    // pending_ starts at 1, held by Start: notifications until here only
    // count, so no Drain runs before the stream is open.
    FLEET_RETURN_IF_ERROR(service_->scheduler_->Submit(std::move(sequences), channel_));
    if (request_.stream) {
      stream_ = responder_->Stream(
          Response(200, "text/event-stream", "", {{"Cache-Control", "no-cache"}}));
      last_write_ = Clock::now().time_since_epoch().count();
      streaming_ = true;
    }
    service_->workers_->Submit([self = shared_from_this()] { self->Drain(); });
    return Status::OK();
  }

  // The scheduler appended something (its thread: only schedule the work).
  void Notify() {
    if (pending_.fetch_add(1) > 0) return;
    service_->workers_->Submit([self = shared_from_this()] { self->Drain(); });
  }

  // A streamed answer silent for `quiet` gets a keep-alive comment (on a
  // worker, in order with its chunks): an HTTP server learns that a client
  // left only when a write to it fails, and a queued request writes nothing
  // else.
  void KeepAlive(Clock::duration quiet) {
    if (!streaming_) return;
    const Clock::time_point last(Clock::duration(last_write_.load()));
    if (Clock::now() - last < quiet) return;
    keep_alive_due_ = true;
    Notify();
  }

 private:
  struct Choice {
    Choice(const data::Tokenizer* tokenizer, std::vector<std::string> stops)
        : text(tokenizer, std::move(stops)) {}
    ChoiceText text;
    std::string shown;                   // the text so far (non-streamed answers)
    std::vector<TokenLogprob> logprobs;  // one per generated token
    std::vector<LogprobEntry> entries;   // shown tokens' entries (non-streamed answers)
    size_t released = 0;                 // tokens whose entries went out
    int64_t text_offset = 0;             // where the next shown token's text starts
    std::string echo;                    // the prompt's text (echo)
    bool echo_pending = false, prompt_ready = true, opened = false, finished = false;
    bool closed_output = false;  // its last chunk (with the finish) went out
    FinishReason reason = FinishReason::kLength;
  };

  void Drain() {
    int seen = pending_.load();
    for (;;) {
      DrainOnce();
      const int left = pending_.fetch_sub(seen) - seen;
      if (left == 0) return;
      seen = left;
    }
  }

  bool wants_logprobs() const { return request_.sampling.top_logprobs >= 0; }

  LogprobToken Named(int32_t token, float logprob) const {
    Result<std::string> bytes = service_->tokenizer_->Decode({&token, 1});
    return {bytes.ok() ? *bytes : std::string(), logprob};
  }

  LogprobEntry Entry(std::string_view bytes, const TokenLogprob* lp, Choice* ch) const {
    LogprobEntry e;
    e.chosen = {std::string(bytes), lp != nullptr ? lp->logprob : 0.0f};
    e.has_logprob = lp != nullptr;
    if (lp != nullptr) {
      for (const auto& [id, logprob] : lp->top) e.top.push_back(Named(id, logprob));
    }
    e.text_offset = ch->text_offset;
    ch->text_offset += static_cast<int64_t>(ToValidUtf8(bytes).size());
    return e;
  }

  // The echoed prompt's entries: its first token has no log-probability.
  std::vector<LogprobEntry> PromptEntries(const std::vector<int32_t>& prompt,
                                          const std::vector<TokenLogprob>& logprobs, Choice* ch) {
    std::vector<LogprobEntry> out;
    for (size_t i = 0; i < prompt.size(); ++i) {
      Result<std::string> bytes = service_->tokenizer_->Decode({&prompt[i], 1});
      out.push_back(Entry(bytes.ok() ? *bytes : "", i == 0 ? nullptr : &logprobs[i - 1], ch));
    }
    return out;
  }

  void DrainOnce() {
    if (done_) return;
    if (keep_alive_due_.exchange(false) && !Write(std::string(kKeepAliveEvent))) {
      return ClientGone();
    }
    std::vector<RequestChannel::ChoiceUpdate> updates = channel_->Take();
    for (size_t c = 0; c < choices_.size(); ++c) {
      Choice& ch = choices_[c];
      RequestChannel::ChoiceUpdate& u = updates[c];
      if (ch.finished) continue;
      if (!u.error.ok()) return Abort(u.error);
      if (u.dropped && !u.finish) return ClientGone();
      std::string text;
      std::vector<LogprobEntry> entries;
      if (stream_ && info_.endpoint == Endpoint::kChat && !ch.opened) {
        ch.opened = true;
        if (!Write(ChunkEvent(info_, {.index = static_cast<int>(c)}, /*opening=*/true,
                              request_.include_usage))) {
          return ClientGone();
        }
      }
      if (u.prompt_logprobs) {
        ch.prompt_ready = true;
        if (ch.echo_pending) {
          entries = PromptEntries(request_.prompts[c / request_.n], *u.prompt_logprobs, &ch);
        }
      }
      if (ch.echo_pending && ch.prompt_ready) {
        ch.echo_pending = false;
        text = ch.echo;
        if (!wants_logprobs()) ch.text_offset = static_cast<int64_t>(ch.echo.size());
      }
      size_t shown = ch.released;
      if (!u.tokens.empty()) {
        if (!first_token_) {
          first_token_ = true;
          service_->metrics_.TimeToFirstToken(SecondsSince(arrival_));
        }
        ch.logprobs.insert(ch.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
        Result<ChoiceText::Piece> piece = ch.text.Append(u.tokens);
        if (!piece.ok()) return Abort(piece.status());
        text += piece->text;
        shown = piece->tokens;
        if (ch.text.stopped()) {
          channel_->Cancel(static_cast<int>(c));  // nothing more is needed
          u.finish = FinishReason::kStop;
        }
      }
      if (u.finish) {
        ChoiceText::Piece last = ch.text.Finish();
        text += last.text;
        shown = last.tokens;
        ch.finished = true;
        ch.reason = *u.finish;
        ++finished_;
        usage_.completion_tokens += ch.text.tokens_used();
      }
      if (wants_logprobs()) {
        for (; ch.released < shown && ch.released < ch.logprobs.size(); ++ch.released) {
          entries.push_back(
              Entry(ch.text.token_bytes(ch.released), &ch.logprobs[ch.released], &ch));
        }
      }
      if (!Output(static_cast<int>(c), &ch, std::move(text), std::move(entries))) {
        return ClientGone();
      }
    }
    if (finished_ == choices_.size()) Complete();
  }

  // A choice's new text and entries: a chunk, or kept for the body. False
  // when the client is gone.
  bool Output(int index, Choice* ch, std::string text, std::vector<LogprobEntry> entries) {
    const bool finished_now = ch->finished && !ch->closed_output;
    if (!stream_) {
      ch->shown += text;
      ch->entries.insert(ch->entries.end(), std::make_move_iterator(entries.begin()),
                         std::make_move_iterator(entries.end()));
      ch->closed_output = ch->finished;
      return true;
    }
    if (text.empty() && entries.empty() && !finished_now) return true;
    ch->closed_output = ch->finished;
    ChoiceOutput out{.index = index,
                     .text = std::move(text),
                     .logprobs = std::move(entries),
                     .has_logprobs = wants_logprobs()};
    if (ch->finished) out.finish = ch->reason;
    return Write(ChunkEvent(info_, out, /*opening=*/false, request_.include_usage));
  }

  bool Write(const std::string& event) {
    last_write_ = Clock::now().time_since_epoch().count();
    return stream_->Write(event);
  }

  void Complete() {
    done_ = true;
    service_->metrics_.Latency(SecondsSince(arrival_));
    if (stream_) {
      bool ok = true;
      if (request_.include_usage) ok = Write(UsageEvent(info_, usage_));
      ok = ok && Write(std::string(kStreamDoneEvent));
      stream_->Close();
      service_->metrics_.RequestDone(ok ? 200 : 499);
    } else {
      std::vector<ChoiceOutput> outputs;
      for (size_t c = 0; c < choices_.size(); ++c) {
        Choice& ch = choices_[c];
        outputs.push_back({.index = static_cast<int>(c),
                           .text = std::move(ch.shown),
                           .logprobs = std::move(ch.entries),
                           .has_logprobs = wants_logprobs(),
                           .finish = ch.reason});
      }
      service_->Reply(responder_, 200, ResponseBody(info_, outputs, usage_));
    }
    service_->Finished(id_);
  }

  void Abort(const Status& error) {
    done_ = true;
    channel_->CancelAll();
    if (stream_) {
      // The head went out already: the error travels as an event.
      const int code = HttpStatus(error);
      Write(ErrorEvent(error.message(), ErrorType(code)));
      stream_->Close();
      service_->metrics_.RequestDone(code);
    } else {
      service_->ReplyError(responder_, error);
    }
    service_->Finished(id_);
  }

  void ClientGone() {
    done_ = true;
    channel_->CancelAll();
    if (stream_) stream_->Close();
    service_->metrics_.RequestDone(499);  // the client closed the connection
    service_->Finished(id_);
  }

  // Fixed at construction.
  OpenAiService* const service_;
  const uint64_t id_;
  const ResponseInfo info_;
  const GenerationRequest request_;
  const std::shared_ptr<Responder> responder_;
  const Clock::time_point arrival_;

  std::atomic<int> pending_{1};  // notifications not drained yet (and Start's)
  std::atomic<bool> keep_alive_due_{false};
  std::atomic<bool> streaming_{false};     // stream_ is set (the ticker may look)
  std::atomic<Clock::rep> last_write_{0};  // steady clock ticks of the last write

  // Set by Start, before any Drain.
  std::shared_ptr<RequestChannel> channel_;
  std::shared_ptr<ResponseStream> stream_;

  // Drain's alone (one thread at a time).
  std::vector<Choice> choices_;
  Usage usage_;
  size_t finished_ = 0;
  bool first_token_ = false;
  bool done_ = false;
};

// ---- OpenAiService -------------------------------------------------------------------

Result<std::unique_ptr<OpenAiService>> OpenAiService::Create(trainer::GptModel* model,
                                                             const data::Tokenizer* tokenizer,
                                                             ChatTemplate chat,
                                                             std::vector<ServedAdapter> adapters,
                                                             const ServiceOptions& options) {
  CHECK(model != nullptr && tokenizer != nullptr);
  const trainer::GptConfig& c = model->config();
  if (tokenizer->vocab_size() > c.vocab_size) {
    return Status::InvalidArgument("the tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                                       " ids, more than the model's vocabulary of " +
                                       std::to_string(c.vocab_size),
                                   "Model.vocab_size");
  }
  if (options.max_tokens < 0) {
    return Status::InvalidArgument("--max_tokens must be >= 0, got " +
                                   std::to_string(options.max_tokens));
  }
  if (options.request_timeout.count() <= 0) {
    return Status::InvalidArgument("--request_timeout_s must be > 0");
  }
  if (options.worker_threads < 1) return Status::InvalidArgument("worker_threads must be >= 1");
  std::set<std::string> names = {options.model_name};
  for (const ServedAdapter& a : adapters) {
    CHECK(a.adapters != nullptr) << a.name;
    if (a.name.empty() || !names.insert(a.name).second) {
      return Status::InvalidArgument("--lora: the model id \"" + a.name +
                                     "\" is empty or taken (by --model_name or another --lora)");
    }
  }
  std::unique_ptr<OpenAiService> service(
      new OpenAiService(model, tokenizer, std::move(chat), std::move(adapters), options));
  SchedulerOptions scheduler = options.scheduler;
  scheduler.eot_id = tokenizer->eot_id();
  scheduler.vocab_limit = tokenizer->vocab_size();
  for (const ServedAdapter& a : service->adapters_) {
    scheduler.max_lora_rank = std::max(scheduler.max_lora_rank, a.adapters->config().lora.rank);
  }
  FLEET_ASSIGN_OR_RETURN(service->scheduler_,
                         CompletionScheduler::Create(model, scheduler, &service->metrics_));
  service->limits_.max_choices = options.scheduler.max_queue;
  return service;
}

OpenAiService::OpenAiService(trainer::GptModel* model, const data::Tokenizer* tokenizer,
                             ChatTemplate chat, std::vector<ServedAdapter> adapters,
                             const ServiceOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      chat_(std::move(chat)),
      adapters_(std::move(adapters)),
      options_(options),
      limits_({.context = model->config().max_position_embeddings,
               .max_tokens = options.max_tokens > 0 ? options.max_tokens
                                                    : model->config().max_position_embeddings,
               .vocab_size = tokenizer->vocab_size()}),
      created_(UnixSeconds()),
      workers_(std::make_unique<ThreadPool>(options.worker_threads)),
      ticker_([this] { KeepStreamsAlive(); }) {}

OpenAiService::~OpenAiService() { Stop(); }

void OpenAiService::KeepStreamsAlive() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    // Wakes every kKeepAliveEvery, or at once on Stop.
    ticker_cv_.wait_for(lock, kKeepAliveEvery);
    for (auto& [id, generation] : in_flight_) generation->KeepAlive(kKeepAliveEvery);
  }
}

void OpenAiService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_.exchange(true)) return;
  }
  ticker_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  // The scheduler fails every sequence; the generations answer 503 on the
  // workers (which run until the service is destroyed).
  if (scheduler_) scheduler_->Shutdown();
  constexpr std::chrono::seconds kAnswerTimeout{30};
  std::unique_lock<std::mutex> lock(mu_);
  if (!idle_cv_.wait_for(lock, kAnswerTimeout, [&] { return in_flight_.empty(); })) {
    LOG(WARNING) << "gpt_serve: " << in_flight_.size() << " requests still unanswered "
                 << kAnswerTimeout.count() << " s after the scheduler stopped";
  }
}

std::vector<std::string> OpenAiService::model_ids() const {
  std::vector<std::string> ids = {options_.model_name};
  for (const ServedAdapter& a : adapters_) ids.push_back(a.name);
  return ids;
}

HttpAdmission OpenAiService::Admit(const HttpRequest& head) {
  HttpAdmission admission;
  admission.max_body_bytes = options_.max_body_bytes;
  const auto refuse = [&](int status, std::string body) {
    metrics_.RequestDone(status);
    admission.refusal = Response(status, "application/json", std::move(body));
    return admission;
  };
  if (!options_.api_keys.empty() && head.path != "/health") {
    const std::optional<std::string_view> auth = head.Header("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    if (!auth || !auth->starts_with(kBearer)) {
      return refuse(401, ErrorBody("no API key: send the header Authorization: Bearer <key>",
                                   ErrorType(401), "", "invalid_api_key"));
    }
    const std::string_view key = auth->substr(kBearer.size());
    bool known = false;
    for (const std::string& k : options_.api_keys) known |= SameKey(key, k);
    if (!known) {
      return refuse(401, ErrorBody("incorrect API key", ErrorType(401), "", "invalid_api_key"));
    }
    admission.trusted = true;
  }
  if (head.content_length && *head.content_length > options_.max_body_bytes) {
    return refuse(413, ErrorBody("the request body has " + std::to_string(*head.content_length) +
                                     " bytes, more than " + std::to_string(options_.max_body_bytes),
                                 ErrorType(413)));
  }
  return admission;
}

void OpenAiService::Reply(const std::shared_ptr<Responder>& responder, int status, std::string body,
                          std::string content_type) {
  metrics_.RequestDone(status);
  responder->Send(Response(status, std::move(content_type), std::move(body)));
}

void OpenAiService::ReplyError(const std::shared_ptr<Responder>& responder, const Status& status,
                               std::string_view param, std::string_view code) {
  const int http = HttpStatus(status);
  Reply(responder, http, ErrorBody(status.message(), ErrorType(http), param, code));
}

void OpenAiService::Finished(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.erase(id);
  if (in_flight_.empty()) idle_cv_.notify_all();
}

void OpenAiService::Handle(HttpRequest request, std::shared_ptr<Responder> responder) {
  if (stopped_) {
    return ReplyError(responder, Status::Unavailable("the server is shutting down"));
  }
  if (request.method == "POST" &&
      (request.path == "/v1/completions" || request.path == "/v1/chat/completions")) {
    // Parsing and tokenizing a large prompt takes a while: off the caller's
    // thread (an HTTP server's event loop).
    const Endpoint endpoint =
        request.path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat;
    workers_->Submit([this, endpoint, request = std::move(request), responder,
                      arrival = Clock::now()] { Generate(endpoint, request, responder, arrival); });
    return;
  }
  Route(std::move(request), responder);
}

void OpenAiService::Route(HttpRequest request, const std::shared_ptr<Responder>& responder) {
  // The probes' answers are not counted (a scrape every few seconds would
  // drown the requests' counts).
  if (request.method == "GET" && request.path == "/health") {
    responder->Send(Response(200, "application/json",
                             nlohmann::json({{"status", "ok"},
                                             {"model", options_.model_name},
                                             {"models", model_ids()},
                                             {"context", model_->config().max_position_embeddings},
                                             {"max_batch", options_.scheduler.max_batch}})
                                 .dump()));
    return;
  }
  if (request.method == "GET" && request.path == "/metrics") {
    responder->Send(Response(200, "text/plain; version=0.0.4", metrics_.Text()));
    return;
  }
  if (request.method == "GET" && request.path == "/v1/models") {
    return Reply(responder, 200, ModelsBody(model_ids(), created_));
  }
  constexpr std::string_view kModel = "/v1/models/";
  if (request.method == "GET" && request.path.starts_with(kModel)) {
    const std::string id = request.path.substr(kModel.size());
    const std::vector<std::string> ids = model_ids();
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) {
      return Reply(responder, 200, ModelBody(id, created_));
    }
    return ReplyError(responder, Status::NotFound("the model \"" + id + "\" does not exist"),
                      "model", "model_not_found");
  }
  ReplyError(responder,
             Status::NotFound("no endpoint " + request.method + " " + request.path + " (" +
                              std::string(kEndpoints) + ")"),
             "", "unknown_url");
}

void OpenAiService::Generate(Endpoint endpoint, const HttpRequest& request,
                             const std::shared_ptr<Responder>& responder,
                             Clock::time_point arrival) {
  Result<GenerationRequest> parsed =
      endpoint == Endpoint::kCompletions
          ? ParseCompletionRequest(request.body, *tokenizer_, limits_)
          : ParseChatRequest(request.body, *tokenizer_, chat_, limits_);
  if (!parsed.ok()) return ReplyError(responder, parsed.status());
  GenerationRequest& r = *parsed;
  trainer::GptLoraAdapters* adapters = nullptr;
  std::string model = r.model.empty() ? options_.model_name : r.model;
  if (model != options_.model_name) {
    const auto it = std::find_if(adapters_.begin(), adapters_.end(),
                                 [&](const ServedAdapter& a) { return a.name == model; });
    if (it == adapters_.end()) {
      std::string served;
      for (const std::string& id : model_ids()) served += (served.empty() ? "" : ", ") + id;
      return ReplyError(responder,
                        Status::NotFound("the model \"" + model +
                                         "\" does not exist (this server serves: " + served + ")"),
                        "model", "model_not_found");
    }
    adapters = it->adapters;
  }
  const uint64_t id = next_id_.fetch_add(1);
  if (!r.has_seed) r.sampling.seed = std::random_device{}() ^ Mix64(id);
  std::vector<SequenceRequest> sequences;
  for (const std::vector<int32_t>& prompt : r.prompts) {
    for (int j = 0; j < r.n; ++j) {
      SequenceRequest s{.prompt = prompt,
                        .max_tokens = r.max_tokens,
                        .sampling = r.sampling,
                        .adapters = adapters,
                        .prompt_logprobs = r.echo && r.sampling.top_logprobs >= 0,
                        .deadline = arrival + options_.request_timeout};
      // Choice k's own stream of the seed (k = 0 keeps the seed itself, so
      // one choice is what gpt_generate draws with that seed).
      const uint64_t k = sequences.size();
      if (k > 0) s.sampling.seed = Mix64(r.sampling.seed + k);
      sequences.push_back(std::move(s));
    }
  }
  ResponseInfo info{
      .endpoint = endpoint,
      .id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(id),
      .created = UnixSeconds(),
      .model = model};
  auto generation =
      std::make_shared<Generation>(this, id, std::move(info), std::move(r), responder, arrival);
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_[id] = generation;
  }
  const Status started = generation->Start(std::move(sequences));
  if (!started.ok()) {
    Finished(id);
    ReplyError(responder, started);
  }
}

}  // namespace fleet::serve
