#include "examples/gpt/serve_app.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/numbers.h"
#include "comm/http_listen.h"
#include "comm/program_help.h"
#include "comm/stop_signal.h"
#include "comm/yaml_config.h"
#include "examples/gpt/generate_app.h"
#include "examples/gpt/program_flags.h"
#include "collective/config/gpt_data.h"
#include "trainer/kernels/gpt_kernels_factory.h"

namespace fleet::examples::gpt {
namespace {

using Clock = std::chrono::steady_clock;

// How long a streamed response waits for the next token before it checks
// its deadline again; the scheduler's tokens wake it at once.
constexpr std::chrono::milliseconds kStreamPoll{250};
constexpr std::string_view kKeepAliveEvent = ": keep-alive\n\n";

int HttpStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return 400;
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
      return "invalid_request_error";
    case 503:
      return "server_busy";
    case 504:
      return "timeout";
    default:
      return "server_error";
  }
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One request's generation as its handler sees it: takes the channel's
// updates, turns tokens into text and keeps the numbers the response and the
// metrics need.
class Generation {
 public:
  Generation(std::shared_ptr<CompletionChannel> channel, const data::Tokenizer* tokenizer,
             ServeMetrics* metrics, Clock::time_point arrival, Clock::time_point deadline)
      : channel_(std::move(channel)),
        text_(tokenizer),
        metrics_(metrics),
        arrival_(arrival),
        deadline_(deadline) {}

  // Waits (at most `poll`, and never past the deadline) for what the
  // scheduler sent next and returns its text (possibly empty). Sets
  // finish() at the end; a failure, a broken tokenizer or the deadline is
  // returned as a Status (the sequence is then cancelled).
  Result<std::string> Next(std::chrono::milliseconds poll) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
    if (left.count() <= 0) {
      channel_->Cancel();
      return Status::Timeout("the completion did not finish within --request_timeout_s (" +
                             std::to_string(completion_tokens_) + " tokens generated)");
    }
    CompletionChannel::Update u = channel_->Take(std::min(poll, left));
    if (!u.tokens.empty() && completion_tokens_ == 0)
      metrics_->TimeToFirstToken(SecondsSince(arrival_));
    completion_tokens_ += static_cast<int64_t>(u.tokens.size());
    FLEET_ASSIGN_OR_RETURN(std::string text, text_.Append(u.tokens));
    if (!u.error.ok()) return u.error;
    if (u.finish) {
      finish_ = u.finish;
      text += text_.Finish();
      metrics_->Latency(SecondsSince(arrival_));
    }
    return text;
  }

  std::optional<FinishReason> finish() const { return finish_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  void Cancel() { channel_->Cancel(); }

 private:
  const std::shared_ptr<CompletionChannel> channel_;
  Utf8Stream text_;
  ServeMetrics* const metrics_;
  const Clock::time_point arrival_, deadline_;
  std::optional<FinishReason> finish_;
  int64_t completion_tokens_ = 0;
};

}  // namespace

Result<std::unique_ptr<CompletionServer>> CompletionServer::Start(trainer::GptModel* model,
                                                                  const data::Tokenizer* tokenizer,
                                                                  const ServeOptions& options) {
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
  std::unique_ptr<CompletionServer> server(new CompletionServer(model, tokenizer, options));
  SchedulerOptions scheduler = options.scheduler;
  scheduler.eot_id = tokenizer->eot_id();
  scheduler.vocab_limit = tokenizer->vocab_size();
  FLEET_ASSIGN_OR_RETURN(server->scheduler_,
                         CompletionScheduler::Create(model, scheduler, &server->metrics_));
  server->Routes();
  httplib::Server& http = *server->http_;
  server->port_ = BindHttpServer(http, options.host, options.port);
  if (server->port_ < 0) {
    return Status::Unavailable("cannot listen on " + options.host + ":" +
                               std::to_string(options.port) + " (in use, or not this host's)");
  }
  server->listener_ = std::thread([&http] { http.listen_after_bind(); });
  return server;
}

