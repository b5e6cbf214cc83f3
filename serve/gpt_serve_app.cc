#include "serve/gpt_serve_app.h"

#include <condition_variable>
#include <map>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "collective/config/gpt_data.h"
#include "comm/http_server.h"
#include "comm/job_auth.h"
#include "comm/program_flags.h"
#include "comm/program_help.h"
#include "comm/stop_signal.h"
#include "comm/yaml_config.h"
#include "serve/inference.h"
#include "trainer/models/gpt_lora_files.h"

namespace fleet::serve {

Result<std::unique_ptr<CompletionServer>> CompletionServer::Start(
    trainer::GptModel* model, const data::Tokenizer* tokenizer, ChatTemplate chat,
    std::vector<ServedAdapter> adapters, const ServeOptions& options) {
  std::unique_ptr<CompletionServer> server(new CompletionServer);
  FLEET_ASSIGN_OR_RETURN(server->service_,
                         OpenAiService::Create(model, tokenizer, std::move(chat),
                                               std::move(adapters), options.service));
  FLEET_ASSIGN_OR_RETURN(
      server->http_,
      HttpBinding::Start(server->service_.get(), {.host = options.host, .port = options.port}));
  return server;
}

CompletionServer::~CompletionServer() { Stop(); }

void CompletionServer::Stop() {
  // The service first: it answers every waiting request before the server
  // closes the connections.
  if (service_) service_->Stop();
  if (http_) http_->Stop();
}

// ---- the program ------------------------------------------------------------------

namespace {

ProgramHelp ServeHelp() {
  return {
      "gpt_serve -c CONFIG [-o Section.key=value ...] --checkpoint DIR [--port P] [flags]",
      "Serves a checkpoint gpt_pretrain saved, and LoRA fine-tunes of it, over OpenAI's HTTP API "
      "(POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, "
      "GET /metrics; see examples/gpt/README.md).",
      {{"What to serve",
        {{"-c", "FILE", "the config the checkpoint was trained with (required)", ""},
         {"-o", "Section.key=value", "override one key of the config (repeatable)", ""},
         {"--checkpoint", "DIR", "gpt_pretrain's Engine.save_load.output_dir (required)", ""},
         {"--lora", "NAME=DIR",
          "also serve the LoRA output directory DIR over the checkpoint as model NAME "
          "(repeatable)",
          ""},
         {"--device", "cpu|cuda:K", "where to run", "Global.device of the config"},
         {"--threads", "N", "CPU threads", "the machine's cores"},
         {"--model_name", "NAME", "the checkpoint's model id", "gpt"}}},
       {"Server",
        {{"--host", "ADDR", "address to listen on (keep it local without --api_key_file)",
          "127.0.0.1"},
         {"--api_key_file", "FILE",
          "keys (one a line, file mode 600) every request but /health must send as "
          "Authorization: Bearer KEY",
          "none: no key needed"},
         {"--port", "P", "port to listen on (0: a free one, printed)", "8000"},
         {"--max_batch", "N", "sequences decoded together (KV cache slots)", "16"},
         {"--max_queue", "N", "sequences (prompts x n) waiting for a slot before 503", "64"},
         {"--max_tokens", "N", "largest max_tokens of a request (0: the context)", "0"},
         {"--request_timeout_s", "S", "a request not done by then gets 504", "600"}}}},
      ""};
}

struct Flags {
  std::string config;
  std::vector<std::string> overrides;
  std::string checkpoint, device, api_key_file;
  std::vector<std::pair<std::string, std::string>> loras;  // (name, dir)
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
  const std::map<std::string, std::string*> text_flags = {
      {"checkpoint", &f.checkpoint},
      {"device", &f.device},
      {"model_name", &f.serve.service.model_name},
      {"host", &f.serve.host},
      {"api_key_file", &f.api_key_file}};
  struct IntegerFlag {
    int64_t value, min, max;
  };
  std::map<std::string, IntegerFlag> integer_flags = {
      {"threads", {0, 1, 4096}},       {"port", {8000, 0, 65535}},
      {"max_batch", {16, 1, 4096}},    {"max_queue", {64, 1, 1 << 20}},
      {"max_tokens", {0, 0, 1 << 30}}, {"request_timeout_s", {600, 1, 7 * 24 * 3600}}};
  FLEET_ASSIGN_OR_RETURN(
      ProgramFlags flags, ParseProgramFlags(config_args.rest, [&](std::string_view name) {
        const std::string key(name);
        return key == "lora" || text_flags.count(key) > 0 || integer_flags.count(key) > 0;
      }));
  f.help = flags.help;
  for (const auto& [name, value] : flags.values) {
    if (name == "lora") {
      const size_t eq = value.find('=');
      if (eq == 0 || eq == std::string::npos || eq + 1 == value.size()) {
        return Status::InvalidArgument("--lora takes NAME=DIR, got \"" + value + "\"");
      }
      f.loras.emplace_back(value.substr(0, eq), value.substr(eq + 1));
      continue;
    }
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
  ServiceOptions& service = f.serve.service;
  service.scheduler.max_batch = static_cast<int>(integer_flags["max_batch"].value);
  service.scheduler.max_queue = static_cast<int>(integer_flags["max_queue"].value);
  service.max_tokens = integer_flags["max_tokens"].value;
  service.request_timeout = std::chrono::seconds(integer_flags["request_timeout_s"].value);
  if (f.help) return f;
  if (f.config.empty()) return Status::InvalidArgument("-c CONFIG is required (see --help)");
  if (f.checkpoint.empty()) return Status::InvalidArgument("--checkpoint DIR is required");
  return f;
}

// The keys of --api_key_file: one a line (surrounding blanks and empty
// lines ignored), the file readable by its owner alone.
Result<std::vector<std::string>> ReadApiKeys(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(std::string text, JobAuth::ReadSecretFile(path, "API key file"));
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) keys.emplace_back(line.data(), line.size());
  }
  if (keys.empty()) return Status::InvalidArgument("no key in it", "API key file '" + path + "'");
  return keys;
}

// The adapters of --lora, over the base at `checkpoint` (its weights'
// fingerprint read once).
Result<std::vector<std::unique_ptr<trainer::GptLoraAdapters>>> LoadAdapters(
    const Flags& flags, const trainer::GptConfig& base, trainer::Backend* backend) {
  std::vector<std::unique_ptr<trainer::GptLoraAdapters>> out;
  if (flags.loras.empty()) return out;
  FLEET_ASSIGN_OR_RETURN(std::string fingerprint, trainer::PretrainedFingerprint(flags.checkpoint));
  for (const auto& [name, dir] : flags.loras) {
    Result<std::unique_ptr<trainer::GptLoraAdapters>> a = trainer::LoadGptLoraAdapters(
        dir, base, "--checkpoint " + flags.checkpoint, fingerprint, backend);
    if (!a.ok()) return a.status().WithContext("--lora " + name + "=" + dir);
    out.push_back(std::move(*a));
  }
  return out;
}

}  // namespace

int GptServeMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Result<Flags> flags = ParseFlags(args);
  const std::optional<int> early = FlagsExitStatus(flags, "gpt_serve", ServeHelp(), out, err);
  if (early) return *early;
  // One descriptor a connection (comm/http_server.h).
  RaiseOpenFileLimit();
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
  Result<ChatTemplate> chat =
      config.ok() ? ChatTemplate::Load(config->document) : Result<ChatTemplate>(config.status());
  if (!chat.ok()) {
    err << "gpt_serve: " << chat.status().ToString() << "\n";
    return 2;
  }
  // The adapters bring their own rank, alpha and targets (their manifests):
  // the base is the config's model without them.
  if (!flags->loras.empty()) config->model.lora = {};
  auto fail = [&](const Status& status) {
    err << "gpt_serve: " << status.ToString() << "\n";
    return 1;
  };
  if (!flags->api_key_file.empty()) {
    Result<std::vector<std::string>> keys = ReadApiKeys(flags->api_key_file);
    if (!keys.ok()) return fail(keys.status());
    flags->serve.service.api_keys = std::move(*keys);
  }
  Result<InferenceCompute> compute =
      CreateInferenceCompute(*config, flags->device, flags->threads, "gpt_serve", err);
  if (!compute.ok()) return fail(compute.status());
  Result<std::unique_ptr<data::Tokenizer>> tokenizer =
      data::OpenConfiguredTokenizer(config->data.train.dataset);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  Result<std::unique_ptr<trainer::GptModel>> model =
      LoadGptModel(*config, flags->checkpoint, &compute->compute);
  if (!model.ok()) return fail(model.status());
  Result<std::vector<std::unique_ptr<trainer::GptLoraAdapters>>> adapters =
      LoadAdapters(*flags, config->model, compute->compute.backend.get());
  if (!adapters.ok()) return fail(adapters.status());
  std::vector<ServedAdapter> served;
  for (size_t i = 0; i < adapters->size(); ++i) {
    served.push_back({flags->loras[i].first, (*adapters)[i].get()});
  }
  ServeOptions& options = flags->serve;
  options.service.scheduler.sampling_pool = compute->compute.pool.get();
  Result<std::unique_ptr<CompletionServer>> server = CompletionServer::Start(
      model->get(), tokenizer->get(), std::move(*chat), std::move(served), options);
  if (!server.ok()) return fail(server.status());
  err << "gpt_serve: listening on http://" << options.host << ":" << (*server)->port()
      << " (device " << compute->device << ", max_batch " << options.service.scheduler.max_batch
      << ", models " << absl::StrJoin((*server)->service().model_ids(), ", ")
      << (options.service.api_keys.empty() ? ", no API key" : ", API key required") << ")"
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

}  // namespace fleet::serve
