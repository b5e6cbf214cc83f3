// Van: the ZeroMQ transport. It owns one ZeroMQ context, at most one bound
// ROUTER socket (for peers that call us), one DEALER socket per peer we
// connected to, and one I/O thread that receives and hands messages to a
// Receiver.
// Every socket is used under its own lock, so any thread sends directly (a
// hand-off to the I/O thread is a wake-up, a large part of a small round
// trip), and a thread blocked on a reply may receive it itself
// (ReceiveWhile) while the I/O thread stands back from the outgoing sockets.
// The I/O thread is woken only when it has to take part: a message for it
// (ZeroMQ signals the socket's descriptor, which it watches), a send that
// may have taken that signal from it, Stop. A reply its inline handler makes
// leaves at once, before the next request of the same receive pass is
// handled. A thread receiving in ReceiveWhile is woken the same ways, and by
// the I/O thread when that delivers a reply the thread may be waiting for.
//
// A message on the wire is one ZeroMQ multipart message:
//   [routing id (ROUTER side only)] [pb::Header] [frame 0] ... [frame n-1]
// Payload frames of 256 bytes or more are handed to ZeroMQ without copying
// (the frame's SArray owner is kept alive until ZeroMQ is done with it);
// received frames are views that keep their zmq message alive.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/job_auth.h"
#include "comm/message.h"
#include "comm/status.h"

namespace fleet {

// Where a message came from, and so where its reply goes: either one of our
// outgoing connections (connection >= 0) or a caller that reached our bound
// ROUTER socket (identified by its ZeroMQ routing id).
struct Route {
  int connection = -1;
  std::string routing_id;
  // With message authentication (VanOptions::auth, not encrypt): the
  // session a caller's message came under; a reply must carry it back.
  std::string session;

  bool outgoing() const { return connection >= 0; }
  // The route of a request we send on our connection to `peer`.
  static Route Outgoing(int peer) {
    Route r;
    r.connection = peer;
    return r;
  }
};

struct VanOptions {
  // ZeroMQ heartbeats: a peer silent for heartbeat_timeout is declared dead
  // and its connection reported down, even when TCP did not notice (a frozen
  // process, a cut cable). Shorter detects faster but costs idle traffic.
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  // How often the I/O thread calls Receiver::OnTick when idle; bounds how
  // late a deadline can be noticed.
  std::chrono::milliseconds tick{5};
  // Busy polling: a thread that receives (the I/O thread, or a caller in
  // ReceiveWhile) keeps checking its sockets for this long after it last had
  // something to do (or began to wait) before it sleeps. A message that
  // arrives meanwhile then needs no wake-up of a sleeping thread, which on a
  // VM whose idle CPUs halt costs 10-20 us each, several per round trip; the
  // price is a CPU kept busy for up to this long. 0 (default) never spins.
  std::chrono::microseconds busy_poll{0};
  // ZeroMQ background I/O threads. One moves well over 1 GB/s on loopback.
  int zmq_io_threads = 1;
  // How long Stop() lets replies already handed to the bound socket drain
  // to their callers before closing. Outgoing connections never linger: a
  // request to a dead peer must not hold up shutdown.
  std::chrono::milliseconds reply_linger{1000};
  // The job's credentials. When set, only holders of the job secret get a
  // message through, and a message changed, forged or played again is
  // refused (dropped and counted; the caller's request times out):
  //  * encrypt false (default): every message carries a MAC under a key of
  //    its connection, agreed in a greeting that proves the job secret on
  //    both sides (comm/van_auth.h). The bytes travel in the clear. Costs a
  //    round trip per connection and a Poly1305 pass over every byte on
  //    each side (several GB/s; README: figures). A connection whose peer
  //    does not answer the greeting within 1.5 s (auth off there, or not a
  //    FleetPS node) is reported down ("handshake").
  //  * encrypt true: every socket speaks ZeroMQ CURVE (encrypted and
  //    authenticated): the bound socket is a CURVE server with the job's
  //    server key and admits, through a ZAP handler on this Van's context,
  //    only clients presenting the job's client key; outgoing connections
  //    present that key and accept only the job's server key. Costs a
  //    handshake per connection and the encryption of every byte on
  //    ZeroMQ's I/O thread (~0.5 GB/s).
  // A peer without the keys never gets a message through and the server
  // goes on serving the others. Null (default): plain TCP, anyone reaching
  // the port is served; for trusted networks only (Distributed.auth: off).
  std::shared_ptr<const JobAuth> auth;
  bool encrypt = false;
  // The largest frame of a message this Van accepts or sends. A peer that
  // announces a larger one is disconnected by ZeroMQ (ZMQ_MAXMSGSIZE) before
  // its bytes are buffered, which bounds what a stranger's connection costs
  // before the greeting; Send() refuses a larger frame (InvalidArgument).
  // PS programs give Distributed.max_message_bytes (ps::MessageLimit).
  int64_t max_message_bytes = int64_t{1} << 30;
};

// Called on the Van's I/O thread, or for outgoing connections on a thread
// inside Van::ReceiveWhile; possibly from two threads at once, so
// implementations must be thread-safe. They must be quick and must not
// block: hand real work to another thread.
class VanReceiver {
 public:
  virtual ~VanReceiver() = default;
  // A message that passed Message::Validate().
  virtual void OnMessage(const Route& from, Message&& message) = 0;
  // A message whose frames disagree with its header. `header` parsed fine,
  // so the receiver may answer it with an error.
  virtual void OnMalformed(const Route& from, const pb::Header& header, const Status& why) = 0;
  // An outgoing connection's TCP session is up (again).
  virtual void OnConnectionUp(int connection) = 0;
  // An outgoing connection was lost (peer closed, crashed, or missed its
  // heartbeats), or, with VanOptions::auth, its CURVE handshake failed (the
  // peer does not hold this job's keys). ZeroMQ keeps reconnecting in the
  // background.
  virtual void OnConnectionDown(int connection, const std::string& endpoint,
                                const Status& why) = 0;
  // Called at least every VanOptions::tick.
  virtual void OnTick(std::chrono::steady_clock::time_point now) = 0;
};

class Van {
 public:
  // Starts the I/O thread. `receiver` must outlive the Van.
  // FailedPrecondition when options.auth is set and libzmq lacks CURVE.
  static Result<std::unique_ptr<Van>> Create(VanOptions options, VanReceiver* receiver);
  ~Van();  // Stop()s.
  Van(const Van&) = delete;
  Van& operator=(const Van&) = delete;

