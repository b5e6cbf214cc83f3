// Job authentication: key derivation from the job secret, the secret file's
// checks, the Van's two modes (per-message MACs after a greeting, the
// default; ZeroMQ CURVE with the ZAP handler): strangers refused, the job's
// clients served throughout; changed and replayed messages refused; and the
// KV store's signed requests.
#include <sys/stat.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <zmq.hpp>

#include "comm/cluster.h"
#include "comm/http_server.h"
#include "comm/job_auth.h"
#include "comm/kv_store.h"
#include "comm/rpc.h"
#include "comm/van_auth.h"
#include "tests/child_process.h"
#include "tests/raw_connection.h"

namespace fleet {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr uint32_t kEcho = 1;
const std::string kSecret = "0123456789abcdef0123456789abcdef-test-job";
const std::string kOtherSecret = "fedcba9876543210fedcba9876543210-other-job";

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::shared_ptr<const JobAuth> Auth(const std::string& secret) {
  auto auth = JobAuth::FromSecret(secret, "test");
  EXPECT_TRUE(auth.ok()) << auth.status().ToString();
  return auth.value();
}

// ---- key derivation ----

TEST(HkdfTest, MatchesRfc5869TestCases) {
  // RFC 5869 A.1 (basic) and A.3 (empty salt and info).
  EXPECT_EQ(Hex(HkdfSha256(Unhex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"),
                           Unhex("000102030405060708090a0b0c"), Unhex("f0f1f2f3f4f5f6f7f8f9"), 42)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  EXPECT_EQ(Hex(HkdfSha256(Unhex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"), "", "", 42)),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
}

TEST(JobAuthTest, SameSecretSameKeysOtherSecretOtherKeys) {
  auto a = Auth(kSecret), b = Auth("  " + kSecret + "\n"), c = Auth(kOtherSecret);
  EXPECT_EQ(a->curve_server().public_key, b->curve_server().public_key);
  EXPECT_EQ(a->curve_client().secret_key, b->curve_client().secret_key);
  EXPECT_EQ(a->kv_key(), b->kv_key());
  EXPECT_EQ(a->curve_server().public_key.size(), 40u);
  EXPECT_NE(a->curve_server().public_key, c->curve_server().public_key);
  EXPECT_NE(a->curve_client().public_key, c->curve_client().public_key);
  EXPECT_NE(a->curve_server().public_key, a->curve_client().public_key);
  EXPECT_NE(a->kv_key(), c->kv_key());
  // The public key is the one ZeroMQ computes for the secret key.
  char pub[41];
  ASSERT_EQ(zmq_curve_public(pub, a->curve_client().secret_key.c_str()), 0);
  EXPECT_EQ(a->curve_client().public_key, pub);
}

TEST(JobAuthTest, ShortSecretIsRefusedWithoutEchoingIt) {
  auto r = JobAuth::FromSecret("short-secret", "FLEET_JOB_SECRET");
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("FLEET_JOB_SECRET"), std::string::npos);
  EXPECT_EQ(r.status().message().find("short-secret"), std::string::npos);
}

TEST(JobAuthTest, RandomSecretsAreLongAndDistinct) {
  auto a = JobAuth::RandomSecret(), b = JobAuth::RandomSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(JobAuth::FromSecret(*a, "random").ok());
}

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fleet_auth_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "secret").string();
    std::ofstream(path_) << kSecret << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string path_;
};

TEST_F(SecretFileTest, OwnerOnlyFileGivesTheSecretsKeys) {
  ASSERT_EQ(chmod(path_.c_str(), 0600), 0);
  auto auth = JobAuth::FromFile(path_);
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  EXPECT_EQ(auth.value()->kv_key(), Auth(kSecret)->kv_key());
}

TEST_F(SecretFileTest, GroupOrWorldReadableFileIsRefusedWithChmodAdvice) {
  for (mode_t mode : {0644, 0640, 0604, 0620}) {
    ASSERT_EQ(chmod(path_.c_str(), mode), 0);
    auto auth = JobAuth::FromFile(path_);
    ASSERT_TRUE(auth.status().IsInvalidArgument()) << mode << ": " << auth.status().ToString();
    EXPECT_NE(auth.status().message().find("chmod 600"), std::string::npos);
    EXPECT_EQ(auth.status().message().find(kSecret), std::string::npos);
  }
  EXPECT_TRUE(JobAuth::FromFile((dir_ / "absent").string()).status().IsNotFound());
}

TEST_F(SecretFileTest, ClusterSpecReadsFileOrEnvironmentAndAuthOff) {
  ASSERT_EQ(chmod(path_.c_str(), 0600), 0);
  const std::map<std::string, std::string> base = {{"FLEET_ROLE", "worker"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(base.begin(), base.end());
    return ClusterSpecFromFlagsAndEnv(EnvFromMap(extra));
  };
  auto from_env = with({{"FLEET_JOB_SECRET", kSecret}});
  ASSERT_TRUE(from_env.ok()) << from_env.status().ToString();
  ASSERT_NE(from_env->credentials, nullptr);
  EXPECT_EQ(from_env->credentials->kv_key(), Auth(kSecret)->kv_key());
  EXPECT_EQ(from_env->ToString().find(kSecret), std::string::npos);

  auto from_file = with({{"FLEET_JOB_SECRET_FILE", path_}, {"FLEET_JOB_SECRET", kOtherSecret}});
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(from_file->credentials->kv_key(), Auth(kSecret)->kv_key());

  ASSERT_EQ(chmod(path_.c_str(), 0644), 0);
  EXPECT_TRUE(with({{"FLEET_JOB_SECRET_FILE", path_}}).status().IsInvalidArgument());

  auto off = with({{"FLEET_AUTH", "off"}, {"FLEET_JOB_SECRET", kSecret}});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->auth);
  EXPECT_EQ(off->credentials, nullptr);
  EXPECT_EQ(TransportAuth(*off, true).value(), nullptr);
  EXPECT_TRUE(with({{"FLEET_AUTH", "maybe"}}).status().IsInvalidArgument());

  auto none = with({});
  ASSERT_TRUE(none.ok());
  auto transport = TransportAuth(*none, /*config_auth=*/true);
  ASSERT_TRUE(transport.status().IsInvalidArgument());
  EXPECT_NE(transport.status().message().find("FLEET_JOB_SECRET"), std::string::npos);
  EXPECT_EQ(TransportAuth(*none, /*config_auth=*/false).value(), nullptr);
  EXPECT_EQ(TransportAuth(*from_env, true).value(), from_env->credentials);
}

// ---- ZeroMQ CURVE ----

RpcNodeOptions Options(const std::string& name, std::shared_ptr<const JobAuth> auth,
                       bool encrypt = false) {
  RpcNodeOptions o;
  o.van.encrypt = encrypt;
  o.name = name;
  o.default_timeout = 3s;
  o.van.heartbeat_interval = 200ms;
  o.van.heartbeat_timeout = 1000ms;
  o.van.auth = std::move(auth);
  return o;
}

Message EchoRequest(size_t n) {
  Message m;
  m.header.set_command(kEcho);
  SArray<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f;
  m.AddFrame(v);
  return m;
}

// Parameter: VanOptions::encrypt (CURVE) or not (message authentication).
class TransportAuthTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(zmq_has("curve")) << "this libzmq has no CURVE";
    server_ = RpcNode::Create(Options("server", Auth(kSecret), GetParam())).value();
    server_->RegisterSync(kEcho, [this](const Message& request, Message* response) {
      served_.fetch_add(1);
      response->header.add_frames()->CopyFrom(request.header.frames(0));
      response->frames.push_back(request.frames[0]);
      return Status::OK();
    });
    endpoint_ = server_->Listen("127.0.0.1:0").value();
  }

  // A job client's echo of n floats comes back intact.
  void ExpectJobClientServed(size_t n) {
    auto client = RpcNode::Create(Options("job-client", Auth(kSecret), GetParam())).value();
    const int peer = client->Connect(endpoint_).value();
    auto reply = client->CallSync(peer, EchoRequest(n));
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    auto frame = reply->Frame<float>(0);
    ASSERT_TRUE(frame.ok()) << frame.status().ToString();
    const SArray<float>& values = frame.value();
    ASSERT_EQ(values.size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(values[i], static_cast<float>(i) * 0.5f);
  }

  // A raw DEALER (optionally CURVE with the given keys) sends one echo
  // request; true when anything at all comes back within `wait`.
  bool RawDealerGetsReply(const std::function<void(zmq::socket_t&)>& setup,
                          std::chrono::milliseconds wait) {
    zmq::context_t ctx(1);
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    setup(dealer);
    dealer.connect("tcp://" + endpoint_);
    Message m = EchoRequest(4);
    m.header.set_request_id(1);
    m.header.set_sender("stranger");
    const std::string header = m.header.SerializeAsString();
    dealer.send(zmq::buffer(header), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    dealer.send(zmq::buffer(m.frames[0].data(), m.frames[0].size()), zmq::send_flags::dontwait);
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    return zmq::poll(&item, 1, wait) > 0;
  }

  std::unique_ptr<RpcNode> server_;
  std::string endpoint_;
  std::atomic<int> served_{0};
};

TEST_P(TransportAuthTest, JobClientsAreServedSmallAndLarge) {
  ExpectJobClientServed(1);
  ExpectJobClientServed(1 << 20);
  EXPECT_EQ(served_.load(), 2);
}

TEST_P(TransportAuthTest, PlainZeroMqClientIsRefusedAndServerKeepsServing) {
  EXPECT_FALSE(RawDealerGetsReply([](zmq::socket_t&) {}, 1500ms));
  EXPECT_EQ(served_.load(), 0);
  ExpectJobClientServed(16);
}

TEST_P(TransportAuthTest, ClientWithRandomKeyAndRightServerKeyIsRefusedByZap) {
  // Knows the server's public key but holds its own keypair: only ZAP
  // stands between it and the handlers.
  char pub[41], sec[41];
  ASSERT_EQ(zmq_curve_keypair(pub, sec), 0);
  const std::string server_key = Auth(kSecret)->curve_server().public_key;
  EXPECT_FALSE(RawDealerGetsReply(
      [&](zmq::socket_t& s) {
        s.set(zmq::sockopt::curve_serverkey, server_key);
        s.set(zmq::sockopt::curve_publickey, std::string(pub));
        s.set(zmq::sockopt::curve_secretkey, std::string(sec));
      },
      1500ms));
  EXPECT_EQ(served_.load(), 0);
  ExpectJobClientServed(16);
}

TEST_P(TransportAuthTest, NodeOfAnotherJobOrWithoutAuthFailsAndServerKeepsServing) {
  for (auto auth : {Auth(kOtherSecret), std::shared_ptr<const JobAuth>()}) {
    auto stranger = RpcNode::Create(Options("stranger", auth, GetParam())).value();
    const int peer = stranger->Connect(endpoint_).value();
    RpcOptions o;
    o.timeout = 1500ms;
    auto reply = stranger->CallSync(peer, EchoRequest(4), o);
    ASSERT_FALSE(reply.ok());
    EXPECT_TRUE(reply.status().IsUnavailable() || reply.status().IsTimeout())
        << reply.status().ToString();
  }
  EXPECT_EQ(served_.load(), 0);
  ExpectJobClientServed(16);
}

TEST_P(TransportAuthTest, JobClientOfAnAuthOffServerFailsFast) {
  auto plain = RpcNode::Create(Options("plain", nullptr)).value();
  plain->RegisterSync(kEcho, [](const Message&, Message*) { return Status::OK(); });
  const std::string plain_endpoint = plain->Listen("127.0.0.1:0").value();
  auto client = RpcNode::Create(Options("job-client", Auth(kSecret), GetParam())).value();
  const int peer = client->Connect(plain_endpoint).value();
  RpcOptions o;
  o.timeout = 3s;
  const auto start = std::chrono::steady_clock::now();
  auto reply = client->CallSync(peer, EchoRequest(4), o);
  ASSERT_FALSE(reply.ok());
  EXPECT_TRUE(reply.status().IsUnavailable()) << reply.status().ToString();
  EXPECT_NE(reply.status().message().find("handshake"), std::string::npos)
      << reply.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2500ms);
}

TEST_P(TransportAuthTest, NodesOfTheOtherModeFailAndServerKeepsServing) {
  auto other = RpcNode::Create(Options("other-mode", Auth(kSecret), !GetParam())).value();
  const int peer = other->Connect(endpoint_).value();
  RpcOptions o;
  o.timeout = 1500ms;
  auto reply = other->CallSync(peer, EchoRequest(4), o);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(served_.load(), 0);
  ExpectJobClientServed(16);
}

INSTANTIATE_TEST_SUITE_P(Modes, TransportAuthTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Curve" : "Mac"; });

// ---- message authentication on the wire (comm/van_auth.h) ----

// A raw DEALER that holds the job secret and speaks the greeting itself, so
// a test can send what no Van would: a message changed after it was signed,
// or one sent twice.
class RawJobPeer {
 public:
  RawJobPeer(const std::string& endpoint, const JobAuth& auth) : dealer_(ctx_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.connect("tcp://" + endpoint);
    id_ = van_auth::RandomBytes(van_auth::kIdBytes);
    dealer_.send(zmq::buffer(van_auth::kHello), zmq::send_flags::sndmore);
    dealer_.send(zmq::buffer(id_), zmq::send_flags::none);
    std::vector<zmq::message_t> welcome = Receive(3s);
    EXPECT_EQ(welcome.size(), 3u) << "no welcome";
    if (welcome.size() != 3) return;
    const std::string nonce = welcome[1].to_string();
    EXPECT_EQ(welcome[2].to_string(), van_auth::WelcomeProof(auth.van_key(), id_, nonce));
    key_ = van_auth::SessionKey(auth.van_key(), id_, nonce);
  }

  // The parts of an echo request of n floats, signed under `sequence`.
  std::vector<std::string> Signed(size_t n, uint64_t sequence, uint64_t request_id) {
    Message m = EchoRequest(n);
    m.header.set_request_id(request_id);
    m.header.set_sender("raw-job-peer");
    std::vector<std::string> parts = {m.header.SerializeAsString(),
                                      std::string(m.frames[0].data(), m.frames[0].size())};
    std::vector<van_auth::Part> spans;
    for (const auto& p : parts) spans.push_back({p.data(), p.size()});
    parts.push_back(van_auth::Trailer(key_, van_auth::Direction::kToServer, id_, sequence, spans));
    return parts;
  }

  void Send(const std::vector<std::string>& parts) {
    for (size_t i = 0; i < parts.size(); ++i) {
      dealer_.send(zmq::buffer(parts[i]), i + 1 < parts.size() ? zmq::send_flags::sndmore
                                                               : zmq::send_flags::none);
    }
  }

  // The next message, or nothing within `wait`.
  std::vector<zmq::message_t> Receive(std::chrono::milliseconds wait) {
    std::vector<zmq::message_t> parts;
    zmq::pollitem_t item{dealer_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, wait) <= 0) return parts;
    bool more = true;
    while (more) {
      zmq::message_t part;
      if (!dealer_.recv(part, zmq::recv_flags::none)) break;
      more = part.more();
      parts.push_back(std::move(part));
    }
    return parts;
  }

  // True when a reply whose trailer checks out under this session comes.
  bool GetsSignedReply(std::chrono::milliseconds wait) {
    std::vector<zmq::message_t> reply = Receive(wait);
    if (reply.size() < 2) return false;
    std::vector<van_auth::Part> spans;
    for (size_t i = 0; i + 1 < reply.size(); ++i) spans.push_back({reply[i].data(), reply[i].size()});
    return van_auth::Verify(key_, van_auth::Direction::kToClient, reply.back().to_string_view(),
                            spans);
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t dealer_;
  std::string id_, key_;
};

class MessageAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = RpcNode::Create(Options("server", Auth(kSecret))).value();
    server_->RegisterSync(kEcho, [this](const Message& request, Message* response) {
      served_.fetch_add(1);
      response->header.add_frames()->CopyFrom(request.header.frames(0));
      response->frames.push_back(request.frames[0]);
      return Status::OK();
    });
    endpoint_ = server_->Listen("127.0.0.1:0").value();
  }

  std::unique_ptr<RpcNode> server_;
  std::string endpoint_;
  std::atomic<int> served_{0};
};

TEST_F(MessageAuthTest, SignedMessageIsServedWithASignedReply) {
  RawJobPeer peer(endpoint_, *Auth(kSecret));
  peer.Send(peer.Signed(1024, 0, 1));
  EXPECT_TRUE(peer.GetsSignedReply(3s));
  EXPECT_EQ(served_.load(), 1);
}

TEST_F(MessageAuthTest, ChangedBulkFrameOrHeaderOrTrailerIsRefused) {
  RawJobPeer peer(endpoint_, *Auth(kSecret));
  uint64_t sequence = 0;
  for (int target : {0, 1, 2}) {  // header, payload (4 MiB), trailer's tag
    std::vector<std::string> parts = peer.Signed(1 << 20, sequence++, 10 + target);
    std::string& part = parts[target];
    part[target == 2 ? part.size() - 1 : part.size() / 2] ^= 0x01;
    peer.Send(parts);
  }
  EXPECT_TRUE(peer.Receive(1500ms).empty());
  EXPECT_EQ(served_.load(), 0);
  // The session goes on: the next signed message is served.
  peer.Send(peer.Signed(4, sequence++, 20));
  EXPECT_TRUE(peer.GetsSignedReply(3s));
  EXPECT_EQ(served_.load(), 1);
}

TEST_F(MessageAuthTest, ReplayedOrReorderedTooFarMessageIsRefused) {
  RawJobPeer peer(endpoint_, *Auth(kSecret));
  const std::vector<std::string> first = peer.Signed(4, 0, 1);
  peer.Send(first);
  ASSERT_TRUE(peer.GetsSignedReply(3s));
  peer.Send(first);  // the same bytes again
  // A sequence number 64 or more below the highest taken is refused too.
  peer.Send(peer.Signed(4, 100, 2));
  ASSERT_TRUE(peer.GetsSignedReply(3s));
  peer.Send(peer.Signed(4, 36, 3));
  EXPECT_TRUE(peer.Receive(1500ms).empty());
  EXPECT_EQ(served_.load(), 2);
}

// One-time keys are made 64 messages at a time (van_auth::SessionKeys).
// Calls from several threads over one connection cross batches both ways;
// a raw peer's requests out of order across batch ends (back into the
// batch before, two batches ahead, back again) are each served once.
TEST_F(MessageAuthTest, CallsCrossKeyBatchesInAnyOrder) {
  auto client = RpcNode::Create(Options("job-client", Auth(kSecret))).value();
  const int peer = client->Connect(endpoint_).value();
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        if (client->CallSync(peer, EchoRequest(1 + i)).ok()) answered.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(answered.load(), 400);
  EXPECT_EQ(served_.load(), 400);

  RawJobPeer raw(endpoint_, *Auth(kSecret));
  uint64_t request_id = 1;
  for (uint64_t sequence : {62, 64, 63, 129, 127, 66, 200, 190}) {
    raw.Send(raw.Signed(8, sequence, request_id++));
    EXPECT_TRUE(raw.GetsSignedReply(3s)) << "message " << sequence;
  }
  EXPECT_EQ(served_.load(), 408);
}

// A greeting flood: strangers send hundreds of thousands of greetings as
// fast as ZeroMQ takes them. A job's client is still served meanwhile, and
// the server stops at once afterwards: past a few greetings a connection's
// are dropped unanswered (no key derived), the I/O thread takes at most a
// batch from one socket before it looks at the others and at Stop(), and
// ZeroMQ queues at most 65536 messages of one peer. (A server flooded so
// once ignored SIGTERM: its I/O thread answered the whole backlog first.)
TEST_F(MessageAuthTest, AGreetingFloodNeitherStarvesClientsNorDelaysStop) {
  // The strangers run in a process of their own (killed at the end): a
  // ZeroMQ socket closed while the server holds it back may abort there.
  const std::string endpoint = endpoint_;
  fleet::testing::Child flood = fleet::testing::Child::Fork([endpoint] {
    std::vector<std::thread> flooders;
    for (int f = 0; f < 3; ++f) {
      flooders.emplace_back([endpoint] {
        zmq::context_t ctx(1);
        zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
        dealer.set(zmq::sockopt::sndhwm, 0);
        dealer.connect("tcp://" + endpoint);
        const std::string id(van_auth::kIdBytes, 'f');
        while (true) {
          dealer.send(zmq::buffer(van_auth::kHello), zmq::send_flags::sndmore);
          dealer.send(zmq::buffer(id), zmq::send_flags::none);
        }
      });
    }
    for (auto& t : flooders) t.join();
    return 0;
  });
  std::this_thread::sleep_for(1500ms);
  auto client = RpcNode::Create(Options("client", Auth(kSecret))).value();
  const auto asked = std::chrono::steady_clock::now();
  auto reply = client->CallSync(client->Connect(endpoint_).value(), EchoRequest(4));
  const auto served_in = std::chrono::steady_clock::now() - asked;
  std::this_thread::sleep_for(500ms);
  const auto stop = std::chrono::steady_clock::now();
  server_->Stop();
  const auto stopped_in = std::chrono::steady_clock::now() - stop;
  flood.Kill(SIGKILL);
  EXPECT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_LT(served_in, 2s);
  EXPECT_LT(stopped_in, 1s);
  std::printf("beside a greeting flood a client was served in %lld ms; Stop() took %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(served_in).count()),
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(stopped_in).count()));
}

