#include "serve/openai_api.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/numbers.h"
#include "serve/choice_text.h"

namespace fleet::serve {
namespace {

using nlohmann::json;

constexpr int kMaxN = 128;

Status Bad(const std::string& what) { return Status::InvalidArgument(what); }

Result<json> ParseObject(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("the body is not valid JSON");
  if (!j.is_object()) return Bad("the body must be a JSON object");
  return j;
}

Status Number(const std::string& key, const json& v, double lo, double hi, bool lo_open,
              double* out) {
  const bool ok = v.is_number() && (lo_open ? v.get<double>() > lo : v.get<double>() >= lo) &&
                  v.get<double>() <= hi;
  if (!ok) {
    return Bad(key + " must be a number in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
               json(hi).dump() + "], got " + v.dump());
  }
  *out = v.get<double>();
  return Status::OK();
}

Status Integer(const std::string& key, const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi ||
      (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))) {
    return Bad(key + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
               "], got " + v.dump());
  }
  *out = v.get<int64_t>();
  return Status::OK();
}

Status Boolean(const std::string& key, const json& v, bool* out) {
  if (!v.is_boolean()) return Bad(key + " must be true or false, got " + v.dump());
  *out = v.get<bool>();
  return Status::OK();
}

Status TextOf(const std::string& key, const json& v, std::string* out) {
  if (!v.is_string()) return Bad(key + " must be a string, got " + v.dump());
  *out = v.get<std::string>();
  return Status::OK();
}

// The keys both endpoints take, and what is checked across keys.
class CommonFields {
 public:
  explicit CommonFields(const ApiLimits& limits) : limits_(limits) {}

  // Reads `key` when it is one of the common ones; *known says whether.
  Status Read(const std::string& key, const json& v, GenerationRequest* r, bool* known) {
    *known = true;
    SamplingParams& s = r->sampling;
    if (key == "model") return TextOf(key, v, &r->model);
    if (key == "max_tokens" || key == "max_completion_tokens") {
      int64_t max = 0;
      FLEET_RETURN_IF_ERROR(Integer(key, v, 0, limits_.max_tokens, &max));
      max_tokens_ = max;
      return Status::OK();
    }
    if (key == "temperature") return Number(key, v, 0, 2, false, &s.temperature);
    if (key == "top_p") return Number(key, v, 0, 1, true, &s.top_p);
    if (key == "top_k") {
      FLEET_RETURN_IF_ERROR(Integer(key, v, -1, INT32_MAX, &s.top_k));
      s.top_k = std::max<int64_t>(s.top_k, 0);  // vLLM's -1: every token
      return Status::OK();
    }
    if (key == "presence_penalty") return Number(key, v, -2, 2, false, &s.presence_penalty);
    if (key == "frequency_penalty") return Number(key, v, -2, 2, false, &s.frequency_penalty);
    if (key == "n") {
      int64_t n = 1;
      FLEET_RETURN_IF_ERROR(Integer(key, v, 1, kMaxN, &n));
      r->n = static_cast<int>(n);
      return Status::OK();
    }
    if (key == "stream") return Boolean(key, v, &r->stream);
    if (key == "stream_options") {
      stream_options_ = true;
      if (!v.is_object()) return Bad("stream_options must be an object, got " + v.dump());
      for (const auto& [k, x] : v.items()) {
        if (k != "include_usage") return Bad("stream_options: unknown field \"" + k + "\"");
        if (!x.is_null())
          FLEET_RETURN_IF_ERROR(Boolean("stream_options.include_usage", x, &r->include_usage));
      }
      return Status::OK();
    }
    if (key == "stop") return Stops(v, &r->stop);
    if (key == "seed") {
      if (!v.is_number_integer()) return Bad("seed must be an integer, got " + v.dump());
      s.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
      r->has_seed = true;
      return Status::OK();
    }
    if (key == "user") {
      std::string user;
      return TextOf(key, v, &user);
    }
    if (key == "logit_bias") return LogitBias(v, &s.logit_bias);
    *known = false;
    return Status::OK();
  }

