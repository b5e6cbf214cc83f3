// gpt_serve's request and response bodies, in the shape of OpenAI's
// /v1/completions (JSON, nlohmann-json):
//
//   request:  {"prompt": "text" | [ids], "max_tokens": 16, "temperature": 1,
//              "top_k": 0, "top_p": 1, "seed": 7, "stream": false,
//              "model": "..."}   (every key but prompt optional)
//   response: {"id", "object": "text_completion", "created", "model",
//              "choices": [{"text", "index": 0, "logprobs": null,
//                           "finish_reason": "length" | "stop"}],
//              "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
//   stream:   the same object per chunk with the new text (finish_reason
//             null until the last chunk, which carries it and usage), each
//             as a server-sent event "data: {...}\n\n", then "data: [DONE]\n\n";
//             while nothing is generated, a comment ": keep-alive\n\n" every
//             250 ms (clients skip comments; a failed write tells the server
//             the client left).
//   error:    {"error": {"message", "type"}} with a 4xx or 5xx status.
//
// Text is what the tokenizer's bytes say, as UTF-8: a byte that is not part
// of a valid UTF-8 character becomes U+FFFD. A stream holds back a
// character whose bytes are not all generated yet, so the chunks' texts
// joined equal the non-streamed text of the same tokens.
//
// Thread-safe: plain functions and values; Utf8Stream is one request's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "data/tokenizer.h"

namespace fleet::examples::gpt {

struct CompletionLimits {
  int context = 0;         // Model.max_position_embeddings
  int64_t max_tokens = 0;  // largest max_tokens accepted (--max_tokens)
  int32_t vocab_size = 0;  // ids of a token-id prompt are in [0, vocab_size)
};

struct CompletionRequest {
  std::vector<int32_t> prompt;   // token ids, 1..context of them
  int64_t max_tokens = 16;       // [1, CompletionLimits::max_tokens]; absent: 16 or that limit
  double temperature = 1.0;      // [0, 2]; 0 picks the most likely token (greedy)
  int64_t top_k = 0;             // >= 0; 0: every token
  double top_p = 1.0;            // (0, 1]
  std::optional<uint64_t> seed;  // absent: the server draws one
  bool stream = false;
  std::string model;  // echoed back; the server serves one model whatever it says
};

// Parses and checks a request body. InvalidArgument with a message for the
// client for malformed JSON, a body that is not an object, an unknown key, a
// value of the wrong type or out of range (naming the key), an empty
// prompt, one longer than the context, or an id out of range.
Result<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                 const data::Tokenizer& tokenizer,
                                                 const CompletionLimits& limits);

enum class FinishReason { kLength, kStop };
std::string_view FinishReasonName(FinishReason reason);  // "length", "stop"

// What a response carries besides the text.
struct CompletionInfo {
  std::string id;       // "cmpl-<n>"
  int64_t created = 0;  // unix seconds
  std::string model;
  int64_t prompt_tokens = 0;
};

// The non-streamed response body.
std::string CompletionBody(const CompletionInfo& info, const std::string& text, FinishReason finish,
                           int64_t completion_tokens);
// One server-sent event "data: {...}\n\n" of a stream: `text` new since the
// last chunk; `finish` (with usage) only on the last one.
std::string CompletionChunkEvent(const CompletionInfo& info, const std::string& text,
                                 std::optional<FinishReason> finish, int64_t completion_tokens);
inline constexpr std::string_view kStreamDoneEvent = "data: [DONE]\n\n";
// {"error": {"message": ..., "type": ...}}.
std::string ErrorBody(std::string_view message, std::string_view type);

// Turns generated token ids into UTF-8 text piece by piece.
class Utf8Stream {
 public:
  explicit Utf8Stream(const data::Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  // Appends `ids`' bytes and returns the text that is now complete (whole
  // characters; invalid bytes as U+FFFD). Errors: the tokenizer's Decode.
  Result<std::string> Append(const std::vector<int32_t>& ids);
  // The text of the bytes held back (an unfinished character, as U+FFFD).
  std::string Finish();

 private:
  const data::Tokenizer* tokenizer_;
  std::string pending_;  // bytes not yet returned
};

// `bytes` as valid UTF-8: each byte that does not belong to a valid
// character becomes U+FFFD. Utf8Stream's pieces joined equal this.
std::string ToValidUtf8(std::string_view bytes);

}  // namespace fleet::examples::gpt