TEST_F(MessageAuthTest, RecordedSessionIsRefusedByAnotherServerOrGreeting) {
  std::vector<std::string> recorded;
  {
    RawJobPeer peer(endpoint_, *Auth(kSecret));
    recorded = peer.Signed(4, 0, 1);
  }
  // Played to a new server (a restarted one), over a connection of its own.
  auto other = RpcNode::Create(Options("server-2", Auth(kSecret))).value();
  std::atomic<int> other_served{0};
  other->RegisterSync(kEcho, [&](const Message&, Message*) {
    other_served.fetch_add(1);
    return Status::OK();
  });
  const std::string other_endpoint = other->Listen("127.0.0.1:0").value();
  RawJobPeer replayer(other_endpoint, *Auth(kSecret));
  replayer.Send(recorded);
  EXPECT_TRUE(replayer.Receive(1500ms).empty());
  EXPECT_EQ(other_served.load(), 0);
}

// The trailer of a message, computed here in one thread from the format
// van_auth.h documents: one Poly1305 tag over the id, the 16-byte-padded
// lengths and the padded parts, or over more than van_auth::kChunkBytes,
// over the tags of each part's chunks; one-time keys from the ChaCha20
// keystream (message s: bytes 32 (s mod 64) of nonce (direction, s / 64);
// chunk i: the first 32 bytes of nonce (direction | (i + 1) << 8, s)).
std::string DocumentedTrailer(const std::string& key, van_auth::Direction direction,
                              const std::string& id, uint64_t sequence,
                              const std::vector<std::string>& parts) {
  auto le64 = [](uint64_t v) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
    return out;
  };
  auto padded = [](std::string s) { return s.append((16 - s.size() % 16) % 16, '\0'); };
  // 64 bytes of keystream: block `counter` of nonce (word, rest).
  auto block = [&](uint32_t counter, uint32_t word, uint64_t rest) {
    unsigned char iv[16], out[64];
    const unsigned char zeros[64] = {};
    std::memcpy(iv, &counter, 4);
    std::memcpy(iv + 4, &word, 4);
    std::memcpy(iv + 8, le64(rest).data(), 8);
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    int len = 0;
    EXPECT_EQ(EVP_EncryptInit_ex(ctx, EVP_chacha20(), nullptr,
                                 reinterpret_cast<const unsigned char*>(key.data()), iv), 1);
    EXPECT_EQ(EVP_EncryptUpdate(ctx, out, &len, zeros, 64), 1);
    EVP_CIPHER_CTX_free(ctx);
    return std::string(reinterpret_cast<const char*>(out), 64);
  };
  auto tag = [](const std::string& one_time_key, const std::string& data) {
    unsigned char out[16];
    size_t len = 0;
    EXPECT_NE(EVP_Q_mac(nullptr, "POLY1305", nullptr, nullptr, nullptr, one_time_key.data(), 32,
                        reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
                        sizeof out, &len),
              nullptr);
    EXPECT_EQ(len, 16u);
    return std::string(reinterpret_cast<const char*>(out), 16);
  };
  const auto dir = static_cast<uint32_t>(direction);
  const auto within = static_cast<uint32_t>(sequence % 64);
  const std::string message_key = block(within / 2, dir, sequence / 64).substr(within % 2 * 32, 32);
  auto chunk_key = [&](uint32_t chunk) {
    return block(0, dir | chunk << 8, sequence).substr(0, 32);
  };
  std::string lengths = le64(sequence) + le64(parts.size());
  size_t total = 0;
  for (const std::string& p : parts) {
    lengths += le64(p.size());
    total += p.size();
  }
  std::string message = id + padded(lengths);
  uint32_t chunk = 0;
  for (const std::string& p : parts) {
    if (total <= van_auth::kChunkBytes) message += padded(p);
    const size_t k = van_auth::kChunkBytes;
    for (size_t at = 0; total > k && at < p.size(); at += k) {
      message += tag(chunk_key(++chunk), p.substr(at, k));
    }
  }
  return id + le64(sequence) + tag(message_key, message);
}