  // Reads every field of `body` (a JSON object) into *r: the common ones
  // here, the endpoint's own through `own` (which refuses the unknown);
  // a field given null is as if absent.
  Status ReadAll(std::string_view body, Endpoint endpoint, GenerationRequest* r,
                 const std::function<Status(const std::string&, const json&)>& own) {
    FLEET_ASSIGN_OR_RETURN(json j, ParseObject(body));
    r->endpoint = endpoint;
    for (const auto& [key, value] : j.items()) {
      if (value.is_null()) continue;
      bool known = false;
      FLEET_RETURN_IF_ERROR(Read(key, value, r, &known));
      if (!known) FLEET_RETURN_IF_ERROR(own(key, value));
    }
    return Status::OK();
  }

  // Checks across keys once every key is read; sets the defaults.
  Status Finish(GenerationRequest* r, int64_t default_max_tokens) {
    r->max_tokens = max_tokens_.value_or(default_max_tokens);
    if (stream_options_ && !r->stream) {
      return Bad("stream_options is only allowed when stream is true");
    }
    if (r->max_tokens == 0 && !r->echo) {
      return Bad("max_tokens must be >= 1 (0 only with echo: the prompt's log-probabilities)");
    }
    const int64_t choices = int64_t{r->n} * static_cast<int64_t>(r->prompts.size());
    if (choices > limits_.max_choices) {
      return Bad("n x prompts = " + std::to_string(choices) + " choices, more than this server " +
                 "queues at once (" + std::to_string(limits_.max_choices) + ", --max_queue)");
    }
    return Status::OK();
  }

 private:
  Status Stops(const json& v, std::vector<std::string>* out) {
    std::vector<json> items;
    if (v.is_string()) {
      items.push_back(v);
    } else if (v.is_array() && v.size() <= kMaxStops) {
      items.assign(v.begin(), v.end());
    } else {
      return Bad("stop must be a string or a list of up to " + std::to_string(kMaxStops) +
                 " strings, got " + v.dump());
    }
    for (const json& s : items) {
      if (!s.is_string() || s.get<std::string>().empty() ||
          s.get<std::string>().size() > kMaxStopBytes) {
        return Bad("stop: each must be a non-empty string of at most " +
                   std::to_string(kMaxStopBytes) + " bytes, got " + s.dump());
      }
      out->push_back(s.get<std::string>());
    }
    return Status::OK();
  }

  Status LogitBias(const json& v, std::vector<std::pair<int32_t, float>>* out) {
    if (!v.is_object()) return Bad("logit_bias must be an object of token id -> bias");
    for (const auto& [k, x] : v.items()) {
      int64_t id = -1;
      if (!absl::SimpleAtoi(k, &id) || id < 0 || id >= limits_.vocab_size) {
        return Bad("logit_bias: \"" + k + "\" is not a token id in [0, " +
                   std::to_string(limits_.vocab_size) + ")");
      }
      double bias = 0;
      FLEET_RETURN_IF_ERROR(Number("logit_bias[\"" + k + "\"]", x, -100, 100, false, &bias));
      out->push_back({static_cast<int32_t>(id), static_cast<float>(bias)});
    }
    return Status::OK();
  }

  const ApiLimits limits_;
  std::optional<int64_t> max_tokens_;
  bool stream_options_ = false;
};

Status CheckPrompt(const std::vector<int32_t>& prompt, const ApiLimits& limits, size_t which,
                   size_t count) {
  const std::string name = count > 1 ? "prompt " + std::to_string(which) : "the prompt";
  if (prompt.empty()) return Bad(name + " has no tokens");
  if (prompt.size() > static_cast<size_t>(limits.context)) {
    return Bad(name + " has " + std::to_string(prompt.size()) +
               " tokens, more than the model's context of " + std::to_string(limits.context));
  }
  return Status::OK();
}

Status TokenIds(const json& v, const ApiLimits& limits, std::vector<int32_t>* out) {
  for (const json& id : v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= limits.vocab_size) {
      return Bad("prompt: a token id must be an integer in [0, " +
                 std::to_string(limits.vocab_size) + "), got " + id.dump());
    }
    out->push_back(id.get<int32_t>());
  }
  return Status::OK();
}