  // Binds the ROUTER socket to "ip:port" or "tcp://ip:port". Port 0 picks a
  // free port. Returns the bound "ip:port". At most one Bind per Van.
  // Errors: InvalidArgument (malformed address), Unavailable (address in
  // use or not local), FailedPrecondition (already bound or stopped).
  // Blocks until the I/O thread did it (bounded: it only binds).
  Result<std::string> Bind(const std::string& endpoint);

  // Opens an outgoing connection and returns its id (0, 1, ...). Does not
  // wait for the peer: messages queue until it is up. Errors:
  // InvalidArgument (malformed address), FailedPrecondition (stopped).
  Result<int> Connect(const std::string& endpoint);

  // Hands `message` to ZeroMQ for `to` on the calling thread. Never blocks
  // on the network (ZeroMQ queues while a peer is connecting), only on the
  // socket's lock while another thread sends or receives on it.
  // Errors: FailedPrecondition once stopped; InvalidArgument for an unknown
  // connection; Unavailable when ZeroMQ refuses (e.g. a ROUTER reply to a
  // caller that has disconnected). The message is read, not kept (frames
  // ZeroMQ sends in place hold a reference to their owner), so a caller may
  // send one message several times.
  Status Send(const Route& to, const Message& message);

  // Lets a thread that waits for replies receive them itself, instead of
  // being woken by the I/O thread: a blocking call then costs one thread
  // hand-off less (the largest part of a small round trip on a VM).
  // Runs `start` (if any; typically it sends the requests), then receives
  // and delivers messages of all outgoing connections (calling the Receiver
  // on this thread) while keep_waiting() is true and `deadline` has not
  // passed. keep_waiting() is checked again whenever a message of those
  // connections was delivered, on this thread or another (the I/O thread
  // may be delivering one as the wait begins); an outcome that comes
  // otherwise (a deadline, a lost connection) is seen within
  // VanOptions::tick. keep_waiting() must read what the Receiver wrote
  // with acquire ordering or stronger (a future, a mutex, an atomic).
  // Neither the requests this thread sends meanwhile nor the
  // replies it takes wake the I/O thread (it stops watching the outgoing
  // connections meanwhile, without being woken for it). On return every
  // message already there is delivered too (on this thread), so the I/O
  // thread is woken by the next one's arrival alone. Returns false at once,
  // having done nothing (not even `start`), when another thread is already
  // receiving.
  bool ReceiveWhile(const std::function<void()>& start, const std::function<bool()>& keep_waiting,
                    std::chrono::steady_clock::time_point deadline);

  // The endpoint of an outgoing connection, for error messages.
  // REQUIRES: connection was returned by Connect().
  std::string endpoint(int connection) const;

  // Stops the I/O thread and closes every socket; queued messages are
  // dropped. Idempotent. Must not be called from the I/O thread.
  void Stop();

 private:
  struct Impl;
  explicit Van(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "ip:port" or "tcp://ip:port" -> "tcp://ip:port", checking the shape. Port
// must be 0..65535 (0 only when allow_port0).
Result<std::string> ToZmqEndpoint(const std::string& endpoint, bool allow_port0);

}  // namespace fleet