TEST(VanAuthTest, TagDependsOnEveryByteOnlyAndNotOnThePreviousMessage) {
  const std::string key(32, 'k'), id(van_auth::kIdBytes, 'i');
  const std::string a = "header", b(70000, 'x');
  const std::vector<van_auth::Part> parts = {{a.data(), a.size()}, {b.data(), b.size()}};
  // A thread's cipher context is reused from message to message: a tag
  // must come out the same on a fresh thread.
  const std::string first = van_auth::Trailer(key, van_auth::Direction::kToServer, id, 7, parts);
  const std::string again = van_auth::Trailer(key, van_auth::Direction::kToServer, id, 7, parts);
  std::string fresh;
  std::thread([&] { fresh = van_auth::Trailer(key, van_auth::Direction::kToServer, id, 7, parts); }).join();
  EXPECT_EQ(first, again);
  EXPECT_EQ(first, fresh);
  EXPECT_EQ(first, DocumentedTrailer(key, van_auth::Direction::kToServer, id, 7, {a, b}));
  EXPECT_TRUE(van_auth::Verify(key, van_auth::Direction::kToServer, first, parts));
  EXPECT_FALSE(van_auth::Verify(key, van_auth::Direction::kToClient, first, parts));
  // Moving a byte from one part to the next keeps the concatenation but
  // not the tag (lengths are signed).
  const std::string a2 = "heade", b2 = "r" + b;
  const std::vector<van_auth::Part> shifted = {{a2.data(), a2.size()}, {b2.data(), b2.size()}};
  EXPECT_FALSE(van_auth::Verify(key, van_auth::Direction::kToServer, first, shifted));
}