// prompt: "text", ["text", ...], [ids], or [[ids], ...].
Status Prompts(const json& v, const data::Tokenizer& tokenizer, const ApiLimits& limits,
               std::vector<std::vector<int32_t>>* out) {
  const auto bad = [] {
    return Bad(
        "prompt must be a string, a list of strings, a list of token ids or a list of "
        "lists of token ids");
  };
  if (v.is_string()) {
    out->push_back(tokenizer.Encode(v.get<std::string>()));
  } else if (!v.is_array() || v.empty()) {
    return bad();
  } else if (v[0].is_number()) {
    out->emplace_back();
    FLEET_RETURN_IF_ERROR(TokenIds(v, limits, &out->back()));
  } else {
    for (const json& p : v) {
      if (p.is_string()) {
        out->push_back(tokenizer.Encode(p.get<std::string>()));
      } else if (p.is_array() && !p.empty() && p[0].is_number()) {
        out->emplace_back();
        FLEET_RETURN_IF_ERROR(TokenIds(p, limits, &out->back()));
      } else {
        return bad();
      }
    }
  }
  for (size_t i = 0; i < out->size(); ++i) {
    FLEET_RETURN_IF_ERROR(CheckPrompt((*out)[i], limits, i, out->size()));
  }
  return Status::OK();
}

// A message's content: a string, or a list of {"type": "text", "text"}.
Status Content(const std::string& where, const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return Status::OK();
  }
  if (!v.is_array()) return Bad(where + ".content must be a string or a list of text parts");
  for (const json& part : v) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return Bad(where +
                 ".content: only {\"type\": \"text\", \"text\": ...} parts are served, got " +
                 part.dump());
    }
    *out += part["text"].get<std::string>();
  }
  return Status::OK();
}

Status Messages(const json& v, std::vector<ChatMessage>* out) {
  if (!v.is_array() || v.empty()) return Bad("messages must be a non-empty list");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) return Bad(where + " must be an object");
    ChatMessage msg;
    bool has_content = false;
    for (const auto& [k, x] : m.items()) {
      if (k == "role") {
        FLEET_RETURN_IF_ERROR(TextOf(where + ".role", x, &msg.role));
      } else if (k == "content") {
        if (x.is_null()) continue;
        has_content = true;
        FLEET_RETURN_IF_ERROR(Content(where, x, &msg.content));
      } else if (k == "name") {
        std::string name;
        FLEET_RETURN_IF_ERROR(TextOf(where + ".name", x, &name));
      } else if (k == "refusal") {
        if (!x.is_null()) return Bad(where + ".refusal is not served");
      } else if ((k == "tool_calls" && (x.is_null() || (x.is_array() && x.empty()))) ||
                 (k == "function_call" && x.is_null())) {
        continue;
      } else {
        return Bad(where + ": unknown or unsupported field \"" + k +
                   "\" (known: role, content, name; this server calls no tools)");
      }
    }
    if (msg.role.empty()) return Bad(where + ".role is required");
    if (!has_content) return Bad(where + ".content is required");
    out->push_back(std::move(msg));
  }
  return Status::OK();
}

