#include "serve/http_binding.h"

#include <glog/logging.h>

#include <mutex>
#include <optional>

namespace fleet::serve {
namespace {

class StreamAdapter final : public ResponseStream {
 public:
  explicit StreamAdapter(std::shared_ptr<HttpStream> stream) : stream_(std::move(stream)) {}
  bool Write(std::string_view chunk) override { return stream_->Write(chunk); }
  void Close() override { stream_->Close(); }
  bool open() const override { return stream_->open(); }

 private:
  const std::shared_ptr<HttpStream> stream_;
};

// The server's one-shot HttpReply as a Responder: Send or Stream once, open()
// from any thread (the scheduler asks it every step).
class ReplyResponder final : public Responder {
 public:
  explicit ReplyResponder(HttpReply reply) : reply_(std::move(reply)) {}
  void Send(HttpResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    CHECK(reply_.has_value()) << "answered twice";
    reply_->Send(std::move(response));
    reply_.reset();
  }
  std::shared_ptr<ResponseStream> Stream(HttpResponse head) override {
    std::lock_guard<std::mutex> lock(mu_);
    CHECK(reply_.has_value()) << "answered twice";
    stream_ = reply_->Stream(std::move(head));
    reply_.reset();
    return std::make_shared<StreamAdapter>(stream_);
  }
  bool open() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_) return stream_->open();
    return reply_.has_value() && reply_->open();
  }

 private:
  mutable std::mutex mu_;
  std::optional<HttpReply> reply_;      // guarded by mu_; empty once answered
  std::shared_ptr<HttpStream> stream_;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<HttpBinding>> HttpBinding::Start(OpenAiService* service,
                                                        const HttpBindingOptions& options) {
  CHECK(service != nullptr);
  HttpServerOptions o;
  o.listen = options.host + ":" + std::to_string(options.port);
  o.name = "gpt_serve";
  o.admit = [service](const HttpRequest& req) { return service->Admit(req); };
  o.handle = [service](HttpRequest req, HttpReply reply) {
    service->Handle(std::move(req), std::make_shared<ReplyResponder>(std::move(reply)));
  };
  auto http = std::make_unique<HttpServer>(std::move(o));
  FLEET_RETURN_IF_ERROR(http->Start());
  return std::unique_ptr<HttpBinding>(new HttpBinding(std::move(http)));
}

HttpBinding::~HttpBinding() { Stop(); }

void HttpBinding::Stop() { http_->Stop(); }

}  // namespace fleet::serve
