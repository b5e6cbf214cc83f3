#include "comm/van_auth.h"

#include <glog/logging.h>
#include <openssl/crypto.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "comm/job_auth.h"
#include "comm/thread_pool.h"

namespace fleet::van_auth {
namespace {

constexpr size_t kKeyBytes = 32;

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};

// One cipher context per thread, set to ChaCha20-Poly1305 once: fetching
// the cipher again for every message (what EVP_chacha20_poly1305() in an
// init does) cost ~10 us, more than a 12 KB message's tag.
EVP_CIPHER_CTX* ThreadCipher() {
  thread_local std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> ctx = [] {
    std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> c(EVP_CIPHER_CTX_new());
    EVP_CIPHER* cipher = EVP_CIPHER_fetch(nullptr, "ChaCha20-Poly1305", nullptr);
    CHECK(c != nullptr && cipher != nullptr) << "OpenSSL has no ChaCha20-Poly1305";
    CHECK_EQ(EVP_EncryptInit_ex2(c.get(), cipher, nullptr, nullptr, nullptr), 1);
    EVP_CIPHER_free(cipher);  // the context keeps its own reference
    return c;
  }();
  return ctx.get();
}

void PutU64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t GetU64(const char* in) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

// Feeds additional data to a ChaCha20-Poly1305 context; OpenSSL takes int
// lengths, so large spans go in pieces. Leaves *ok false after a failure.
void AddData(EVP_CIPHER_CTX* ctx, const void* data, size_t size, bool* ok) {
  const auto* p = static_cast<const unsigned char*>(data);
  int len = 0;
  while (*ok && size > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(size, size_t{1} << 30));
    *ok = EVP_EncryptUpdate(ctx, nullptr, &len, p, chunk) == 1;
    p += chunk;
    size -= chunk;
  }
}

// The 16-byte tag of ChaCha20-Poly1305 under `key` with no plaintext, nonce
// = nonce_word | sequence (little endian), over what `feed` adds.
template <typename Feed>
void AeadTag(std::string_view key, uint32_t nonce_word, uint64_t sequence, const Feed& feed,
             unsigned char tag[kTagBytes]) {
  CHECK_EQ(key.size(), kKeyBytes);
  unsigned char iv[12];
  std::memcpy(iv, &nonce_word, 4);
  PutU64(sequence, iv + 4);
  EVP_CIPHER_CTX* ctx = ThreadCipher();
  bool ok = EVP_EncryptInit_ex2(ctx, nullptr, reinterpret_cast<const unsigned char*>(key.data()),
                                iv, nullptr) == 1;
  feed([&](const void* data, size_t size) { AddData(ctx, data, size, &ok); });
  int len = 0;
  // The tag as a parameter: EVP_CIPHER_CTX_ctrl would translate the request
  // into one first (~250 ns of the ~1 us that OpenSSL 3 spends per tag).
  OSSL_PARAM get[] = {OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, tag, kTagBytes),
                      OSSL_PARAM_construct_end()};
  ok = ok && EVP_EncryptFinal_ex(ctx, nullptr, &len) == 1 && EVP_CIPHER_CTX_get_params(ctx, get) == 1;
  CHECK(ok) << "OpenSSL ChaCha20-Poly1305 failed";
}

// Feeds the tag's additional data with few calls into OpenSSL (each costs
// ~40 ns before any byte is hashed, and a small message has a dozen items):
// small items gather in a buffer, zero-padded to a multiple of 16 bytes
// each (OpenSSL's Poly1305 runs at half speed over data that does not start
// on a 16-byte boundary of what was added before: 6.8 against 13.4 GB/s
// here); a large part goes in directly, from the caller's memory.
template <typename Add>
class PaddedFeed {
 public:
  explicit PaddedFeed(const Add& add) : add_(add) {}
  ~PaddedFeed() { Flush(); }

  // `size` bytes, then zeros up to a multiple of 16 (lengths are signed,
  // so the padding is unambiguous).
  void AddPadded(const void* data, size_t size) {
    if (size <= kGathered) {
      Append(data, size);
    } else {
      Flush();
      add_(data, size - size % 16);
      Append(static_cast<const char*>(data) + size - size % 16, size % 16);
    }
    Append(kZeros, (16 - size % 16) % 16);
  }
  // Unpadded (the fixed fields, padded by the caller).
  void Append(const void* data, size_t size) {
    if (used_ + size > sizeof(buffer_)) Flush();
    std::memcpy(buffer_ + used_, data, size);
    used_ += size;
  }

 private:
  // Parts of up to kGathered bytes are copied (a header, a reply's status).
  static constexpr size_t kGathered = 256;
  static constexpr unsigned char kZeros[16] = {};

  void Flush() {
    if (used_ > 0) add_(buffer_, used_);
    used_ = 0;
  }

  const Add& add_;
  alignas(16) unsigned char buffer_[1024];
  size_t used_ = 0;
};