// ---- response JSON ----

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json Bytes(const std::string& bytes) {
  json out = json::array();
  for (char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

json LogprobsJson(Endpoint endpoint, const std::vector<LogprobEntry>& entries) {
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const LogprobEntry& e : entries) {
      json top = json::array();
      for (const LogprobToken& t : e.top) {
        top.push_back(
            {{"token", ToValidUtf8(t.bytes)}, {"logprob", t.logprob}, {"bytes", Bytes(t.bytes)}});
      }
      content.push_back({{"token", ToValidUtf8(e.chosen.bytes)},
                         {"logprob", e.chosen.logprob},
                         {"bytes", Bytes(e.chosen.bytes)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       offsets = json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(TokenDisplay(e.chosen.bytes));
    offsets.push_back(e.text_offset);
    if (!e.has_logprob) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(e.chosen.logprob);
    json top = json::object();
    for (const LogprobToken& t : e.top) top[TokenDisplay(t.bytes)] = t.logprob;
    top_logprobs.push_back(top);
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", offsets}};
}

json Envelope(const ResponseInfo& info, bool chunk) {
  const bool chat = info.endpoint == Endpoint::kChat;
  return {
      {"id", info.id},
      {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
      {"created", info.created},
      {"model", info.model}};
}

json ChoiceJson(const ResponseInfo& info, const ChoiceOutput& c, bool chunk, bool opening) {
  json choice = {{"index", c.index}};
  if (info.endpoint == Endpoint::kChat) {
    if (!chunk) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    } else {
      json delta = json::object();
      if (opening) delta["role"] = "assistant";
      if (opening || !c.text.empty()) delta["content"] = c.text;
      choice["delta"] = delta;
    }
  } else {
    choice["text"] = c.text;
  }
  choice["logprobs"] = c.has_logprobs ? LogprobsJson(info.endpoint, c.logprobs) : json(nullptr);
  choice["finish_reason"] = c.finish ? json(FinishReasonName(*c.finish)) : json(nullptr);
  return choice;
}

}  // namespace

Result<GenerationRequest> ParseCompletionRequest(std::string_view body,
                                                 const data::Tokenizer& tokenizer,
                                                 const ApiLimits& limits) {
  GenerationRequest r;
  CommonFields common(limits);
  bool has_prompt = false;
  std::optional<int64_t> best_of;
  FLEET_RETURN_IF_ERROR(common.ReadAll(
      body, Endpoint::kCompletions, &r, [&](const std::string& key, const json& value) -> Status {
        if (key == "prompt") {
          has_prompt = true;
          return Prompts(value, tokenizer, limits, &r.prompts);
        }
        if (key == "echo") return Boolean(key, value, &r.echo);
        if (key == "logprobs") {
          int64_t top = 0;
          FLEET_RETURN_IF_ERROR(Integer(key, value, 0, kMaxTopLogprobs, &top));
          r.sampling.top_logprobs = static_cast<int>(top);
          return Status::OK();
        }
        if (key == "suffix") {
          if (value != "")
            return Bad("suffix is not served (insertion needs a model trained for it)");
          return Status::OK();
        }
        if (key == "best_of") return Integer(key, value, 1, kMaxN, &best_of.emplace());
        return Bad("unknown field \"" + key +
                   "\" (known: prompt, model, max_tokens, temperature, top_p, top_k, n, stream, "
                   "stream_options, stop, echo, logprobs, presence_penalty, frequency_penalty, "
                   "logit_bias, seed, user, suffix, best_of)");
      }));
  if (!has_prompt) return Bad("prompt is required");
  if (best_of && *best_of != r.n) {
    return Bad("best_of must equal n (" + std::to_string(r.n) +
               "): this server returns every sequence it generates");
  }
  // OpenAI's default of 16, or the server's limit when lower.
  FLEET_RETURN_IF_ERROR(common.Finish(&r, std::min<int64_t>(16, limits.max_tokens)));
  return r;
}

Result<GenerationRequest> ParseChatRequest(std::string_view body, const data::Tokenizer& tokenizer,
                                           const ChatTemplate& chat, const ApiLimits& limits) {
  GenerationRequest r;
  CommonFields common(limits);
  std::vector<ChatMessage> messages;
  bool logprobs = false, has_top = false, has_messages = false;
  FLEET_RETURN_IF_ERROR(common.ReadAll(
      body, Endpoint::kChat, &r, [&](const std::string& key, const json& value) -> Status {
        if (key == "messages") {
          has_messages = true;
          return Messages(value, &messages);
        }
        if (key == "logprobs") return Boolean(key, value, &logprobs);
        if (key == "top_logprobs") {
          has_top = true;
          int64_t top = 0;
          FLEET_RETURN_IF_ERROR(Integer(key, value, 0, kMaxTopLogprobs, &top));
          r.sampling.top_logprobs = static_cast<int>(top);
          return Status::OK();
        }
        if (key == "response_format") {
          if (!value.is_object() || value.value("type", "") != "text") {
            return Bad("response_format: only {\"type\": \"text\"} is served, got " + value.dump());
          }
          return Status::OK();
        }
        if (key == "tools" || key == "functions") {
          if (!value.is_array() || !value.empty()) return Bad(key + ": this server calls no tools");
          return Status::OK();
        }
        if (key == "tool_choice" || key == "function_call") {
          if (value != "none" && value != "auto") return Bad(key + ": this server calls no tools");
          return Status::OK();
        }
        if (key == "parallel_tool_calls") {
          bool unused = false;
          return Boolean(key, value, &unused);
        }
        if (key == "store") {
          if (value != false) return Bad("store: this server keeps no completions");
          return Status::OK();
        }
        if (key == "metadata") {
          if (!value.is_object()) return Bad("metadata must be an object");
          return Status::OK();
        }
        if (key == "service_tier") {
          std::string unused;
          return TextOf(key, value, &unused);
        }
        return Bad("unknown field \"" + key +
                   "\" (known: messages, model, max_tokens, max_completion_tokens, temperature, "
                   "top_p, top_k, n, stream, stream_options, stop, logprobs, top_logprobs, "
                   "presence_penalty, frequency_penalty, logit_bias, seed, user, response_format, "
                   "tools, tool_choice, parallel_tool_calls, store, metadata, service_tier)");
      }));
  if (!has_messages) return Bad("messages is required");
  if (has_top && !logprobs) return Bad("top_logprobs needs logprobs: true");
  if (logprobs && !has_top) r.sampling.top_logprobs = 0;
  if (!logprobs) r.sampling.top_logprobs = -1;
  FLEET_ASSIGN_OR_RETURN(std::string prompt, chat.Render(messages));
  r.prompts.push_back(tokenizer.Encode(prompt));
  FLEET_RETURN_IF_ERROR(CheckPrompt(r.prompts[0], limits, 0, 1));
  if (!chat.stop().empty()) r.stop.push_back(chat.stop());
  // No max_tokens: until the reply ends or the context (or --max_tokens) is full.
  FLEET_RETURN_IF_ERROR(common.Finish(&r, limits.max_tokens));
  return r;
}

std::string ResponseBody(const ResponseInfo& info, const std::vector<ChoiceOutput>& choices,
                         const Usage& usage) {
  json j = Envelope(info, /*chunk=*/false);
  json list = json::array();
  for (const ChoiceOutput& c : choices) list.push_back(ChoiceJson(info, c, false, false));
  j["choices"] = list;
  j["usage"] = UsageJson(usage);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ChunkEvent(const ResponseInfo& info, const ChoiceOutput& choice, bool opening,
                       bool include_usage) {
  json j = Envelope(info, /*chunk=*/true);
  j["choices"] = json::array({ChoiceJson(info, choice, true, opening)});
  if (include_usage) j["usage"] = nullptr;
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string UsageEvent(const ResponseInfo& info, const Usage& usage) {
  json j = Envelope(info, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return "data: " + j.dump() + "\n\n";
}

std::string ErrorBody(std::string_view message, std::string_view type, std::string_view param,
                      std::string_view code) {
  // A client's bytes may be echoed in the message: replace what is not UTF-8.
  return json{{"error",
               {{"message", ToValidUtf8(message)},
                {"type", type},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? json(nullptr) : json(code)}}}}
      .dump();
}

std::string ErrorEvent(std::string_view message, std::string_view type) {
  return "data: " + ErrorBody(message, type) + "\n\n";
}

std::string ModelsBody(const std::vector<std::string>& ids, int64_t created) {
  json data = json::array();
  for (const std::string& id : ids) data.push_back(json::parse(ModelBody(id, created)));
  return json{{"object", "list"}, {"data", data}}.dump();
}

std::string ModelBody(const std::string& id, int64_t created) {
  return json{{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "fleetps"}}
      .dump();
}

}  // namespace fleet::serve