// The tag's data goes to OpenSSL in few calls: small parts gathered in a
// buffer, large ones from their own memory with their tails gathered.
// Whatever the mix of sizes, the bytes hashed are the documented ones.
TEST(VanAuthTest, PartsOfEverySizeAndCountAreTaggedAsDocumented) {
  const std::string key(32, 'k'), id(van_auth::kIdBytes, 'i');
  auto part = [](size_t size, char seed) {
    std::string p(size, '\0');
    for (size_t i = 0; i < size; ++i) p[i] = static_cast<char>(seed + i * 7);
    return p;
  };
  std::vector<std::vector<std::string>> messages = {
      {},
      {part(0, 'a')},
      {part(72, 'h'), part(8000, 'k'), part(4000, 'v')},
      {part(255, 'a'), part(256, 'b'), part(257, 'c'), part(15, 'd'), part(1001, 'e')},
      {part(3, 'a'), part(0, 'b'), part(4097, 'c'), part(600, 'd'), part(16, 'e'), part(17, 'f')},
  };
  // More parts than the gathering buffer holds lengths for (each 8 bytes).
  std::vector<std::string> many;
  for (int i = 0; i < 300; ++i) many.push_back(part(i % 40, static_cast<char>(i)));
  messages.push_back(many);
  for (const std::vector<std::string>& parts : messages) {
    std::vector<van_auth::Part> spans;
    for (const std::string& p : parts) spans.push_back({p.data(), p.size()});
    const std::string trailer = van_auth::Trailer(key, van_auth::Direction::kToClient, id, 9, spans);
    EXPECT_EQ(trailer, DocumentedTrailer(key, van_auth::Direction::kToClient, id, 9, parts))
        << parts.size() << " parts";
    EXPECT_TRUE(van_auth::Verify(key, van_auth::Direction::kToClient, trailer, spans));
  }
}

