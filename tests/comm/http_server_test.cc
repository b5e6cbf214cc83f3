// comm/http_server.h: what a request sees, answers given later or streamed,
// and every bound a stranger meets (headers, bodies, dawdling connections,
// connection caps), each checked against the memory and threads it would
// otherwise take.
#include "comm/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/raw_connection.h"

namespace fleet {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using fleet::testing::RawConnection;

// Resident memory of this process, in MiB.
double RssMiB() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

long Threads() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "Threads:") {
      long n = 0;
      status >> n;
      return n;
    }
  }
  return -1;
}

HttpResponse Text(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// A server whose handler echoes what it saw, and whose admission trusts
// requests carrying "X-Trust: yes".
class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = {}) {
    if (!options.admit) {
      options.admit = [](const HttpRequest& req) {
        HttpAdmission a;
        a.trusted = req.Header("x-trust") == "yes";
        a.max_body_bytes = 1 << 20;
        if (req.path == "/refuse") a.refusal = Text(403, "refused on the headers");
        return a;
      };
    }
    if (!options.handle) {
      options.handle = [](HttpRequest req, HttpReply reply) {
        reply.Send(Text(200, req.method + " " + req.path + " q=" + req.Query("q").value_or("-") +
                                 " body=" + std::to_string(req.body.size())));
      };
    }
    server_ = std::make_unique<HttpServer>(std::move(options));
    ASSERT_TRUE(server_->Start().ok());
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(5, 0);
    c.set_connection_timeout(5, 0);
    return c;
  }
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, RequestsSeeDecodedPathQueryAndBody) {
  StartServer();
  RawConnection raw(server_->port());
  ASSERT_TRUE(
      raw.Send("GET /a%20b/c?r=1&q=x%2By+z HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string reply = raw.ReadAll();
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  EXPECT_NE(reply.find("\r\n\r\nGET /a b/c q=x+y z body=0"), std::string::npos) << reply;
  auto c = Client();
  auto put = c.Put("/p", std::string(1000, 'v'), "text/plain");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->body, "PUT /p q=- body=1000");
}

// The answer can come later from another thread; the event thread serves
// others meanwhile. An unanswered reply answers 500; Stop() answers 503.
TEST_F(HttpServerTest, RepliesComeLaterFromAnyThreadAndAreNeverLost) {
  std::mutex mu;
  std::vector<HttpReply> parked;
  HttpServerOptions options;
  options.handle = [&](HttpRequest req, HttpReply reply) {
    if (req.path == "/drop") return;  // the reply dies unanswered
    if (req.path == "/now") return reply.Send(Text(200, "now"));
    std::lock_guard<std::mutex> lock(mu);
    parked.push_back(std::move(reply));
  };
  StartServer(std::move(options));
  std::thread later([&] {
    auto c = Client();
    auto got = c.Get("/later");
    ASSERT_TRUE(got);
    EXPECT_EQ(got->body, "from another thread");
  });
  auto c = Client();
  // Served while /later waits.
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!parked.empty()) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(c.Get("/now")->body, "now");
  EXPECT_EQ(c.Get("/drop")->status, 500);
  {
    std::lock_guard<std::mutex> lock(mu);
    parked.front().Send(Text(200, "from another thread"));
    parked.clear();
  }
  later.join();

  std::thread stopped([&] {
    auto c2 = Client();
    auto got = c2.Get("/waits");
    ASSERT_TRUE(got);
    EXPECT_EQ(got->status, 503);
  });
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!parked.empty()) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  server_->Stop();
  stopped.join();
  std::lock_guard<std::mutex> lock(mu);
  parked.front().Send(Text(200, "too late"));  // dropped, no crash
}

TEST_F(HttpServerTest, StreamsDeliverChunksAsTheyAreWritten) {
  std::shared_ptr<HttpStream> stream;
  std::mutex mu;
  HttpServerOptions options;
  options.handle = [&](HttpRequest, HttpReply reply) {
    HttpResponse head;
    head.content_type = "text/event-stream";
    std::lock_guard<std::mutex> lock(mu);
    stream = reply.Stream(std::move(head));
  };
  StartServer(std::move(options));
  std::thread writer([&] {
    std::shared_ptr<HttpStream> s;
    while (s == nullptr) {
      std::this_thread::sleep_for(2ms);
      std::lock_guard<std::mutex> lock(mu);
      s = stream;
    }
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(s->Write("data: " + std::to_string(i) + "\n\n"));
      std::this_thread::sleep_for(10ms);
    }
    s->Close();
    EXPECT_FALSE(s->Write("after close"));
  });
  auto c = Client();
  std::vector<std::string> chunks;
  auto got = c.Get("/s", [&](const char* data, size_t n) {
    chunks.emplace_back(data, n);
    return true;
  });
  writer.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->get_header_value("Content-Type"), "text/event-stream");
  std::string all;
  for (const auto& chunk : chunks) all += chunk;
  EXPECT_EQ(all, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  EXPECT_GE(chunks.size(), 2u) << "written apart, delivered apart";
}

// A refusal on the headers is answered without reading the body: the
// client sends none and still gets the answer at once. A Content-Length
// over the admitted budget is refused the same way.
TEST_F(HttpServerTest, RefusalsAndOversizedBodiesAreAnsweredBeforeTheBodyIsRead) {
  StartServer();
  for (const auto& [head, status] : std::vector<std::pair<std::string, std::string>>{
           {"PUT /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: 314572800\r\n\r\n", "403"},
           {"PUT /big HTTP/1.1\r\nHost: x\r\nContent-Length: 314572800\r\n\r\n", "413"}}) {
    RawConnection conn(server_->port());
    ASSERT_TRUE(conn.connected());
    ASSERT_TRUE(conn.Send(head));
    const std::string reply = conn.ReadAll();
    EXPECT_EQ(reply.rfind("HTTP/1.1 " + status, 0), 0u) << head << " -> " << reply;
  }
}

