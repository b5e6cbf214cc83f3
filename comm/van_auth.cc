#include "comm/van_auth.h"

#include <glog/logging.h>
#include <openssl/crypto.h>
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
struct MacCtxFree {
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

void PutU32(uint32_t v, unsigned char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

void PutU64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t GetU64(const char* in) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

// `out.size()` bytes of the ChaCha20 keystream under `key` from block
// `counter` of nonce (nonce_word, nonce_rest), both little endian. One
// context per thread, set to ChaCha20 once: fetching a cipher again for
// every call (what EVP_chacha20() in an init does) cost ~10 us for
// ChaCha20-Poly1305 here.
void Keystream(const std::array<unsigned char, 32>& key, uint32_t counter, uint32_t nonce_word,
               uint64_t nonce_rest, std::span<unsigned char> out) {
  thread_local std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> ctx = [] {
    std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree> c(EVP_CIPHER_CTX_new());
    EVP_CIPHER* cipher = EVP_CIPHER_fetch(nullptr, "ChaCha20", nullptr);
    CHECK(c != nullptr && cipher != nullptr) << "OpenSSL has no ChaCha20";
    CHECK_EQ(EVP_EncryptInit_ex2(c.get(), cipher, nullptr, nullptr, nullptr), 1);
    EVP_CIPHER_free(cipher);  // the context keeps its own reference
    return c;
  }();
  // OpenSSL's ChaCha20 IV: the 32-bit block counter, then the 96-bit nonce.
  unsigned char iv[16];
  PutU32(counter, iv);
  PutU32(nonce_word, iv + 4);
  PutU64(nonce_rest, iv + 8);
  // The keystream is what encrypting zeros gives.
  std::memset(out.data(), 0, out.size());
  int len = 0;
  const int size = static_cast<int>(out.size());
  CHECK(EVP_EncryptInit_ex2(ctx.get(), nullptr, key.data(), iv, nullptr) == 1 &&
        EVP_EncryptUpdate(ctx.get(), out.data(), &len, out.data(), size) == 1 && len == size)
      << "OpenSSL ChaCha20 failed";
}

// The 16-byte Poly1305 tag under the one-time `key` over what `feed` adds.
// One MAC context per thread, fetched once.
template <typename Feed>
void Poly1305Tag(const unsigned char key[32], const Feed& feed, unsigned char tag[kTagBytes]) {
  thread_local std::unique_ptr<EVP_MAC_CTX, MacCtxFree> ctx = [] {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
    CHECK(mac != nullptr) << "OpenSSL has no Poly1305";
    std::unique_ptr<EVP_MAC_CTX, MacCtxFree> c(EVP_MAC_CTX_new(mac));
    EVP_MAC_free(mac);  // the context keeps its own reference
    CHECK(c != nullptr);
    return c;
  }();
  bool ok = EVP_MAC_init(ctx.get(), key, 32, nullptr) == 1;
  feed([&](const void* data, size_t size) {
    ok = ok && EVP_MAC_update(ctx.get(), static_cast<const unsigned char*>(data), size) == 1;
  });
  size_t len = 0;
  ok = ok && EVP_MAC_final(ctx.get(), tag, &len, kTagBytes) == 1 && len == kTagBytes;
  CHECK(ok) << "OpenSSL Poly1305 failed";
}

// Feeds a tag's data with few calls into OpenSSL (each costs
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
void Tag(const MessageKeys& keys, std::string_view id, std::span<const Part> parts,
         unsigned char tag[kTagBytes]) {
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
  const auto direction = static_cast<uint32_t>(keys.direction);
  std::vector<unsigned char> chunk_tags(chunks.size() * kTagBytes);
  ChunkPool().ParallelFor(chunks.size(), [&](size_t i) {
    unsigned char chunk_key[32];
    Keystream(keys.session, 0, direction | static_cast<uint32_t>(i + 1) << 8, keys.sequence,
              chunk_key);
    Poly1305Tag(chunk_key, [&](const auto& add) { add(chunks[i].data, chunks[i].size); },
                chunk_tags.data() + i * kTagBytes);
  });
  Poly1305Tag(keys.one_time.data(), [&](const auto& add) {
    // id (16 bytes), then sequence, count and lengths, 8 bytes each: with
    // an odd part count they end 8 bytes off the 16-byte grid.
    static constexpr unsigned char kZeros[8] = {};
    PaddedFeed feed(add);
    unsigned char fixed[8];
    feed.Append(id.data(), id.size());
    PutU64(keys.sequence, fixed);
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

SessionKeys::SessionKeys(std::string_view session_key, Direction direction)
    : direction_(direction), set_(true) {
  CHECK_EQ(session_key.size(), key_.size());
  std::memcpy(key_.data(), session_key.data(), key_.size());
}

MessageKeys SessionKeys::Once(uint64_t sequence) const {
  CHECK(set_) << "no session";
  MessageKeys keys{.session = key_, .direction = direction_, .sequence = sequence};
  // Key s is half of keystream block (s mod 64) / 2 of its batch's nonce.
  const auto within = static_cast<uint32_t>(sequence % kBatch);
  unsigned char block[64];
  Keystream(key_, within / 2, static_cast<uint32_t>(direction_), sequence / kBatch, block);
  std::memcpy(keys.one_time.data(), block + (within % 2) * 32, 32);
  return keys;
}

MessageKeys SessionKeys::For(uint64_t sequence) {
  CHECK(set_) << "no session";
  const uint64_t index = sequence / kBatch;
  if (batches_ == nullptr) batches_ = std::make_unique<Batch[]>(2);
  Batch& a = batches_[0];
  Batch& b = batches_[1];
  Batch* batch = a.made && a.index == index ? &a : &b;
  if (!batch->made || batch->index != index) {
    // Makes it in place of one not made yet, else of the lower-numbered one.
    batch = !a.made || (b.made && a.index < b.index) ? &a : &b;
    batch->made = true;
    batch->index = index;
    Keystream(key_, 0, static_cast<uint32_t>(direction_), index, batch->keys);
  }
  MessageKeys keys{.session = key_, .direction = direction_, .sequence = sequence};
  std::memcpy(keys.one_time.data(), batch->keys + (sequence % kBatch) * 32, 32);
  return keys;
}

std::string Trailer(const MessageKeys& keys, std::string_view id, std::span<const Part> parts) {
  CHECK_EQ(id.size(), kIdBytes);
  std::string out(kTrailerBytes, '\0');
  std::memcpy(out.data(), id.data(), kIdBytes);
  PutU64(keys.sequence, reinterpret_cast<unsigned char*>(out.data() + kIdBytes));
  Tag(keys, id, parts, reinterpret_cast<unsigned char*>(out.data() + kIdBytes + 8));
  return out;
}

std::string Trailer(std::string_view session_key, Direction direction, std::string_view id,
                    uint64_t sequence, std::span<const Part> parts) {
  return Trailer(SessionKeys(session_key, direction).Once(sequence), id, parts);
}

bool ParseTrailer(std::string_view trailer, TrailerFields* fields) {
  if (trailer.size() != kTrailerBytes) return false;
  fields->id = trailer.substr(0, kIdBytes);
  fields->sequence = GetU64(trailer.data() + kIdBytes);
  return true;
}

bool Verify(const MessageKeys& keys, std::string_view trailer, std::span<const Part> parts) {
  TrailerFields f;
  if (!ParseTrailer(trailer, &f) || f.sequence != keys.sequence) return false;
  unsigned char want[kTagBytes];
  Tag(keys, f.id, parts, want);
  return CRYPTO_memcmp(want, trailer.data() + kIdBytes + 8, kTagBytes) == 0;
}

bool Verify(std::string_view session_key, Direction direction, std::string_view trailer,
            std::span<const Part> parts) {
  TrailerFields f;
  if (!ParseTrailer(trailer, &f)) return false;
  return Verify(SessionKeys(session_key, direction).Once(f.sequence), trailer, parts);
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