// Tags of large messages are computed over chunks on several cores (see
// van_auth.h). The pool is made on first use and never destroyed: a thread
// may be tagging while the process exits.
ThreadPool& ChunkPool() {
  static ThreadPool* pool = new ThreadPool(
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 7));
  return *pool;
}

// The message's tag: over id, sequence, part count and part lengths, then
// each part's bytes or, for more than kChunkBytes in all, the chunks' tags.
void Tag(std::string_view key, Direction direction, std::string_view id, uint64_t sequence,
         std::span<const Part> parts, unsigned char tag[kTagBytes]) {
  size_t total = 0;
  for (const Part& p : parts) total += p.size;
  std::vector<Part> chunks;
  if (total > kChunkBytes) {
    for (const Part& p : parts) {
      for (size_t at = 0; at < p.size; at += kChunkBytes) {
        chunks.push_back(
            {static_cast<const char*>(p.data) + at, std::min(kChunkBytes, p.size - at)});
      }
    }
  }
  CHECK_LT(chunks.size(), size_t{1} << 24) << "message too large for its nonces";
  std::vector<unsigned char> chunk_tags(chunks.size() * kTagBytes);
  ChunkPool().ParallelFor(chunks.size(), [&](size_t i) {
    const uint32_t word = static_cast<uint32_t>(direction) | static_cast<uint32_t>(i + 1) << 8;
    AeadTag(key, word, sequence, [&](const auto& add) { add(chunks[i].data, chunks[i].size); },
            chunk_tags.data() + i * kTagBytes);
  });
  AeadTag(key, static_cast<uint32_t>(direction), sequence, [&](const auto& add) {
    // id (16 bytes), then sequence, count and lengths, 8 bytes each: with
    // an odd part count they end 8 bytes off the 16-byte grid.
    static constexpr unsigned char kZeros[8] = {};
    PaddedFeed feed(add);
    unsigned char fixed[8];
    feed.Append(id.data(), id.size());
    PutU64(sequence, fixed);
    feed.Append(fixed, 8);
    PutU64(parts.size(), fixed);
    feed.Append(fixed, 8);
    for (const Part& p : parts) {
      PutU64(p.size, fixed);
      feed.Append(fixed, 8);
    }
    if (parts.size() % 2 != 0) feed.Append(kZeros, 8);
    if (!chunks.empty()) {
      feed.AddPadded(chunk_tags.data(), chunk_tags.size());
    } else {
      for (const Part& p : parts) feed.AddPadded(p.data, p.size);
    }
  }, tag);
}

}  // namespace

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  CHECK_EQ(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)), 1)
      << "the OS random generator failed";
  return out;
}

std::string WelcomeProof(std::string_view van_key, std::string_view id, std::string_view nonce) {
  std::string data = "welcome";
  data.append(id);
  data.append(nonce);
  unsigned char mac[32];
  unsigned int len = 0;
  CHECK(HMAC(EVP_sha256(), van_key.data(), static_cast<int>(van_key.size()),
             reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
             &len) != nullptr);
  return std::string(reinterpret_cast<const char*>(mac), kProofBytes);
}

std::string SessionKey(std::string_view van_key, std::string_view id, std::string_view nonce) {
  std::string salt(id);
  salt.append(nonce);
  return HkdfSha256(van_key, salt, "fleet van session v1", kKeyBytes);
}

std::string Trailer(std::string_view session_key, Direction direction, std::string_view id,
                    uint64_t sequence, std::span<const Part> parts) {
  CHECK_EQ(id.size(), kIdBytes);
  std::string out(kTrailerBytes, '\0');
  std::memcpy(out.data(), id.data(), kIdBytes);
  PutU64(sequence, reinterpret_cast<unsigned char*>(out.data() + kIdBytes));
  Tag(session_key, direction, id, sequence, parts,
      reinterpret_cast<unsigned char*>(out.data() + kIdBytes + 8));
  return out;
}

bool ParseTrailer(std::string_view trailer, TrailerFields* fields) {
  if (trailer.size() != kTrailerBytes) return false;
  fields->id = trailer.substr(0, kIdBytes);
  fields->sequence = GetU64(trailer.data() + kIdBytes);
  return true;
}

bool Verify(std::string_view session_key, Direction direction, std::string_view trailer,
            std::span<const Part> parts) {
  TrailerFields f;
  if (!ParseTrailer(trailer, &f)) return false;
  unsigned char want[kTagBytes];
  Tag(session_key, direction, f.id, f.sequence, parts, want);
  return CRYPTO_memcmp(want, trailer.data() + kIdBytes + 8, kTagBytes) == 0;
}

bool ReplayWindow::Accept(uint64_t sequence) {
  if (!any_ || sequence > highest_) {
    const uint64_t shift = any_ ? sequence - highest_ : 64;
    seen_ = shift >= 64 ? 0 : seen_ << shift;
    seen_ |= 1;
    highest_ = sequence;
    any_ = true;
    return true;
  }
  const uint64_t back = highest_ - sequence;
  if (back >= 64 || (seen_ >> back) & 1) return false;
  seen_ |= uint64_t{1} << back;
  return true;
}

}  // namespace fleet::van_auth
