// Message authentication of the Van's traffic (VanOptions::auth, unless
// VanOptions::encrypt asks for CURVE): every message carries a MAC under a
// key of its connection, so only holders of the job secret get a message
// through, and a message changed, forged or played again is refused. The
// bytes travel in the clear (see README: Authentication).
//
// Greeting, once per TCP connection (the connecting side starts it when
// ZeroMQ reports the connection up, again after every reconnect):
//   client -> server  [kHello][session id: 16 random bytes]
//   server -> client  [kWelcome][server nonce: 16 random bytes]
//                     [proof: HMAC-SHA256(van_key, "welcome" | id | nonce), 16 bytes]
// Both sides then hold the session key HKDF-SHA256(van_key, salt = id |
// nonce, "fleet van session v1"). The client sends nothing of the job's
// until the proof checks out (a stranger listening on a job's port learns
// nothing but the id), and the server's fresh nonce makes a recorded
// session useless against any later server.
//
// Every other message ends with a trailer frame
//   [session id: 16][sequence number: 8, little endian][tag: 16]
// where tag = Poly1305 (RFC 8439, OpenSSL) under the message's one-time key
// over: id; sequence number, the number of the other parts and each one's
// length (8 bytes each, little endian); then each part's bytes. Each item
// after the id is zero-padded to a multiple of 16 bytes (OpenSSL's
// Poly1305 runs at half speed on data that starts off that grid). Sequence
// numbers count up from 0 per session and direction; a receiver takes each
// at most once (ReplayWindow).
//
// One-time keys come from the ChaCha20 keystream under the session key
// (RFC 8439's block function, OpenSSL), 32 bytes a key, never two messages
// or chunks from the same bytes: message s's key is bytes
// [32 (s mod 64), +32) of the keystream with nonce (direction as 4 bytes,
// floor(s / 64) as 8 bytes, little endian) from block 0. A batch of 64
// keys thus takes one cipher setup (SessionKeys), where a ChaCha20-Poly1305
// tag per message cost a setup each (0.5-0.9 us, about as long as hashing a
// 6 KB message).
//
// A message of more than kChunkBytes in all is tagged in chunks so that
// several cores share the work (one Poly1305 pass is sequential, and over
// 4 MiB it took longer than the plain transfer): each part is cut into
// chunks of kChunkBytes (the last shorter), chunk i (counted over the parts
// in order) gets its own Poly1305 tag over its bytes under the first 32
// keystream bytes of nonce (direction | (i + 1) << 8, s), and the message's
// tag covers the chunk tags in place of the parts' bytes. The nonces of
// chunk keys and message keys differ in their first word, so no keystream
// byte keys two MACs, and the message tag binds the chunks' order, count
// and lengths.
//
// Thread safety: free functions are thread-safe; a SessionKeys and a
// ReplayWindow are not.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace fleet::van_auth {

constexpr size_t kIdBytes = 16;
constexpr size_t kNonceBytes = 16;
constexpr size_t kProofBytes = 16;
constexpr size_t kTagBytes = 16;
constexpr size_t kTrailerBytes = kIdBytes + 8 + kTagBytes;
constexpr size_t kChunkBytes = size_t{256} << 10;

// First part of the greeting messages. A zero byte first: no protobuf
// header starts with one, so they cannot be mistaken for a message.
// v3: tags under one-time keys (v2 peers tagged with ChaCha20-Poly1305; they
// fail at the greeting, not at every message).
inline constexpr std::string_view kHello{"\0fleet hello v3", 15};
inline constexpr std::string_view kWelcome{"\0fleet welcome v3", 17};

enum class Direction : uint32_t { kToServer = 1, kToClient = 2 };

// `n` bytes from the OS's CSPRNG. CHECK-fails if it fails (no entropy: the
// machine cannot run a secure job at all).
std::string RandomBytes(size_t n);

// The server's proof that it holds van_key, and the session key.
std::string WelcomeProof(std::string_view van_key, std::string_view id, std::string_view nonce);
std::string SessionKey(std::string_view van_key, std::string_view id, std::string_view nonce);

struct Part {
  const void* data;
  size_t size;
};

// What one message's tag is computed with: a value, so a tag over megabytes
// needs no lock held.
struct MessageKeys {
  std::array<unsigned char, 32> session{};   // chunk keys derive from it
  std::array<unsigned char, 32> one_time{};  // the message tag's Poly1305 key
  Direction direction = Direction::kToServer;
  uint64_t sequence = 0;
};

// The message keys of one session and direction.
class SessionKeys {
 public:
  SessionKeys() = default;  // no session: For and Once CHECK-fail
  // `session_key`: 32 bytes (SessionKey).
  SessionKeys(std::string_view session_key, Direction direction);

  // Message `sequence`'s keys, from the batch of 64 it belongs to; the last
  // two batches are kept (numbers arrive a little out of order).
  MessageKeys For(uint64_t sequence);
  // The same keys, derived alone and kept nowhere: for a peer not yet
  // authenticated, whose messages must not make this keep 4 KiB.
  MessageKeys Once(uint64_t sequence) const;

 private:
  static constexpr int kBatch = 64;
  struct Batch {
    bool made = false;
    uint64_t index = 0;  // sequence / kBatch
    unsigned char keys[kBatch * 32];
  };
  std::array<unsigned char, 32> key_{};
  Direction direction_ = Direction::kToServer;
  bool set_ = false;
  std::unique_ptr<Batch[]> batches_;  // 2, allocated by the first For
};

// The trailer for `parts` (every part of the message after the routing id,
// the trailer excluded).
std::string Trailer(const MessageKeys& keys, std::string_view id, std::span<const Part> parts);
// The same with keys derived for this message alone (SessionKeys::Once): for
// a peer that tags a message now and then, such as the tests' raw client.
std::string Trailer(std::string_view session_key, Direction direction, std::string_view id,
                    uint64_t sequence, std::span<const Part> parts);

struct TrailerFields {
  std::string_view id;
  uint64_t sequence = 0;
};
// The id and sequence number of a trailer; false when it is not one.
bool ParseTrailer(std::string_view trailer, TrailerFields* fields);

// True when `trailer`'s tag is right for `parts` under `keys` (whose
// sequence must be the trailer's; constant-time comparison).
bool Verify(const MessageKeys& keys, std::string_view trailer, std::span<const Part> parts);
// The same with the keys of the trailer's sequence number derived alone.
bool Verify(std::string_view session_key, Direction direction, std::string_view trailer,
            std::span<const Part> parts);

// Which sequence numbers a receiver has taken: any above the highest so far,
// and those up to 63 below it not taken yet (two threads sending on one
// connection may reorder a little; IPsec's anti-replay window).
class ReplayWindow {
 public:
  // True (and remembered) the first time `sequence` is offered.
  bool Accept(uint64_t sequence);

 private:
  bool any_ = false;
  uint64_t highest_ = 0;
  uint64_t seen_ = 0;  // bit i: highest_ - i was taken
};

}  // namespace fleet::van_auth