CompletionServer::CompletionServer(trainer::GptModel* model, const data::Tokenizer* tokenizer,
                                   const ServeOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      limits_({.context = model->config().max_position_embeddings,
               .max_tokens = options.max_tokens > 0 ? options.max_tokens
                                                    : model->config().max_position_embeddings,
               .vocab_size = tokenizer->vocab_size()}),
      http_(std::make_unique<httplib::Server>()) {}

CompletionServer::~CompletionServer() { Stop(); }

void CompletionServer::Stop() {
  // The scheduler first: it fails every waiting handler, so the HTTP
  // threads are free when the server joins them.
  if (scheduler_) scheduler_->Shutdown();
  http_->stop();
  if (listener_.joinable()) listener_.join();
}

void CompletionServer::Routes() {
  httplib::Server& http = *http_;
  // A handler thread per connection; each running or queued request holds
  // one while it waits, so there are enough for all of them plus the
  // probes (/health, /metrics) and the requests refused with 503.
  const size_t threads = options_.scheduler.max_batch + options_.scheduler.max_queue + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(1 << 20);

  // httplib's own refusals (no such route 404, body over the limit 413) in
  // the same JSON shape as ours.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string what = res.status == 404 ? "no endpoint " + req.method + " " + req.path +
                                                     " (POST /v1/completions, GET /health, "
                                                     "GET /metrics)"
                                               : "the request was refused";
    res.set_content(ErrorBody(what, "invalid_request_error"), "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(nlohmann::json({{"status", "ok"},
                                    {"model", options_.model_name},
                                    {"context", model_->config().max_position_embeddings},
                                    {"max_batch", options_.scheduler.max_batch}})
                        .dump(),
                    "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.Text(), "text/plain; version=0.0.4");
  });

  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    const Clock::time_point arrival = Clock::now();
    auto reply_error = [&](const Status& status) {
      const int code = HttpStatus(status);
      metrics_.RequestDone(code);
      res.status = code;
      res.set_content(ErrorBody(status.message(), ErrorType(code)), "application/json");
    };
    Result<CompletionRequest> request = ParseCompletionRequest(req.body, *tokenizer_, limits_);
    if (!request.ok()) return reply_error(request.status());
    const uint64_t id = next_id_.fetch_add(1);
    if (!request->seed) request->seed = std::random_device{}() ^ (id * 0x9E3779B97F4A7C15ull);
    Result<std::shared_ptr<CompletionChannel>> channel = scheduler_->Submit(*request);
    if (!channel.ok()) return reply_error(channel.status());
    CompletionInfo info{.id = "cmpl-" + std::to_string(id),
                        .created = UnixSeconds(),
                        .model = options_.model_name,
                        .prompt_tokens = static_cast<int64_t>(request->prompt.size())};
    auto generation = std::make_shared<Generation>(*channel, tokenizer_, &metrics_, arrival,
                                                   arrival + options_.request_timeout);
    if (!request->stream) {
      std::string text;
      while (!generation->finish()) {
        Result<std::string> piece = generation->Next(options_.request_timeout);
        if (!piece.ok()) return reply_error(piece.status());
        text += *piece;
      }
      metrics_.RequestDone(200);
      res.set_content(
          CompletionBody(info, text, *generation->finish(), generation->completion_tokens()),
          "application/json");
      return;
    }
    // Streamed: this thread writes each piece as it comes. A write that
    // fails means the client went away: the sequence is cancelled.
    res.set_header("Cache-Control", "no-cache");
    auto finished = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, info, generation, finished](size_t, httplib::DataSink& sink) {
          Result<std::string> piece = generation->Next(kStreamPoll);
          if (!piece.ok()) {
            // Headers are gone already: the error travels as an event.
            const int code = HttpStatus(piece.status());
            metrics_.RequestDone(code);
            *finished = true;
            const std::string event =
                "data: " + ErrorBody(piece.status().message(), ErrorType(code)) + "\n\n";
            sink.write(event.data(), event.size());
            sink.done();
            return true;
          }
          // Nothing new this poll: an SSE comment, which clients ignore, so a
          // client that went away is noticed (the write fails) even while
          // its request waits in the queue.
          const std::string event = piece->empty() && !generation->finish()
                                        ? std::string(kKeepAliveEvent)
                                        : CompletionChunkEvent(info, *piece, generation->finish(),
                                                               generation->completion_tokens());
          if (!sink.write(event.data(), event.size())) return false;
          if (generation->finish()) {
            metrics_.RequestDone(200);
            *finished = true;
            sink.write(kStreamDoneEvent.data(), kStreamDoneEvent.size());
            sink.done();
          }
          return true;
        },
        [this, generation, finished](bool) {
          if (*finished) return;
          generation->Cancel();
          metrics_.RequestDone(499);  // the client closed the connection
        });
  });
}

// ---- the program ------------------------------------------------------------------

