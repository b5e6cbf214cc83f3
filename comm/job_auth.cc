#include "comm/job_auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <zmq.h>

#include <charconv>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fleet {
namespace {

constexpr size_t kSha256Bytes = 32;
// HKDF's salt: fixed, so every process derives the same keys; it separates
// FleetPS's keys from any other use of the same secret.
constexpr std::string_view kSalt = "fleetps job secret v1";
// A secret file larger than this is not a secret file.
constexpr size_t kMaxSecretFileBytes = 4096;
constexpr std::string_view kSignatureVersion = "v2";

// (Debian's absl has its own string_view, so the helpers below are std.)
std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string_view Strip(std::string_view s) {
  const char* space = " \t\r\n\f\v";
  const size_t first = s.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

std::vector<std::string_view> SplitSpaces(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(' ', start);
    out.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // Only fails on allocation failure inside OpenSSL.
  CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len) != nullptr);
  return std::string(reinterpret_cast<char*>(out), len);
}

// A CURVE keypair whose secret key is `secret_key` (32 bytes; Curve25519
// clamps any 32 bytes into a valid scalar).
CurveKeyPair CurvePairFrom(const std::string& secret_key) {
  CHECK_EQ(secret_key.size(), 32u);
  char z85_secret[41];
  char z85_public[41];
  CHECK(zmq_z85_encode(z85_secret, reinterpret_cast<const uint8_t*>(secret_key.data()), 32) !=
        nullptr);
  // Fails only when libzmq was built without CURVE, which Van checks first.
  CHECK_EQ(zmq_curve_public(z85_public, z85_secret), 0) << "libzmq without CURVE";
  return CurveKeyPair{z85_public, z85_secret};
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // Only fails on allocation failure inside OpenSSL.
  CHECK_EQ(EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr), 1);
  return Hex(std::string_view(reinterpret_cast<const char*>(digest), len));
}

std::string SignedText(std::string_view method, std::string_view target,
                       std::string_view body_sha256, int64_t unix_ms, std::string_view nonce) {
  // Length-prefixed fields: no two requests give the same text.
  std::string text(kSignatureVersion);
  for (std::string_view field : {method, target}) {
    text.append("\n").append(std::to_string(field.size())).append(":").append(field);
  }
  text.append("\n").append(std::to_string(unix_ms)).append("\n").append(nonce);
  text.append("\n").append(body_sha256);
  return text;
}

}  // namespace

std::string HkdfSha256(std::string_view ikm, std::string_view salt, std::string_view info,
                       size_t length) {
  CHECK_LE(length, 255 * kSha256Bytes);
  const std::string prk = HmacSha256(salt, ikm);
  std::string out, block;
  for (unsigned char counter = 1; out.size() < length; ++counter) {
    std::string input = block;
    input.append(info).push_back(static_cast<char>(counter));
    block = HmacSha256(prk, input);
    out.append(block);
  }
  out.resize(length);
  return out;
}

Result<std::shared_ptr<const JobAuth>> JobAuth::FromSecret(std::string_view secret,
                                                           std::string_view source) {
  secret = Strip(secret);
  if (secret.size() < kMinSecretChars) {
    return Status::InvalidArgument(
        absl::StrCat("job secret too short: want at least ", kMinSecretChars,
                     " characters (e.g. `openssl rand -hex 32`)"),
        std::string(source));
  }
  std::shared_ptr<JobAuth> auth(new JobAuth());
  auth->curve_server_ = CurvePairFrom(HkdfSha256(secret, kSalt, "fleet curve server v1", 32));
  auth->curve_client_ = CurvePairFrom(HkdfSha256(secret, kSalt, "fleet curve client v1", 32));
  auth->kv_key_ = HkdfSha256(secret, kSalt, "fleet kv hmac v1", kSha256Bytes);
  auth->van_key_ = HkdfSha256(secret, kSalt, "fleet van mac v1", kSha256Bytes);
  return std::shared_ptr<const JobAuth>(std::move(auth));
}

Result<std::shared_ptr<const JobAuth>> JobAuth::FromFile(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(path));
  auto auth = FromSecret(text, absl::StrCat("job secret file '", path, "'"));
  // The secret's bytes do not outlive this call in a buffer we own.
  OPENSSL_cleanse(text.data(), text.size());
  return auth;
}

Result<std::string> JobAuth::ReadSecretFile(const std::string& path, std::string_view what) {
  const std::string which = absl::StrCat(std::string(what), " '", path, "'");
  // open + fstat: the file checked is the file read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("no such file", which);
    return Status::IOError(absl::StrCat("cannot open: ", std::strerror(err)), which);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument("not a regular file", which);
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return Status::InvalidArgument(
        absl::StrCat("readable or writable by group or others (mode ", mode, "): run `chmod 600 ",
                     path, "`"),
        which);
  }
  std::string text(kMaxSecretFileBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return Status::IOError(absl::StrCat("read failed: ", std::strerror(err)), which);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got > kMaxSecretFileBytes) {
    return Status::InvalidArgument(absl::StrCat("larger than ", kMaxSecretFileBytes, " bytes"),
                                   which);
  }
  text.resize(got);
  return text;
}

