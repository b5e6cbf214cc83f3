// Status: the outcome of anything that touches the outside world (a socket,
// a file, a flag, a config). Codes are the ones a caller acts on; the message
// says what failed and which thing (key, file, endpoint, rank) it was.
//
// Thread safety: a Status is a value; distinct objects may be used from
// distinct threads without locking.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <glog/logging.h>

namespace fleet {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // the caller sent something malformed; retrying won't help
  kNotFound = 2,         // a key, table, file or peer that does not exist
  kCorruption = 3,       // stored or received bytes fail a checksum or format check
  kIOError = 4,          // the OS refused a read, write, sync or rename
  kTimeout = 5,          // a wait passed its deadline
  kUnavailable = 6,      // a peer is down or unreachable; may work later
  kFailedPrecondition = 7,  // the object is in a state that forbids the call
  kInternal = 8,         // a bug or an error the callee could not classify
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status OK() { return Status(); }
  // Each factory joins "what" and "which" as "what: which".
  static Status InvalidArgument(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kInvalidArgument, what, which);
  }
  static Status NotFound(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kNotFound, what, which);
  }
  static Status Corruption(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kCorruption, what, which);
  }
  static Status IOError(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kIOError, what, which);
  }
  static Status Timeout(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kTimeout, what, which);
  }
  static Status Unavailable(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kUnavailable, what, which);
  }
  static Status FailedPrecondition(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kFailedPrecondition, what, which);
  }
  static Status Internal(std::string_view what, std::string_view which = {}) {
    return Status(StatusCode::kInternal, what, which);
  }
  // Rebuilds a status that travelled over the wire. An unknown code becomes
  // kInternal so a newer peer cannot make us misclassify its error.
  static Status FromWire(int code, std::string message);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  bool IsInvalidArgument() const { return code_ == StatusCode::kInvalidArgument; }
  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }
  bool IsCorruption() const { return code_ == StatusCode::kCorruption; }
  bool IsIOError() const { return code_ == StatusCode::kIOError; }
  bool IsTimeout() const { return code_ == StatusCode::kTimeout; }
  bool IsUnavailable() const { return code_ == StatusCode::kUnavailable; }

  // Same code, message prefixed with context: "context: message".
  Status WithContext(std::string_view context) const;

  // "OK" or "Timeout: pull_sparse table 3 from tcp://10.0.0.2:7000 after 5000 ms".
  std::string ToString() const;

 private:
  Status(StatusCode code, std::string_view what, std::string_view which);

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    CHECK(!status_.ok()) << "Result built from an OK status without a value";
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & {
    CHECK(ok()) << status_.ToString();
    return *value_;
  }
  const T& value() const& {
    CHECK(ok()) << status_.ToString();
    return *value_;
  }
  T&& value() && {
    CHECK(ok()) << status_.ToString();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace fleet

// Returns from the enclosing function when `expr` yields a non-OK Status.
#define FLEET_RETURN_IF_ERROR(expr)          \
  do {                                       \
    ::fleet::Status _fleet_st = (expr);      \
    if (!_fleet_st.ok()) return _fleet_st;   \
  } while (0)

#define FLEET_CONCAT_INNER(a, b) a##b
#define FLEET_CONCAT(a, b) FLEET_CONCAT_INNER(a, b)
// FLEET_ASSIGN_OR_RETURN(auto x, MakeX()); returns the Status on error.
#define FLEET_ASSIGN_OR_RETURN(lhs, expr) \
  FLEET_ASSIGN_OR_RETURN_IMPL(FLEET_CONCAT(_fleet_res_, __LINE__), lhs, expr)
#define FLEET_ASSIGN_OR_RETURN_IMPL(res, lhs, expr) \
  auto res = (expr);                                \
  if (!res.ok()) return res.status();               \
  lhs = std::move(res).value()