namespace {

ProgramHelp ServeHelp() {
  return {
      "gpt_serve -c CONFIG [-o Section.key=value ...] --checkpoint DIR [--port P] [flags]",
      "Serves completions from a checkpoint gpt_pretrain saved over HTTP "
      "(POST /v1/completions, GET /health, GET /metrics; see examples/gpt/README.md).",
      {{"What to serve",
        {{"-c", "FILE", "the config the checkpoint was trained with (required)", ""},
         {"-o", "Section.key=value", "override one key of the config (repeatable)", ""},
         {"--checkpoint", "DIR", "gpt_pretrain's Engine.save_load.output_dir (required)", ""},
         {"--device", "cpu|cuda:K", "where to run", "Global.device of the config"},
         {"--threads", "N", "CPU threads", "the machine's cores"},
         {"--model_name", "NAME", "the \"model\" of responses", "gpt"}}},
       {"Server",
        {{"--host", "ADDR", "address to listen on (no authentication: keep it local)", "127.0.0.1"},
         {"--port", "P", "port to listen on (0: a free one, printed)", "8000"},
         {"--max_batch", "N", "sequences decoded together (KV cache slots)", "16"},
         {"--max_queue", "N", "requests waiting for a slot before 503", "64"},
         {"--max_tokens", "N", "largest max_tokens of a request (0: the context)", "0"},
         {"--request_timeout_s", "S", "a request not done by then gets 504", "600"}}}},
      ""};
}

struct Flags {
  std::string config;
  std::vector<std::string> overrides;
  std::string checkpoint, device;
  int threads = 0;
  ServeOptions serve;
  bool help = false;
};

Result<Flags> ParseFlags(const std::vector<std::string>& args) {
  FLEET_ASSIGN_OR_RETURN(ConfigArgs config_args, ParseConfigArgs(args));
  Flags f;
  f.config = config_args.config;
  f.overrides = config_args.overrides;
  // Each flag and where its value goes; integers with their range.
  const std::map<std::string, std::string*> text_flags = {{"checkpoint", &f.checkpoint},
                                                          {"device", &f.device},
                                                          {"model_name", &f.serve.model_name},
                                                          {"host", &f.serve.host}};
  struct IntegerFlag {
    int64_t value, min, max;
  };
  std::map<std::string, IntegerFlag> integer_flags = {
      {"threads", {0, 1, 4096}},       {"port", {8000, 0, 65535}},
      {"max_batch", {16, 1, 4096}},    {"max_queue", {64, 1, 1 << 20}},
      {"max_tokens", {0, 0, 1 << 30}}, {"request_timeout_s", {600, 1, 7 * 24 * 3600}}};
  FLEET_ASSIGN_OR_RETURN(ProgramFlags flags,
                         ParseProgramFlags(config_args.rest, [&](std::string_view name) {
                           const std::string key(name);
                           return text_flags.count(key) > 0 || integer_flags.count(key) > 0;
                         }));
  f.help = flags.help;
  for (const auto& [name, value] : flags.values) {
    if (auto text = text_flags.find(name); text != text_flags.end()) {
      *text->second = value;
      continue;
    }
    IntegerFlag& flag = integer_flags.at(name);
    if (!absl::SimpleAtoi(value, &flag.value) || flag.value < flag.min || flag.value > flag.max) {
      return Status::InvalidArgument("--" + name + " must be an integer in [" +
                                     std::to_string(flag.min) + ", " + std::to_string(flag.max) +
                                     "], got \"" + value + "\"");
    }
  }
  f.threads = static_cast<int>(integer_flags["threads"].value);
  f.serve.port = static_cast<int>(integer_flags["port"].value);
  f.serve.scheduler.max_batch = static_cast<int>(integer_flags["max_batch"].value);
  f.serve.scheduler.max_queue = static_cast<int>(integer_flags["max_queue"].value);
  f.serve.max_tokens = integer_flags["max_tokens"].value;
  f.serve.request_timeout = std::chrono::seconds(integer_flags["request_timeout_s"].value);
  if (f.help) return f;
  if (f.config.empty()) return Status::InvalidArgument("-c CONFIG is required (see --help)");
  if (f.checkpoint.empty()) return Status::InvalidArgument("--checkpoint DIR is required");
  return f;
}

}  // namespace

int GptServeMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Result<Flags> flags = ParseFlags(args);
  if (!flags.ok()) {
    err << "gpt_serve: " << flags.status().ToString() << "\n";
    return 2;
  }
  if (flags->help) {
    out << FormatProgramHelp(ServeHelp());
    return 0;
  }
  // Before any thread exists (see StopSignalWatcher).
  std::mutex mu;
  std::condition_variable stop_cv;
  bool stop = false;
  StopSignalWatcher signals([&](int) {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    stop_cv.notify_all();
  });

  Result<trainer::config::GptJobConfig> config =
      trainer::config::LoadGptJobConfig(flags->config, flags->overrides);
  if (!config.ok()) {
    err << "gpt_serve: " << config.status().ToString() << "\n";
    return 2;
  }
  auto fail = [&](const Status& status) {
    err << "gpt_serve: " << status.ToString() << "\n";
    return 1;
  };
  Result<InferenceCompute> compute =
      CreateInferenceCompute(*config, flags->device, flags->threads, "gpt_serve", err);
  if (!compute.ok()) return fail(compute.status());
  Result<std::unique_ptr<data::Tokenizer>> tokenizer =
      data::OpenConfiguredTokenizer(config->data.train.dataset);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  Result<std::unique_ptr<trainer::GptModel>> model =
      LoadGptModel(*config, flags->checkpoint, &compute->compute);
  if (!model.ok()) return fail(model.status());
  Result<std::unique_ptr<CompletionServer>> server =
      CompletionServer::Start(model->get(), tokenizer->get(), flags->serve);
  if (!server.ok()) return fail(server.status());
  err << "gpt_serve: listening on http://" << flags->serve.host << ":" << (*server)->port()
      << " (device " << compute->device << ", max_batch " << flags->serve.scheduler.max_batch << ")"
      << std::endl;
  {
    // Serving until a signal: nothing else is awaited, so no deadline.
    std::unique_lock<std::mutex> lock(mu);
    stop_cv.wait(lock, [&] { return stop; });
  }
  err << "gpt_serve: stopping" << std::endl;
  (*server)->Stop();
  return 0;
}

}  // namespace fleet::examples::gpt
