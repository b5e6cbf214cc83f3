// comm_bench: FleetPS RPC round trips vs a bare ZeroMQ DEALER/ROUTER echo,
// both over tcp://127.0.0.1 in this process, in the same run, so the ratio
// is meaningful on a noisy shared machine.
//
//   build/bin/comm_bench [--seconds=1] [--sizes=64,4194304]
//
// For each payload size it first checks that both echoes return the bytes
// sent, then picks an iteration count from a warm-up so each measurement
// takes about --seconds, alternates the two measurements --rounds times and
// prints min/p50/p99/max round trip, payload bandwidth (both directions) and
// the ratio ours / bare. The FleetPS echo runs three times: plain, with the
// job's default authentication (per-message MACs, comm/van_auth.h; keys from
// a random job secret) and with CURVE encryption (VanOptions::encrypt), and
// the auth and CURVE on / off ratios are printed too.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/zmq_echo.h"
#include "comm/rpc.h"

DEFINE_double(seconds, 1.0, "target duration of each timed measurement");
DEFINE_string(sizes, "64,4194304", "payload sizes in bytes, comma separated");
DEFINE_int32(rounds, 3, "alternations of bare and FleetPS measurements per size");

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kEchoCommand = 1;

// One round trip of `payload` bytes; returns false when the echo is wrong.
using RoundTrip = std::function<bool(bool verify)>;

// The reference: a bare DEALER/ROUTER echo (bench/zmq_echo.h), server and
// client each on a context of its own, as two processes would have (and as
// the two RpcNodes below have).
class BareEcho {
 public:
  explicit BareEcho(size_t size) : payload_(size, 'b'), client_({server_.endpoint()}) {
    for (size_t i = 0; i < payload_.size(); ++i) payload_[i] = static_cast<char>(i * 131);
  }

  bool RoundTrip(bool verify) {
    client_.Send(0, payload_.data(), payload_.size(), bench::BareEchoServer::kEcho,
                 /*zero_copy=*/false);
    zmq::message_t reply = client_.Recv(0);
    if (!verify) return true;
    return reply.size() == payload_.size() &&
           std::equal(payload_.begin(), payload_.end(), static_cast<const char*>(reply.data()));
  }

 private:
  std::string payload_;
  bench::BareEchoServer server_;
  bench::BareEchoClient client_;
};

class FleetEcho {
 public:
  FleetEcho(size_t size, std::shared_ptr<const JobAuth> auth, bool encrypt = false)
      : payload_(size) {
    for (size_t i = 0; i < size; ++i) payload_[i] = static_cast<char>(i * 131);
    RpcNodeOptions so;
    so.name = "bench-server";
    so.van.auth = auth;
    so.van.encrypt = encrypt;
    server_ = RpcNode::Create(so).value();
    server_->RegisterSync(kEchoCommand, [](const Message& req, Message* resp) {
      resp->header.mutable_frames()->CopyFrom(req.header.frames());
      resp->frames = req.frames;
      return Status::OK();
    }, RpcHandlerOptions{.run_on_io_thread = true, .io_thread_if = nullptr});
    const std::string endpoint = server_->Listen("127.0.0.1:0").value();
    RpcNodeOptions co;
    co.name = "bench-client";
    co.van.auth = auth;
    co.van.encrypt = encrypt;
    client_ = RpcNode::Create(co).value();
    peer_ = client_->Connect(endpoint).value();
  }

  bool RoundTrip(bool verify) {
    Message m;
    m.header.set_command(kEchoCommand);
    m.AddFrame(payload_);
    auto reply = client_->CallSync(peer_, std::move(m));
    if (!reply.ok()) {
      LOG(ERROR) << reply.status().ToString();
      return false;
    }
    if (!verify) return true;
    auto back = reply->Frame<char>(0);
    return back.ok() && back->size() == payload_.size() &&
           std::equal(payload_.begin(), payload_.end(), back->data());
  }

 private:
  Bytes payload_;
  std::unique_ptr<RpcNode> server_;
  std::unique_ptr<RpcNode> client_;
  int peer_ = -1;
};

void Run(size_t size, const std::shared_ptr<const JobAuth>& auth) {
  BareEcho bare(size);
  FleetEcho fleet(size, nullptr);
  FleetEcho mac(size, auth);
  FleetEcho curve(size, auth, /*encrypt=*/true);
  RoundTrip bare_rt = [&](bool v) { return bare.RoundTrip(v); };
  RoundTrip fleet_rt = [&](bool v) { return fleet.RoundTrip(v); };
  RoundTrip mac_rt = [&](bool v) { return mac.RoundTrip(v); };
  RoundTrip curve_rt = [&](bool v) { return curve.RoundTrip(v); };
  if (!bare_rt(true) || !fleet_rt(true) || !mac_rt(true) || !curve_rt(true)) {
    std::fprintf(stderr, "echo returned wrong bytes for size %zu; not timing\n", size);
    std::exit(1);
  }
  const int iterations = bench::IterationsFor([&] { fleet_rt(false); }, FLAGS_seconds);
  std::vector<double> bare_us, fleet_us, mac_us, curve_us;
  for (int round = 0; round < FLAGS_rounds; ++round) {
    for (auto [rt, us] : {std::pair{&bare_rt, &bare_us}, {&fleet_rt, &fleet_us},
                          {&mac_rt, &mac_us}, {&curve_rt, &curve_us}}) {
      auto t = bench::TimeEach([&] { (*rt)(false); }, iterations);
      us->insert(us->end(), t.begin(), t.end());
    }
  }
  const auto bs = bench::Summarize(bare_us);
  const auto fs = bench::Summarize(fleet_us);
  const auto ms = bench::Summarize(mac_us);
  const auto cs = bench::Summarize(curve_us);
  const double bytes_per_rt = 2.0 * size;  // request and echo
  std::printf("payload %zu bytes, %d round trips x %d rounds\n", size, iterations, FLAGS_rounds);
  bench::PrintHeader();
  bench::PrintRow("bare zmq echo", bs, bytes_per_rt);
  bench::PrintRow("fleet rpc", fs, bytes_per_rt);
  bench::PrintRow("fleet rpc, auth (MACs)", ms, bytes_per_rt);
  bench::PrintRow("fleet rpc, CURVE", cs, bytes_per_rt);
  std::printf("  ratio fleet/bare: p50 round trip %.2fx, bandwidth %.2fx\n", fs.p50 / bs.p50,
              bs.p50 / fs.p50);
  std::printf("  ratio auth on/off: p50 round trip %.2fx, bandwidth %.2fx\n", ms.p50 / fs.p50,
              fs.p50 / ms.p50);
  std::printf("  ratio CURVE on/off: p50 round trip %.2fx, bandwidth %.2fx\n\n",
              cs.p50 / fs.p50, fs.p50 / cs.p50);
}

}  // namespace
}  // namespace fleet

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  fleet::bench::PrintEnvironment("comm_bench");
  auto secret = fleet::JobAuth::RandomSecret();
  auto auth = fleet::JobAuth::FromSecret(secret.ok() ? *secret : "", "a random job secret");
  if (!auth.ok()) {
    std::fprintf(stderr, "%s\n", auth.status().ToString().c_str());
    return 1;
  }
  for (const auto& s : absl::StrSplit(FLAGS_sizes, ',')) {
    size_t size = 0;
    if (!absl::SimpleAtoi(s, &size)) {
      std::fprintf(stderr, "--sizes: '%s' is not a byte count\n", std::string(s).c_str());
      return 2;
    }
    fleet::Run(size, auth.value());
  }
  return 0;
}
