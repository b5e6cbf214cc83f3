// OpenAI's API as gpt_serve speaks it: request bodies of /v1/completions and
// /v1/chat/completions parsed and checked into a GenerationRequest, and the
// response bodies and stream chunks built with OpenAI's field names and
// types, so that the official SDKs parse them without a warning.
//
// Requests (JSON; a key given null is as if absent):
//   both      model, max_tokens, temperature [0, 2] (0: greedy), top_p (0, 1],
//             top_k (>= 0, or -1: all; vLLM's), n [1, 128], stream,
//             stream_options {include_usage}, stop (a string or up to 4),
//             presence_penalty / frequency_penalty [-2, 2], logit_bias
//             {"token id": bias in [-100, 100]}, seed, user (accepted)
//   completions  prompt (a string, a list of strings, a list of token ids or
//             a list of such lists), echo, logprobs [0, 20], suffix (only
//             ""), best_of (only n)
//   chat      messages [{role: system | developer | user | assistant,
//             content: a string or [{type: "text", text}]}],
//             max_completion_tokens, logprobs (bool), top_logprobs [0, 20],
//             response_format {type: "text"}, tools / functions (only empty),
//             tool_choice ("none", "auto"), parallel_tool_calls, store (only
//             false), metadata, service_tier (accepted)
// Anything else, a value of the wrong type or out of range is refused
// (InvalidArgument naming the key, HTTP 400).
//
// Responses:
//   completion  {id "cmpl-N", object "text_completion", created, model,
//                choices [{index, text, logprobs, finish_reason}], usage}
//   chat        {id "chatcmpl-N", object "chat.completion", created, model,
//                choices [{index, message {role "assistant", content,
//                refusal null}, logprobs, finish_reason}], usage}
//   chunks      the same objects ("text_completion",
//                "chat.completion.chunk"), one choice each, as server-sent
//                events "data: {...}\n\n", then "data: [DONE]\n\n"; a chat
//                stream opens each choice with delta {role "assistant",
//                content ""}; finish_reason null until a choice's last
//                chunk; with include_usage every chunk has "usage": null and
//                a last chunk has "choices": [] and the usage.
//   logprobs    completions: {tokens, token_logprobs, top_logprobs [{token:
//                logprob}], text_offset}; chat: {content [{token, logprob,
//                bytes, top_logprobs [{token, logprob, bytes}]}], refusal}.
//   error       {"error": {message, type, param, code}}
//   models      {object "list", data [{id, object "model", created, owned_by}]}
//
// Choice order: prompt p's j-th choice has index p * n + j.
//
// Thread safety: plain functions and values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "data/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/sampling.h"
#include "serve/scheduler.h"

namespace fleet::serve {

enum class Endpoint { kCompletions, kChat };

struct ApiLimits {
  int context = 0;         // Model.max_position_embeddings
  int64_t max_tokens = 0;  // largest max_tokens accepted (--max_tokens)
  int32_t vocab_size = 0;  // the tokenizer's ids: [0, vocab_size)
  int max_choices = 0;     // n x prompts at most (the scheduler's queue)
};

inline constexpr int kMaxStops = 4;
inline constexpr size_t kMaxStopBytes = 256;

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model = {};  // as asked; empty when not given
  // Token ids of each prompt, 1..context of them.
  std::vector<std::vector<int32_t>> prompts = {};
  int n = 1;                           // choices per prompt
  int64_t max_tokens = 16;             // per choice; 0 only with echo
  SamplingParams sampling = {};        // seed: see has_seed
  bool has_seed = false;               // else the server draws one
  std::vector<std::string> stop = {};  // the request's, and the chat template's
  bool stream = false;
  bool include_usage = false;
  bool echo = false;  // completions: the prompt's text before the completion
};

// Parses and checks a /v1/completions body (limits above; text prompts
// encoded with `tokenizer`).
Result<GenerationRequest> ParseCompletionRequest(std::string_view body,
                                                 const data::Tokenizer& tokenizer,
                                                 const ApiLimits& limits);
// Parses and checks a /v1/chat/completions body; the messages become one
// prompt by `chat`, whose stop string joins the request's.
Result<GenerationRequest> ParseChatRequest(std::string_view body, const data::Tokenizer& tokenizer,
                                           const ChatTemplate& chat, const ApiLimits& limits);

// ---- responses -------------------------------------------------------------------

// What every body and chunk of one response carries.
struct ResponseInfo {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id = {};  // "cmpl-<n>" / "chatcmpl-<n>"
  int64_t created = 0;  // unix seconds
  std::string model = {};
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// One token as log-probabilities name it.
struct LogprobToken {
  std::string bytes = {};  // the token's bytes
  float logprob = 0;
};
struct LogprobEntry {
  LogprobToken chosen = {};
  bool has_logprob = true;  // false: the echoed prompt's first token (null)
  std::vector<LogprobToken> top = {};
  int64_t text_offset = 0;  // completions: where its text starts in `text`
};

struct ChoiceOutput {
  int index = 0;
  std::string text = {};
  std::vector<LogprobEntry> logprobs = {};
  bool has_logprobs = false;  // else "logprobs": null
  std::optional<FinishReason> finish = {};
};

// The non-streamed body.
std::string ResponseBody(const ResponseInfo& info, const std::vector<ChoiceOutput>& choices,
                         const Usage& usage);
// One chunk event of a stream: `choice`'s new text and log-probabilities
// (its finish on its last chunk). A chat stream's first chunk of a choice
// has `opening` set (the role). With include_usage, "usage": null.
std::string ChunkEvent(const ResponseInfo& info, const ChoiceOutput& choice, bool opening,
                       bool include_usage);
// The last chunk of an include_usage stream: no choices, the usage.
std::string UsageEvent(const ResponseInfo& info, const Usage& usage);
inline constexpr std::string_view kStreamDoneEvent = "data: [DONE]\n\n";
// What a stream sends while nothing is generated (an SSE comment, which
// clients skip), so a transport can notice a departed client.
inline constexpr std::string_view kKeepAliveEvent = ": keep-alive\n\n";

// {"error": {"message", "type", "param", "code"}}; param and code null when
// empty.
std::string ErrorBody(std::string_view message, std::string_view type, std::string_view param = {},
                      std::string_view code = {});
// The same object as a stream event (an error after the headers went out).
std::string ErrorEvent(std::string_view message, std::string_view type);

// GET /v1/models: `ids` served, owned by "fleetps".
std::string ModelsBody(const std::vector<std::string>& ids, int64_t created);
// GET /v1/models/{id}.
std::string ModelBody(const std::string& id, int64_t created);

}  // namespace fleet::serve