TEST(VanAuthTest, LargeMessagesAreTaggedByChunksAsDocumentedAndBindEveryByte) {
  const std::string key(32, 'k'), id(van_auth::kIdBytes, 'i');
  // Three chunks and a half, split so that chunks straddle the parts.
  std::string a(van_auth::kChunkBytes / 2 + 3, 'a'), b(3 * van_auth::kChunkBytes + 1000, 'b');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i * 131 + (i >> 11));
  std::vector<std::string> parts = {"hdr", a, b};
  auto spans = [](const std::vector<std::string>& ps) {
    std::vector<van_auth::Part> out;
    for (const std::string& p : ps) out.push_back({p.data(), p.size()});
    return out;
  };
  const auto dir = van_auth::Direction::kToClient;
  const std::string trailer = van_auth::Trailer(key, dir, id, 41, spans(parts));
  EXPECT_EQ(trailer, DocumentedTrailer(key, dir, id, 41, parts));
  std::string fresh;
  std::thread([&] { fresh = van_auth::Trailer(key, dir, id, 41, spans(parts)); }).join();
  EXPECT_EQ(trailer, fresh);
  EXPECT_TRUE(van_auth::Verify(key, dir, trailer, spans(parts)));
  EXPECT_FALSE(van_auth::Verify(key, van_auth::Direction::kToServer, trailer, spans(parts)));
  // One byte changed in any chunk, or moved from one part to the next.
  for (size_t at : {size_t{0}, van_auth::kChunkBytes - 4, 2 * van_auth::kChunkBytes + 7,
                    b.size() - 1}) {
    std::vector<std::string> changed = parts;
    changed[2][at] ^= 1;
    EXPECT_FALSE(van_auth::Verify(key, dir, trailer, spans(changed))) << "byte " << at;
  }
  std::vector<std::string> shifted = parts;
  shifted[2].insert(shifted[2].begin(), shifted[1].back());
  shifted[1].pop_back();
  EXPECT_FALSE(van_auth::Verify(key, dir, trailer, spans(shifted)));
  // Two chunks of equal length swapped.
  std::vector<std::string> swapped = parts;
  const size_t c1 = van_auth::kChunkBytes - a.size() - 3;  // chunk 1 starts here in b
  std::swap_ranges(swapped[2].begin() + c1, swapped[2].begin() + c1 + van_auth::kChunkBytes,
                   swapped[2].begin() + c1 + van_auth::kChunkBytes);
  EXPECT_FALSE(van_auth::Verify(key, dir, trailer, spans(swapped)));
}