// An endless header line (or endless headers) never grows the server past
// its per-connection buffer: 431 once the buffer is full, and the
// connection ends.
TEST_F(HttpServerTest, EndlessHeadersAreCutAtTheBufferSize) {
  StartServer();
  const double before = RssMiB();
  std::vector<std::unique_ptr<RawConnection>> attackers;
  for (int i = 0; i < 8; ++i) {
    attackers.push_back(std::make_unique<RawConnection>(server_->port()));
    ASSERT_TRUE(attackers.back()->Send("GET / HTTP/1.1\r\nX-Long: "));
  }
  // Up to 8 MiB each, 64 MiB in all, until the server closes (the kernel's
  // socket buffers take some after the server stopped reading).
  const std::string block(64 << 10, 'a');
  for (int round = 0; round < 128; ++round) {
    for (auto& a : attackers) a->Send(block);
  }
  for (auto& a : attackers) {
    const std::string reply = a->ReadAll();
    EXPECT_EQ(reply.rfind("HTTP/1.1 431", 0), 0u) << reply.substr(0, 200);
  }
  EXPECT_LT(RssMiB() - before, 16.0);
}

// A stranger who opens a connection and dawdles (slowloris: a byte at a
// time, never finishing the request) is cut after untrusted_request_timeout;
// a trusted connection idles as long as it likes.
TEST_F(HttpServerTest, DawdlingStrangersAreCutTrustedConnectionsStay) {
  HttpServerOptions options;
  options.untrusted_request_timeout = 300ms;
  StartServer(std::move(options));
  RawConnection stranger(server_->port());
  ASSERT_TRUE(stranger.Send("GET / HTTP/1.1\r\n"));
  RawConnection trusted(server_->port());
  ASSERT_TRUE(trusted.Send("GET /t HTTP/1.1\r\nHost: x\r\nX-Trust: yes\r\n\r\n"));
  const auto start = Clock::now();
  for (int i = 0; i < 20 && stranger.Send("X"); ++i) std::this_thread::sleep_for(50ms);
  const std::string cut = stranger.ReadAll();  // returns once the server closed it
  const auto took = Clock::now() - start;
  EXPECT_LT(took, 3s) << "the stranger was not cut";
  EXPECT_GE(took, 250ms);
  std::this_thread::sleep_for(500ms);
  // The trusted connection, idle past the stranger's deadline, still works.
  ASSERT_TRUE(trusted.Send("GET /t2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string replies = trusted.ReadAll();
  EXPECT_NE(replies.find("GET /t2"), std::string::npos) << replies;
}

// Past the cap on untrusted connections (in total and per peer), the oldest
// idle stranger makes room: a newcomer is always served, and the server's
// threads and memory do not grow with the strangers.
TEST_F(HttpServerTest, StrangersOverTheCapMakeRoomForNewcomers) {
  HttpServerOptions options;
  options.max_untrusted_connections = 64;
  options.max_untrusted_connections_per_peer = 32;
  StartServer(std::move(options));
  const long threads = Threads();
  std::vector<std::unique_ptr<RawConnection>> strangers;
  for (int i = 0; i < 200; ++i) {
    strangers.push_back(std::make_unique<RawConnection>(server_->port()));
    ASSERT_TRUE(strangers.back()->connected());
    strangers.back()->Send("GET / HTTP/1.1\r\n");
  }
  auto c = Client();
  const auto start = Clock::now();
  auto got = c.Get("/served");
  ASSERT_TRUE(got) << httplib::to_string(got.error());
  EXPECT_EQ(got->status, 200);
  EXPECT_LT(Clock::now() - start, 1s);
  // Cut connections close as the event thread sees their end.
  const auto deadline = Clock::now() + 2s;
  while (server_->untrusted_connections() > 33 && Clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_LE(server_->untrusted_connections(), 33u);
  EXPECT_EQ(Threads(), threads) << "strangers must not cost threads";
}

// 1,100 strangers trickling bytes (more than any thread-per-connection
// server here allowed) while a client makes 50 requests: each is served
// promptly, on the one event thread.
TEST_F(HttpServerTest, AThousandSlowConnectionsDoNotDelayAClient) {
  RaiseOpenFileLimit();
  StartServer();
  const double before = RssMiB();
  std::vector<std::unique_ptr<RawConnection>> strangers;
  for (int i = 0; i < 1100; ++i) {
    strangers.push_back(std::make_unique<RawConnection>(server_->port()));
    if (!strangers.back()->connected()) GTEST_SKIP() << "cannot open 2200 descriptors here";
    strangers.back()->Send("GET / HTTP/1.1\r\n");
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done.load()) {
      for (auto& s : strangers) s->Send("X");
      std::this_thread::sleep_for(200ms);  // the attack's pace
    }
  });
  auto c = Client();
  std::chrono::nanoseconds worst{0};
  for (int i = 0; i < 50; ++i) {
    const auto start = Clock::now();
    auto got = c.Get("/x");
    worst = std::max(worst, Clock::now() - start);
    ASSERT_TRUE(got) << httplib::to_string(got.error());
    EXPECT_EQ(got->status, 200);
  }
  done.store(true);
  trickle.join();
  EXPECT_LT(worst, 1s);
  EXPECT_LT(RssMiB() - before, 64.0);
}

}  // namespace
}  // namespace fleet
