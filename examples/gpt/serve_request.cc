#include "examples/gpt/serve_request.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

namespace fleet::examples::gpt {
namespace {

using nlohmann::json;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the UTF-8 character at bytes[0] (1 to 4), 0 when bytes[0]
// cannot start one or a later byte breaks it (the first byte is then
// invalid on its own), -1 when bytes end before the character does but
// every byte so far fits. Follows RFC 3629's table (no overlongs, no
// surrogates, nothing above U+10FFFF).
int CharLength(std::string_view bytes) {
  const auto b0 = static_cast<unsigned char>(bytes[0]);
  if (b0 < 0x80) return 1;
  int n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int i = 1; i < n; ++i) {
    if (static_cast<size_t>(i) >= bytes.size()) return -1;
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return n;
}

// Appends the valid UTF-8 of `bytes` to *out and returns how many bytes it
// used: all of them when `final`, else up to a character that may still be
// completed by later bytes.
size_t AppendValidUtf8(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = CharLength(bytes.substr(i));
    if (n > 0) {
      out->append(bytes.substr(i, n));
      i += n;
    } else if (n < 0 && !final) {
      break;
    } else {
      out->append(kReplacement);
      ++i;
    }
  }
  return i;
}

Status Bad(const std::string& what) { return Status::InvalidArgument(what); }

json Usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json Completion(const CompletionInfo& info, const std::string& text,
                std::optional<FinishReason> finish) {
  json choice = {{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (finish) choice["finish_reason"] = FinishReasonName(*finish);
  return {{"id", info.id},
          {"object", "text_completion"},
          {"created", info.created},
          {"model", info.model},
          {"choices", json::array({choice})}};
}

}  // namespace

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  AppendValidUtf8(bytes, /*final=*/true, &out);
  return out;
}

Result<std::string> Utf8Stream::Append(const std::vector<int32_t>& ids) {
  FLEET_ASSIGN_OR_RETURN(std::string bytes, tokenizer_->Decode(ids));
  pending_ += bytes;
  std::string out;
  pending_.erase(0, AppendValidUtf8(pending_, /*final=*/false, &out));
  return out;
}

std::string Utf8Stream::Finish() {
  std::string out = ToValidUtf8(pending_);
  pending_.clear();
  return out;
}

std::string_view FinishReasonName(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

Result<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                 const data::Tokenizer& tokenizer,
                                                 const CompletionLimits& limits) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    return Bad(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return Bad("the body must be a JSON object");
  CompletionRequest r;
  r.max_tokens = std::min<int64_t>(r.max_tokens, limits.max_tokens);  // OpenAI's 16, if allowed
  bool has_prompt = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "prompt") {
      has_prompt = true;
      if (value.is_string()) {
        r.prompt = tokenizer.Encode(value.get<std::string>());
      } else if (value.is_array()) {
        for (const json& id : value) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
              id.get<int64_t>() >= limits.vocab_size) {
            return Bad("prompt: a token id must be an integer in [0, " +
                       std::to_string(limits.vocab_size) + "), got " + id.dump());
          }
          r.prompt.push_back(id.get<int32_t>());
        }
      } else {
        return Bad("prompt must be a string or an array of token ids");
      }
    } else if (key == "max_tokens") {
      if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
          value.get<int64_t>() > limits.max_tokens) {
        return Bad("max_tokens must be an integer in [1, " + std::to_string(limits.max_tokens) +
                   "], got " + value.dump());
      }
      r.max_tokens = value.get<int64_t>();
    } else if (key == "temperature") {
      if (!value.is_number() || !(value.get<double>() >= 0 && value.get<double>() <= 2)) {
        return Bad("temperature must be a number in [0, 2], got " + value.dump());
      }
      r.temperature = value.get<double>();
    } else if (key == "top_k") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        return Bad("top_k must be an integer >= 0, got " + value.dump());
      }
      r.top_k = value.get<int64_t>();
    } else if (key == "top_p") {
      if (!value.is_number() || !(value.get<double>() > 0 && value.get<double>() <= 1)) {
        return Bad("top_p must be a number in (0, 1], got " + value.dump());
      }
      r.top_p = value.get<double>();
    } else if (key == "seed") {
      if (!value.is_number_unsigned()) {
        return Bad("seed must be an integer >= 0, got " + value.dump());
      }
      r.seed = value.get<uint64_t>();
    } else if (key == "stream") {
      if (!value.is_boolean()) return Bad("stream must be true or false, got " + value.dump());
      r.stream = value.get<bool>();
    } else if (key == "model") {
      if (!value.is_string()) return Bad("model must be a string, got " + value.dump());
      r.model = value.get<std::string>();
    } else {
      return Bad("unknown field \"" + key +
                 "\" (known: prompt, max_tokens, temperature, top_k, top_p, seed, stream, "
                 "model)");
    }
  }
  if (!has_prompt) return Bad("prompt is required");
  if (r.prompt.empty()) return Bad("the prompt has no tokens");
  if (r.prompt.size() > static_cast<size_t>(limits.context)) {
    return Bad("the prompt has " + std::to_string(r.prompt.size()) +
               " tokens, more than the model's context of " + std::to_string(limits.context));
  }
  return r;
}

std::string CompletionBody(const CompletionInfo& info, const std::string& text, FinishReason finish,
                           int64_t completion_tokens) {
  json j = Completion(info, text, finish);
  j["usage"] = Usage(info.prompt_tokens, completion_tokens);
  return j.dump();
}

std::string CompletionChunkEvent(const CompletionInfo& info, const std::string& text,
                                 std::optional<FinishReason> finish, int64_t completion_tokens) {
  json j = Completion(info, text, finish);
  if (finish) j["usage"] = Usage(info.prompt_tokens, completion_tokens);
  return "data: " + j.dump() + "\n\n";
}

std::string ErrorBody(std::string_view message, std::string_view type) {
  // A client's bytes may be echoed in the message: replace what is not UTF-8.
  return json{{"error", {{"message", ToValidUtf8(message)}, {"type", type}}}}.dump();
}

}  // namespace fleet::examples::gpt