// SessionKeys::For derives keys 64 at a time and keeps the last two
// batches. Whatever order the numbers come in (neighbours swapped, one
// batch back, far back, far ahead), each message gets the key derived for
// it alone (Once), the documented one, and no two messages share a key.
TEST(VanAuthTest, BatchedKeysAreEachMessagesOwnInAnyOrder) {
  const std::string key(32, 'k'), id(van_auth::kIdBytes, 'i');
  const auto dir = van_auth::Direction::kToServer;
  van_auth::SessionKeys keys(key, dir);
  const van_auth::SessionKeys replies(key, van_auth::Direction::kToClient);
  std::vector<uint64_t> order;
  for (uint64_t s = 0; s < 300; ++s) order.push_back(s);
  for (size_t i = 1; i < order.size(); i += 3) std::swap(order[i - 1], order[i]);
  order.insert(order.begin() + 140, 60);
  order.insert(order.begin() + 250, 3);
  for (uint64_t s : {uint64_t{1} << 40, uint64_t{63}, uint64_t{64}, uint64_t{129}}) {
    order.push_back(s);
  }
  std::set<std::string> distinct;
  for (uint64_t s : order) {
    const van_auth::MessageKeys batched = keys.For(s);
    EXPECT_EQ(batched.sequence, s);
    EXPECT_EQ(batched.one_time, keys.Once(s).one_time) << "message " << s;
    EXPECT_NE(batched.one_time, replies.Once(s).one_time) << "message " << s;
    distinct.insert(std::string(batched.one_time.begin(), batched.one_time.end()));
  }
  EXPECT_EQ(distinct.size(), 301u);  // 0..299 and 2^40
  const std::string header = "header";
  const std::vector<van_auth::Part> parts = {{header.data(), header.size()}};
  for (uint64_t s : {uint64_t{63}, uint64_t{64}, uint64_t{129}, uint64_t{1} << 40}) {
    const std::string trailer = van_auth::Trailer(keys.For(s), id, parts);
    EXPECT_EQ(trailer, DocumentedTrailer(key, dir, id, s, {header})) << "message " << s;
    EXPECT_TRUE(van_auth::Verify(keys.For(s), trailer, parts));
    // The keys of another number do not verify it, even with its tag.
    EXPECT_FALSE(van_auth::Verify(keys.For(s + 1), trailer, parts));
  }
}

TEST(ReplayWindowTest, TakesEachNumberOnceWithin64) {
  van_auth::ReplayWindow w;
  EXPECT_TRUE(w.Accept(5));
  EXPECT_FALSE(w.Accept(5));
  EXPECT_TRUE(w.Accept(3));  // late, not taken yet
  EXPECT_FALSE(w.Accept(3));
  EXPECT_TRUE(w.Accept(200));
  EXPECT_TRUE(w.Accept(137));
  EXPECT_FALSE(w.Accept(136));  // 64 below the highest
  EXPECT_FALSE(w.Accept(5));
}

// ---- KV store ----

class KvAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<KvStoreServer>(
        KvStoreServerOptions{.auth = Auth(kSecret), .auth_window = 5000ms});
    ASSERT_TRUE(server_->Start().ok());
  }
  httplib::Client Raw() { return httplib::Client("127.0.0.1", server_->port()); }
  std::unique_ptr<KvStoreServer> server_;
};