Result<std::string> JobAuth::RandomSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return Status::IOError("cannot make a job secret: the random generator failed");
  }
  std::string hex = Hex(std::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
  OPENSSL_cleanse(bytes, sizeof(bytes));
  return hex;
}

std::string KvRequestSigner::Sign(std::string_view method, std::string_view target,
                                  std::string_view body) const {
  unsigned char raw[16];
  // A nonce only has to be unique, not secret; RAND_bytes fails only when
  // the OS cannot seed it, and then no key could have been made either.
  CHECK_EQ(RAND_bytes(raw, sizeof(raw)), 1);
  const std::string nonce = Hex(std::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  return SignAt(method, target, body, now, nonce);
}

std::string KvRequestSigner::SignAt(std::string_view method, std::string_view target,
                                    std::string_view body, int64_t unix_ms,
                                    std::string_view nonce) const {
  const std::string digest = Sha256Hex(body);
  const std::string mac = HmacSha256(
      auth_->kv_key(), SignedText(method, target, digest, unix_ms, nonce));
  std::string header(kSignatureVersion);
  header.append(" ").append(std::to_string(unix_ms)).append(" ").append(nonce);
  return header.append(" ").append(digest).append(" ").append(Hex(mac));
}

namespace {

// The fields of a credential header: version, unix ms, nonce, body digest,
// signature.
struct HeaderParts {
  int64_t unix_ms = 0;
  std::string_view nonce;
  std::string_view body_sha256;
  std::string_view mac;
};

Status ParseHeader(std::string_view header, HeaderParts* out) {
  const std::vector<std::string_view> parts = SplitSpaces(header);
  int64_t unix_ms = 0;
  auto parse = [&unix_ms](std::string_view t) {
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), unix_ms);
    return !t.empty() && ec == std::errc() && end == t.data() + t.size();
  };
  if (parts.size() != 5 || parts[0] != kSignatureVersion || !parse(parts[1]) ||
      parts[2].size() != 32 || parts[3].size() != 2 * kSha256Bytes ||
      parts[4].size() != 2 * kSha256Bytes) {
    return Status::InvalidArgument("malformed credential");
  }
  *out = {unix_ms, parts[2], parts[3], parts[4]};
  return Status::OK();
}

}  // namespace

Result<std::string> KvRequestSigner::VerifyHead(std::string_view header, std::string_view method,
                                                std::string_view target, int64_t now_unix_ms,
                                                std::chrono::milliseconds window) const {
  HeaderParts parts;
  FLEET_RETURN_IF_ERROR(ParseHeader(header, &parts));
  if (parts.unix_ms < now_unix_ms - window.count() ||
      parts.unix_ms > now_unix_ms + window.count()) {
    // Positive: the request's clock is ahead of this one.
    const int64_t ahead_s = (parts.unix_ms - now_unix_ms) / 1000;
    return Status::InvalidArgument(absl::StrCat(
        "credential timestamp is ", ahead_s >= 0 ? absl::StrCat(ahead_s, " s ahead of")
                                                 : absl::StrCat(-ahead_s, " s behind"),
        " this machine's clock (allowed: ", window.count() / 1000,
        " s); are the machines' clocks in sync?"));
  }
  const std::string expected = Hex(HmacSha256(
      auth_->kv_key(), SignedText(method, target, parts.body_sha256, parts.unix_ms, parts.nonce)));
  if (CRYPTO_memcmp(expected.data(), parts.mac.data(), expected.size()) != 0) {
    return Status::InvalidArgument("bad signature (not this job's secret)");
  }
  return std::string(parts.nonce);
}

bool KvRequestSigner::BodyMatches(std::string_view header, std::string_view body) {
  HeaderParts parts;
  if (!ParseHeader(header, &parts).ok()) return false;
  const std::string digest = Sha256Hex(body);
  return CRYPTO_memcmp(digest.data(), parts.body_sha256.data(), digest.size()) == 0;
}

Status KvRequestSigner::Verify(std::string_view header, std::string_view method,
                               std::string_view target, std::string_view body,
                               int64_t now_unix_ms, std::chrono::milliseconds window,
                               std::string* nonce) const {
  FLEET_ASSIGN_OR_RETURN(std::string verified,
                         VerifyHead(header, method, target, now_unix_ms, window));
  if (!BodyMatches(header, body)) {
    return Status::InvalidArgument("body differs from the one signed");
  }
  *nonce = std::move(verified);
  return Status::OK();
}

}  // namespace fleet
