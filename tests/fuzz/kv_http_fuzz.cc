// The KV store's HTTP handlers (comm/kv_store.h) as any process reaching
// the port could call them: the input's bytes are written raw to an
// in-process KvStoreServer (port 0) over TCP, so libmicrohttpd's request
// parser (comm/http_server.h), the routes and every handler (get, long
// poll, put, delete, list, add, health) and the auth check see them. Input: u8 flags (bit 0: the
// server with job credentials, which checks X-Fleet-Auth), then the raw
// request. The same bytes also go to KvRequestSigner::Verify as a header.
// The server must answer or close, and keep serving: after each input a
// fresh connection must get /health answered.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glog/logging.h>

#include "comm/job_auth.h"
#include "comm/kv_store.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace fleet;

const char kSecret[] = "fuzz-secret-fuzz-secret-fuzz-secret-0123";

std::shared_ptr<const JobAuth> Auth() { return JobAuth::FromSecret(kSecret, "fuzz").value(); }

struct Harness {
  std::unique_ptr<KvStoreServer> open, guarded;
  Harness() {
    KvStoreServerOptions o;
    o.max_wait = std::chrono::milliseconds(20);
    open = std::make_unique<KvStoreServer>(o);
    o.auth = Auth();
    guarded = std::make_unique<KvStoreServer>(o);
    CHECK(open->Start().ok());
    CHECK(guarded->Start().ok());
  }
};

// Writes `request`, half-closes when `half_close` (so a cut-off request
// ends at once), and returns what came back (at most 2 s).
std::string Exchange(int port, const std::string& request, bool half_close) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK_GE(fd, 0);
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "kv store gone";
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  if (half_close) shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) reply.append(buf, static_cast<size_t>(n));
  close(fd);
  return reply;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();
  static KvRequestSigner* signer = new KvRequestSigner(Auth());
  fuzz::ByteReader in(data, size);
  KvStoreServer* server = (in.U8() & 1) ? h->guarded.get() : h->open.get();
  const std::string request = in.Rest();
  Exchange(server->port(), request, /*half_close=*/true);
  std::string nonce;
  (void)signer->Verify(request, "GET", "/kv/j/k", "", 0, std::chrono::seconds(60), &nonce);
  // A server that stopped serving fails every try; one empty answer was
  // seen once in 22k runs under ASan (a connection dropped under load, not
  // reproducible alone), so a few tries are allowed.
  std::string health;
  for (int attempt = 0; attempt < 5 && health.find(" 200 ") == std::string::npos; ++attempt) {
    if (attempt > 0) usleep(200 * 1000);
    health = Exchange(h->open->port(), "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                      /*half_close=*/false);
  }
  CHECK(health.find(" 200 ") != std::string::npos) << "kv store stopped answering: " << health;
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  KvRequestSigner signer(Auth());
  auto request = [&](int guarded, const std::string& method, const std::string& target,
                     const std::string& body) {
    std::string s(1, static_cast<char>(guarded));
    s += method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    if (guarded) {
      s += std::string(KvRequestSigner::kHeader) + ": " +
           signer.SignAt(method, target, body, 1700000000000, "nonce-1") + "\r\n";
    }
    if (!body.empty() || method == "PUT" || method == "POST") {
      s += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    s += "\r\n" + body;
    return s;
  };
  for (int g = 0; g < 2; ++g) {
    seeds->push_back(request(g, "PUT", "/kv/job1/rank%2F0", "127.0.0.1:5000"));
    seeds->push_back(request(g, "GET", "/kv/job1/rank%2F0", ""));
    seeds->push_back(request(g, "GET", "/kv/job1/absent?wait_ms=10", ""));
    seeds->push_back(request(g, "DELETE", "/kv/job1/rank%2F0", ""));
    seeds->push_back(request(g, "GET", "/list/job1?prefix=rank", ""));
    seeds->push_back(request(g, "POST", "/add/job1/counter", "3"));
    seeds->push_back(request(g, "GET", "/health", ""));
  }
}