TEST_F(KvAuthTest, RawRequestsWithoutOrWithWrongCredentialGet401And403) {
  auto raw = Raw();
  auto none = raw.Get("/kv/job/key");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(raw.Get("/health")->status, 401);
  EXPECT_EQ(raw.Put("/kv/job/key", "x", "application/octet-stream")->status, 401);

  const std::string path = "/kv/job/key";
  KvRequestSigner wrong(Auth(kOtherSecret));
  auto bad = raw.Get(path, {{KvRequestSigner::kHeader, wrong.Sign("GET", path, "")}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 403);
  EXPECT_EQ(raw.Get(path, {{KvRequestSigner::kHeader, "v1 garbage"}})->status, 403);

  KvRequestSigner right(Auth(kSecret));
  // Signed for another path, an old timestamp, or a tampered body: 403.
  EXPECT_EQ(raw.Get(path, {{KvRequestSigner::kHeader, right.Sign("GET", "/kv/job/other", "")}})
                ->status,
            403);
  EXPECT_EQ(raw.Get(path, {{KvRequestSigner::kHeader,
                            right.SignAt("GET", path, "", 1000, std::string(32, 'a'))}})
                ->status,
            403);
  EXPECT_EQ(raw.Put(path, {{KvRequestSigner::kHeader, right.Sign("PUT", path, "a")}}, "b",
                    "application/octet-stream")
                ->status,
            403);

  // Signed right: served (404: no such key yet), and the same header again
  // is a replay: 403.
  const std::string header = right.Sign("GET", path, "");
  EXPECT_EQ(raw.Get(path, {{KvRequestSigner::kHeader, header}})->status, 404);
  EXPECT_EQ(raw.Get(path, {{KvRequestSigner::kHeader, header}})->status, 403);
  const std::string put = right.Sign("PUT", path, "v");
  EXPECT_EQ(raw.Put(path, {{KvRequestSigner::kHeader, put}}, "v", "application/octet-stream")
                ->status,
            200);
  EXPECT_EQ(raw.Get("/health", {{KvRequestSigner::kHeader, right.Sign("GET", "/health", "")}})
                ->status,
            200);
}

// The read-only routes (/metrics, the job page) also answer Prometheus's
// bearer token, and nothing else does; `read_open` (a store on loopback)
// opens them, never the keys.
TEST(KvReadTokenTest, BearerTokenReadsMetricsAndThePageOnly) {
  const std::string token = "0123456789abcdef-read-only";
  KvStoreServer server(KvStoreServerOptions{.auth = Auth(kSecret),
                                            .metrics = [] { return std::string("m 1\n"); },
                                            .page = "<html>page</html>",
                                            .page_state = [] { return std::string("{}"); },
                                            .read_token = token});
  ASSERT_TRUE(server.Start().ok());
  httplib::Client raw("127.0.0.1", server.port());
  const httplib::Headers bearer = {{"Authorization", "Bearer " + token}};
  const httplib::Headers wrong = {{"Authorization", "Bearer " + token + "x"}};
  for (const char* path : {"/metrics", "/job", "/job/state"}) {
    SCOPED_TRACE(path);
    auto ok = raw.Get(path, bearer);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    EXPECT_EQ(raw.Get(path)->status, 401);
    EXPECT_EQ(raw.Get(path, wrong)->status, 401);
  }
  EXPECT_EQ(raw.Get("/metrics", bearer)->body, "m 1\n");
  // The token reads nothing else, and writes nothing.
  EXPECT_EQ(raw.Get("/kv/job/key", bearer)->status, 401);
  EXPECT_EQ(raw.Put("/kv/job/key", bearer, "x", "application/octet-stream")->status, 401);

  KvStoreServer open(KvStoreServerOptions{
      .auth = Auth(kSecret), .metrics = [] { return std::string("m 1\n"); }, .read_open = true});
  ASSERT_TRUE(open.Start().ok());
  httplib::Client anyone("127.0.0.1", open.port());
  EXPECT_EQ(anyone.Get("/metrics")->status, 200);
  EXPECT_EQ(anyone.Get("/kv/job/key")->status, 401);
}

TEST_F(KvAuthTest, SignedClientWorksOthersGetFailedPrecondition) {
  KvStoreClient job(server_->endpoint(), "job", {.auth = Auth(kSecret)});
  ASSERT_TRUE(job.Set("a/b c", "value").ok());
  EXPECT_EQ(job.Get("a/b c").value(), "value");
  EXPECT_EQ(job.Add("n", 5).value(), 5);
  EXPECT_EQ(job.List("a/").value(), std::vector<std::string>{"a/b c"});
  EXPECT_EQ(job.WaitGet("a/b c", 1s).value(), "value");
  EXPECT_TRUE(job.Delete("n").ok());

  KvStoreClient unsigned_client(server_->endpoint(), "job");
  auto none = unsigned_client.Get("a/b c");
  ASSERT_EQ(none.status().code(), StatusCode::kFailedPrecondition) << none.status().ToString();
  EXPECT_NE(none.status().message().find("job secret"), std::string::npos);
  KvStoreClient other(server_->endpoint(), "job", {.auth = Auth(kOtherSecret)});
  EXPECT_EQ(other.Set("a/b c", "forged").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(job.Get("a/b c").value(), "value");
}

using ::fleet::testing::RawConnection;

// Slowloris: 1,100 strangers each send the start of a request and then one
// byte every 200 ms, never finishing it. The job's client is still served
// (it once waited behind them for one of the server's 1,024 threads, and
// failed with "Read" once they were all taken).
TEST_F(KvAuthTest, StrangersTricklingBytesDoNotStarveTheJobsClient) {
  constexpr int kStrangers = 1100;
  RaiseOpenFileLimit();
  std::vector<std::unique_ptr<RawConnection>> strangers;
  for (int i = 0; i < kStrangers; ++i) {
    strangers.push_back(std::make_unique<RawConnection>(server_->port()));
    if (!strangers.back()->connected()) GTEST_SKIP() << "cannot open 2200 descriptors here";
    ASSERT_TRUE(strangers.back()->Send("GET /health HTTP/1.1\r\n"));
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done.load()) {
      for (auto& c : strangers) c->Send("X");
      std::this_thread::sleep_for(200ms);  // the attack's pace, not a wait for anything
    }
  });
  KvStoreClient job(server_->endpoint(), "job",
                    {.request_timeout = 2s, .auth = Auth(kSecret)});
  const auto served = std::chrono::steady_clock::now();
  Status first_failure;
  for (int i = 0; i < 20 && first_failure.ok(); ++i) {
    const std::string key = "k" + std::to_string(i);
    first_failure = job.Set(key, "v");
    if (first_failure.ok()) first_failure = job.Get(key).status();
  }
  const auto took = std::chrono::steady_clock::now() - served;
  done.store(true);
  trickle.join();
  EXPECT_TRUE(first_failure.ok()) << first_failure.ToString();
  std::printf("20 sets and gets beside 1100 slowloris connections: %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
}

// A stranger's 300 MB PUT is answered on its headers: the body is never
// read (no memory is spent on it). A forged but well-formed credential is
// refused on the headers too (its signature covers the headers and the
// body's digest, so it is checked before any body byte), and so is the
// job's own request whose body is over the limit or of unknown length.
TEST_F(KvAuthTest, LargeBodiesAreRefusedOnTheHeadersBeforeAnyIsRead) {
  const std::string head = "PUT /kv/job/key HTTP/1.1\r\nHost: x\r\nContent-Length: 314572800\r\n";
  struct Case {
    std::string headers;
    std::string status_line;
  };
  KvRequestSigner wrong(Auth(kOtherSecret));
  KvRequestSigner right(Auth(kSecret));
  const std::string zero_mac = "X-Fleet-Auth: v2 " + std::to_string(std::time(nullptr) * 1000) +
                               " " + std::string(32, 'a') + " " + std::string(64, 'b') + " " +
                               std::string(64, '0') + "\r\n\r\n";
  const std::string chunked = "PUT /kv/job/key HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n";
  const std::vector<Case> cases = {
      {head + "\r\n", "HTTP/1.1 401"},
      {head + zero_mac, "HTTP/1.1 403"},
      {head + "X-Fleet-Auth: " + wrong.Sign("PUT", "/kv/job/key", "") + "\r\n\r\n",
       "HTTP/1.1 403"},
      {chunked + "X-Fleet-Auth: " + wrong.Sign("PUT", "/kv/job/key", "") + "\r\n\r\n",
       "HTTP/1.1 403"},
      {head + "X-Fleet-Auth: " + right.Sign("PUT", "/kv/job/key", "") + "\r\n\r\n",
       "HTTP/1.1 413"},
      {chunked + "X-Fleet-Auth: " + right.Sign("PUT", "/kv/job/key", "") + "\r\n\r\n",
       "HTTP/1.1 411"},
  };
  for (const Case& c : cases) {
    RawConnection conn(server_->port());
    ASSERT_TRUE(conn.connected());
    ASSERT_TRUE(conn.Send(c.headers));
    // No body is sent: a server that waits for it answers nothing until its
    // read times out, and then not with these codes.
    const std::string reply = conn.ReadAll();
    EXPECT_EQ(reply.rfind(c.status_line, 0), 0u) << c.headers << "\n-> " << reply;
  }
}

// A request from a machine whose clock is off says which way and by how
// much (a host 10 minutes ahead was told "-599 s").
TEST(KvSignerTest, AStaleCredentialSaysWhichWayTheClockIsOff) {
  KvRequestSigner signer(Auth(kSecret));
  const int64_t now = 1'800'000'000'000;
  for (const auto& [offset_s, said] : std::vector<std::pair<int64_t, std::string>>{
           {600, "600 s ahead of this machine's clock"}, {-600, "600 s behind this machine's clock"}}) {
    const std::string header =
        signer.SignAt("GET", "/kv/j/k", "", now + offset_s * 1000, std::string(32, 'n'));
    Result<std::string> verified = signer.VerifyHead(header, "GET", "/kv/j/k", now, 60s);
    ASSERT_FALSE(verified.ok());
    EXPECT_NE(verified.status().message().find(said), std::string::npos)
        << verified.status().ToString();
  }
  EXPECT_TRUE(signer.VerifyHead(signer.SignAt("GET", "/kv/j/k", "", now, std::string(32, 'n')),
                                "GET", "/kv/j/k", now, 60s)
                  .ok());
}

// The job's credential on a body other than the one signed (a request
// changed on the way) is refused once the body is read, and nothing is
// stored.
TEST_F(KvAuthTest, ABodyOtherThanTheSignedOneIsRefused) {
  KvRequestSigner right(Auth(kSecret));
  const std::string path = "/kv/job/changed";
  RawConnection conn(server_->port());
  ASSERT_TRUE(conn.Send("PUT " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n" +
                        "Connection: close\r\nX-Fleet-Auth: " + right.Sign("PUT", path, "signed!") +
                        "\r\n\r\nforged!"));
  const std::string reply = conn.ReadAll();
  EXPECT_EQ(reply.rfind("HTTP/1.1 403", 0), 0u) << reply;
  EXPECT_NE(reply.find("body differs"), std::string::npos) << reply;
  KvStoreClient job(server_->endpoint(), "job", {.auth = Auth(kSecret)});
  EXPECT_TRUE(job.Get("changed").status().IsNotFound());
}

TEST(KvNoAuthTest, ServerWithoutAuthServesUnsignedAndSignedClients) {
  KvStoreServer server(KvStoreServerOptions{});
  ASSERT_TRUE(server.Start().ok());
  KvStoreClient plain(server.endpoint(), "job");
  KvStoreClient signed_client(server.endpoint(), "job", {.auth = Auth(kSecret)});
  ASSERT_TRUE(plain.Set("k", "1").ok());
  EXPECT_EQ(signed_client.Get("k").value(), "1");
}

}  // namespace
}  // namespace fleet
