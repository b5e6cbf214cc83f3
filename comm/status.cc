#include "comm/status.h"

namespace fleet {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "Invalid argument";
    case StatusCode::kNotFound: return "Not found";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kIOError: return "IO error";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kFailedPrecondition: return "Failed precondition";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string_view what, std::string_view which) : code_(code) {
  message_.assign(what);
  if (!which.empty()) {
    message_.append(": ");
    message_.append(which);
  }
}

Status Status::FromWire(int code, std::string message) {
  if (code == 0) return Status();
  StatusCode c = StatusCode::kInternal;
  if (code > 0 && code <= static_cast<int>(StatusCode::kInternal)) c = static_cast<StatusCode>(code);
  return Status(c, message, {});
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string joined(context);
  joined.append(": ");
  joined.append(message_);
  return Status(code_, joined, {});
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s.append(": ");
  s.append(message_);
  return s;
}

}  // namespace fleet
