#include "serve/http_binding.h"

#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/strings/numbers.h"
#include "comm/http_listen.h"

namespace fleet::serve {
namespace {

using Clock = std::chrono::steady_clock;

// How long a streamed answer may stay silent before the heartbeat probes
// whether its client is still there.
constexpr std::chrono::milliseconds kHeartbeatAfter{250};
// What a connection thread waits beyond the service's own request timeout.
constexpr std::chrono::seconds kAnswerMargin{30};

ApiRequest Head(const httplib::Request& req) {
  ApiRequest r;
  r.method = req.method;
  r.path = req.path;
  for (const auto& [name, value] : req.headers) r.headers.emplace_back(name, value);
  uint64_t length = 0;
  if (absl::SimpleAtoi(req.get_header_value("Content-Length"), &length)) r.content_length = length;
  return r;
}

void Fill(const ApiResponse& from, httplib::Response* res) {
  res->status = from.status;
  for (const auto& [name, value] : from.headers) res->set_header(name, value);
}

// The service's answer to one request, handed to the connection's thread:
// a whole response, or a stream's head and then its chunks.
class ThreadResponder final : public Responder,
                              public ResponseStream,
                              public std::enable_shared_from_this<ThreadResponder> {
 public:
  void Send(ApiResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    response_ = std::move(response);
    cv_.notify_all();
  }
  std::shared_ptr<ResponseStream> Stream(ApiResponse head, std::string heartbeat) override {
    std::lock_guard<std::mutex> lock(mu_);
    head_ = std::move(head);
    heartbeat_ = std::move(heartbeat);
    cv_.notify_all();
    return shared_from_this();
  }
  bool Write(std::string_view chunk) override {
    if (!open_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    chunks_.emplace_back(chunk);
    cv_.notify_all();
    return true;
  }
  void Close() override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  bool open() const override { return open_; }

  // ---- the connection's thread ----
  // Waits until the answer starts; false when it did not by `deadline`.
  bool WaitForStart(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return response_ || head_; });
  }
  std::optional<ApiResponse> response() {
    std::lock_guard<std::mutex> lock(mu_);
    return response_;
  }
  std::optional<ApiResponse> head() {
    std::lock_guard<std::mutex> lock(mu_);
    return head_;
  }
  // Chunks written since the last call, waiting up to `wait` for one;
  // *closed once the stream ended.
  std::deque<std::string> TakeChunks(std::chrono::milliseconds wait, bool* closed) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, [&] { return !chunks_.empty() || closed_; });
    std::deque<std::string> out;
    out.swap(chunks_);
    *closed = closed_;
    return out;
  }
  const std::string& heartbeat() const { return heartbeat_; }
  // The client left (a write failed) or the answer never came.
  void Gone() { open_ = false; }

 private:
  std::atomic<bool> open_{true};
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ApiResponse> response_, head_;  // guarded by mu_
  std::deque<std::string> chunks_;              // guarded by mu_
  bool closed_ = false;                         // guarded by mu_
  std::string heartbeat_;  // set with head_, read by the connection's thread after
};

}  // namespace

Result<std::unique_ptr<HttpBinding>> HttpBinding::Start(OpenAiService* service,
                                                        const HttpBindingOptions& options) {
  CHECK(service != nullptr);
  std::unique_ptr<HttpBinding> binding(new HttpBinding(service, options));
  binding->Routes();
  httplib::Server& http = *binding->http_;
  binding->port_ = BindHttpServer(http, options.host, options.port);
  if (binding->port_ < 0) {
    return Status::Unavailable("cannot listen on " + options.host + ":" +
                               std::to_string(options.port) + " (in use, or not this host's)");
  }
  binding->listener_ = std::thread([&http] { http.listen_after_bind(); });
  return binding;
}

HttpBinding::HttpBinding(OpenAiService* service, const HttpBindingOptions& options)
    : service_(service), options_(options), http_(std::make_unique<httplib::Server>()) {}

HttpBinding::~HttpBinding() { Stop(); }

void HttpBinding::Stop() {
  http_->stop();
  if (listener_.joinable()) listener_.join();
}

void HttpBinding::Routes() {
  httplib::Server& http = *http_;
  const int threads = options_.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options_.max_body_bytes);

  // The service decides on the headers; a refusal is answered unread.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    ApiAdmission admission = service_->Admit(Head(req));
    if (!admission.refusal) return httplib::Server::HandlerResponse::Unhandled;
    Fill(*admission.refusal, &res);
    // The body was not read: what follows on the connection is not a request.
    res.set_header("Connection", "close");
    res.set_content(admission.refusal->body, admission.refusal->content_type);
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (a body over the limit, a malformed request) in
  // the service's error shape, counted.
  http.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    service_->CountResponse(res.status);
    res.set_content(ErrorBody("the request was refused (HTTP " + std::to_string(res.status) + ")",
                              res.status == 413 ? "invalid_request_error" : "server_error"),
                    "application/json");
  });

  const auto handle = [this](const httplib::Request& req, httplib::Response& res) {
    ApiRequest request = Head(req);
    request.body = req.body;
    auto responder = std::make_shared<ThreadResponder>();
    service_->Handle(std::move(request), responder);
    if (!responder->WaitForStart(Clock::now() + options_.answer_timeout + kAnswerMargin)) {
      responder->Gone();
      service_->CountResponse(500);
      res.status = 500;
      res.set_content(ErrorBody("the server gave no answer in time", "server_error"),
                      "application/json");
      return;
    }
    if (std::optional<ApiResponse> response = responder->response()) {
      Fill(*response, &res);
      res.set_content(response->body, response->content_type);
      return;
    }
    const ApiResponse head = *responder->head();
    Fill(head, &res);
    res.set_chunked_content_provider(
        head.content_type,
        [responder](size_t, httplib::DataSink& sink) {
          bool closed = false;
          std::deque<std::string> chunks = responder->TakeChunks(kHeartbeatAfter, &closed);
          if (chunks.empty() && !closed) chunks.push_back(responder->heartbeat());
          for (const std::string& chunk : chunks) {
            if (!sink.write(chunk.data(), chunk.size())) {
              responder->Gone();
              return false;
            }
          }
          if (closed) sink.done();
          return true;
        },
        [responder](bool success) {
          if (!success) responder->Gone();
        });
  };
  // Every path and method goes to the service, which answers unknown ones.
  http.Get(".*", handle);
  http.Post(".*", handle);
  http.Put(".*", handle);
  http.Delete(".*", handle);
  http.Patch(".*", handle);
}

}  // namespace fleet::serve
