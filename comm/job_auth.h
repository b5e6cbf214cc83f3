// JobAuth: the credentials of one job, all derived from one per-job secret,
// so every process that holds the secret computes the same keys and nothing
// is ever exchanged, published in the KV store or logged.
//
// From the secret (HKDF-SHA256, RFC 5869, OpenSSL's libcrypto; the labels
// below are the HKDF "info"):
//   "fleet curve server v1"  -> the job's ZeroMQ CURVE server keypair (every
//                               listening socket of the job uses it);
//   "fleet curve client v1"  -> the job's CURVE client keypair (every
//                               connecting socket); a server's ZAP handler
//                               admits exactly this public key;
//   "fleet kv hmac v1"       -> the HMAC-SHA256 key that signs KV store
//                               requests (KvRequestSigner below);
//   "fleet van mac v1"       -> the key the Van's greeting proves and its
//                               per-connection message keys come from
//                               (comm/van_auth.h).
// One keypair per side is enough: every process of a job is equally trusted,
// and anyone without the secret can compute neither secret key.
//
// Where the secret comes from (comm/cluster.h reads it): FLEET_JOB_SECRET in
// the environment (fleetrun sets it for its children) or a file
// (--job_secret_file) readable by its owner only. It must be at least
// kMinSecretChars characters; `openssl rand -hex 32` makes a good one.
//
// Thread safety: a JobAuth is immutable after construction; share it as
// std::shared_ptr<const JobAuth> between threads freely.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "comm/status.h"

namespace fleet {

// A CURVE keypair, both keys Z85-encoded (40 characters each), the form
// ZeroMQ's socket options take.
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

class JobAuth {
 public:
  static constexpr size_t kMinSecretChars = 32;

  // Derives the job's keys from `secret` (surrounding whitespace ignored).
  // InvalidArgument naming `source` (never the secret) when it is shorter
  // than kMinSecretChars.
  static Result<std::shared_ptr<const JobAuth>> FromSecret(std::string_view secret,
                                                           std::string_view source);

  // Reads the secret from `path`. Refuses (InvalidArgument, telling the user
  // to chmod 600) a file that group or others may read or write, NotFound /
  // IOError when it cannot be read, and what FromSecret refuses.
  static Result<std::shared_ptr<const JobAuth>> FromFile(const std::string& path);
  // The checks of FromFile, returning the file's text (for fleetrun, which
  // hands the secret on to its children, and gpt_serve's API keys). `what`
  // names the file in errors.
  static Result<std::string> ReadSecretFile(const std::string& path,
                                            std::string_view what = "job secret file");

  // A fresh random secret (32 bytes from the OS's CSPRNG, hex: 64
  // characters), what fleetrun makes for a job on one machine.
  // IOError when the random generator fails.
  static Result<std::string> RandomSecret();

  const CurveKeyPair& curve_server() const { return curve_server_; }
  const CurveKeyPair& curve_client() const { return curve_client_; }
  // The key KvRequestSigner uses (32 raw bytes).
  const std::string& kv_key() const { return kv_key_; }
  // The key comm/van_auth.h derives per-connection keys from (32 raw bytes).
  const std::string& van_key() const { return van_key_; }

 private:
  JobAuth() = default;
  CurveKeyPair curve_server_;
  CurveKeyPair curve_client_;
  std::string kv_key_;
  std::string van_key_;
};

// HKDF-SHA256 (RFC 5869): `length` (<= 255 * 32) bytes from input keying
// material `ikm`, `salt` and `info`. Exposed for its test vectors.
std::string HkdfSha256(std::string_view ikm, std::string_view salt, std::string_view info,
                       size_t length);

// The credential on a KV store request: the header
//   X-Fleet-Auth: v2 <unix ms> <nonce, 32 hex> <SHA-256 of the body, 64 hex>
//                 <HMAC-SHA256, 64 hex>
// where the HMAC, keyed with JobAuth::kv_key(), covers the method, the
// request target (path and query as sent), the timestamp, the nonce and the
// body's length and digest. So a server authenticates a request on its
// headers alone, before reading a byte of its body (a stranger's body is
// never read), and then checks the body against the digest. The server
// accepts a timestamp within `window` of its own clock and each nonce once
// (a replay inside the window is refused), so a captured request cannot be
// played again. Thread-safe.
class KvRequestSigner {
 public:
  static constexpr char kHeader[] = "X-Fleet-Auth";

  explicit KvRequestSigner(std::shared_ptr<const JobAuth> auth) : auth_(std::move(auth)) {}

  // The header value for one request (a fresh nonce each call).
  std::string Sign(std::string_view method, std::string_view target, std::string_view body) const;
  // The same with a given timestamp and nonce (for tests).
  std::string SignAt(std::string_view method, std::string_view target, std::string_view body,
                     int64_t unix_ms, std::string_view nonce) const;

  // Checks a header value against the request's method and target: format,
  // timestamp and HMAC. OK (with the nonce, whose reuse is the caller's
  // check) means the request comes from a holder of the job's secret, whose
  // body must still pass BodyMatches; else InvalidArgument with the reason
  // (malformed, stale timestamp with the clock difference, bad signature).
  Result<std::string> VerifyHead(std::string_view header, std::string_view method,
                                 std::string_view target, int64_t now_unix_ms,
                                 std::chrono::milliseconds window) const;
  // Whether `body` is the one a header that passed VerifyHead declared.
  static bool BodyMatches(std::string_view header, std::string_view body);
  // VerifyHead and BodyMatches together; `nonce` is set on OK.
  Status Verify(std::string_view header, std::string_view method, std::string_view target,
                std::string_view body, int64_t now_unix_ms, std::chrono::milliseconds window,
                std::string* nonce) const;

 private:
  std::shared_ptr<const JobAuth> auth_;
};

}  // namespace fleet
