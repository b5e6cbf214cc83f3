#include "serve/choice_text.h"

#include <algorithm>
#include <cstdio>

namespace fleet::serve {
namespace {

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

}  // namespace

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  AppendValidUtf8(bytes, /*final=*/true, &out);
  return out;
}

std::string TokenDisplay(std::string_view bytes) {
  if (ToValidUtf8(bytes) == bytes) return std::string(bytes);
  std::string out = "bytes:";
  for (char c : bytes) {
    char hex[5];
    std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
    out += hex;
  }
  return out;
}

std::string Utf8Stream::Append(std::string_view bytes) {
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

ChoiceText::ChoiceText(const data::Tokenizer* tokenizer, std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {}

std::string_view ChoiceText::token_bytes(size_t i) const {
  const size_t start = i == 0 ? 0 : ends_[i - 1];
  return std::string_view(raw_).substr(start, ends_[i] - start);
}

size_t ChoiceText::TokensBefore(size_t offset) const {
  return std::upper_bound(ends_.begin(), ends_.end(), offset) - ends_.begin();
}

std::string ChoiceText::Release(size_t end, bool final) {
  std::string text = utf8_.Append(std::string_view(raw_).substr(sent_, end - sent_));
  sent_ = end;
  if (final) text += utf8_.Finish();
  return text;
}

Result<ChoiceText::Piece> ChoiceText::Append(std::span<const int32_t> tokens) {
  if (stopped_) return Piece{"", TokensBefore(sent_)};
  for (int32_t token : tokens) {
    FLEET_ASSIGN_OR_RETURN(std::string bytes, tokenizer_->Decode({&token, 1}));
    raw_ += bytes;
    ends_.push_back(raw_.size());
  }
  // A stop string can only start at or after sent_: bytes that might begin
  // one are never released.
  size_t first = std::string::npos;
  size_t length = 0;
  for (const std::string& stop : stops_) {
    const size_t at = raw_.find(stop, sent_);
    if (at < first) {
      first = at;
      length = stop.size();
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    cut_ = first;
    stop_end_ = first + length;
    Piece piece{Release(cut_, /*final=*/true), 0};
    piece.tokens = TokensBefore(cut_);
    return piece;
  }
  // Hold back the longest tail that begins some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, raw_.size() - sent_); n > hold; --n) {
      if (raw_.compare(raw_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  Piece piece{Release(raw_.size() - hold, /*final=*/false), 0};
  piece.tokens = TokensBefore(sent_ - utf8_.held());
  return piece;
}

ChoiceText::Piece ChoiceText::Finish() {
  Piece piece;
  const size_t end = stopped_ ? cut_ : raw_.size();
  if (!stopped_) piece.text = Release(end, /*final=*/true);
  // Every token with a byte before the cut (the last may straddle it).
  piece.tokens = end == 0 ? 0 : std::min(ends_.size(), TokensBefore(end - 1) + 1);
  return piece;
}

int64_t ChoiceText::tokens_used() const {
  if (!stopped_) return static_cast<int64_t>(ends_.size());
  return stop_end_ == 0
             ? 0
             : static_cast<int64_t>(std::min(ends_.size(), TokensBefore(stop_end_ - 1) + 1));
}

}  // namespace fleet::serve
