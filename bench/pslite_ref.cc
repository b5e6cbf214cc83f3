#include "bench/pslite_ref.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace fleet::bench {
namespace {

enum Command : uint32_t { kHello = 1, kPull = 2, kPush = 3, kReply = 4 };

// The first frame of every message (ps-lite's Meta, fixed-size here).
struct Meta {
  uint32_t command = 0;
  uint32_t node_id = 0;
  int32_t timestamp = 0;
  uint32_t slice = 0;      // which server's share of the request
  char endpoint[64] = {};  // kHello: the worker's receive endpoint
};

Meta ReadMeta(const zmq::message_t& m) {
  Meta meta;
  if (m.size() != sizeof(Meta)) throw std::runtime_error("pslite_ref: bad meta frame");
  std::memcpy(&meta, m.data(), sizeof(Meta));
  return meta;
}

// Zero-copy send of memory the caller keeps alive (ps-lite's SArray send).
zmq::message_t View(const void* data, size_t size) {
  return zmq::message_t(const_cast<void*>(data), size, nullptr, nullptr);
}

// Zero-copy send of a buffer that ZeroMQ frees when it is done with it.
template <typename T>
zmq::message_t Owned(std::vector<T>&& v) {
  auto* owner = new std::vector<T>(std::move(v));
  return zmq::message_t(
      owner->data(), owner->size() * sizeof(T),
      [](void*, void* hint) { delete static_cast<std::vector<T>*>(hint); }, owner);
}

void SendParts(zmq::socket_t& s, std::vector<zmq::message_t>& parts) {
  for (size_t i = 0; i < parts.size(); ++i)
    s.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

// Receives until the context is shut down, handing each message to `queue`.
void VanLoop(zmq::socket_t& receiver, MessageQueue& queue) {
  for (;;) {
    std::vector<zmq::message_t> parts;
    try {
      bool more = true;
      while (more) {
        zmq::message_t part;
        if (!receiver.recv(part, zmq::recv_flags::none)) continue;
        more = part.more();
        parts.push_back(std::move(part));
      }
    } catch (const zmq::error_t&) {
      break;  // ETERM: shutting down
    }
    queue.Push(std::move(parts));
  }
  queue.Push({});
}

// A frame's bytes as T[], copied into `scratch` when ZeroMQ left them
// misaligned (small frames inside its receive batch).
template <typename T>
const T* Aligned(const zmq::message_t& m, std::vector<T>* scratch) {
  if (reinterpret_cast<uintptr_t>(m.data()) % alignof(T) == 0)
    return static_cast<const T*>(m.data());
  scratch->resize(m.size() / sizeof(T));
  std::memcpy(scratch->data(), m.data(), scratch->size() * sizeof(T));
  return scratch->data();
}

std::string BoundEndpoint(zmq::socket_t& s) { return s.get(zmq::sockopt::last_endpoint); }

}  // namespace

void MessageQueue::Push(std::vector<zmq::message_t> message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(message));
  }
  cv_.notify_one();
}

std::vector<zmq::message_t> MessageQueue::Pop() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty(); });
  auto m = std::move(queue_.front());
  queue_.pop_front();
  return m;
}

// ---------------------------------------------------------------- server

PsLiteServer::PsLiteServer(size_t dim, PsLiteRule rule, const std::string& ip)
    : dim_(dim), rule_(rule), row_floats_(rule.kind == PsLiteRule::kAdagrad ? 2 * dim : dim) {
  receiver_.set(zmq::sockopt::linger, 0);
  receiver_.set(zmq::sockopt::rcvhwm, 0);
  receiver_.bind("tcp://" + ip + ":*");
  endpoint_ = BoundEndpoint(receiver_);
  van_ = std::thread([this] { VanLoop(receiver_, queue_); });
  customer_ = std::thread([this] { Process(); });
}

PsLiteServer::~PsLiteServer() {
  context_.shutdown();
  van_.join();
  customer_.join();
  receiver_.close();
  senders_.clear();
}

void PsLiteServer::Process() {
  for (;;) {
    std::vector<zmq::message_t> m = queue_.Pop();
    if (m.empty()) return;
    // [routing id][meta][keys][vals]
    if (m.size() < 2) continue;
    Handle(m);
  }
}

float* PsLiteServer::Row(uint64_t key) {
  auto [it, inserted] = index_.try_emplace(key, arena_.size());
  if (inserted) {
    arena_.resize(arena_.size() + row_floats_, 0.0f);
    if (rule_.kind == PsLiteRule::kAdagrad)
      std::fill(arena_.end() - dim_, arena_.end(), rule_.initial_g2sum);
  }
  return arena_.data() + it->second;
}

void PsLiteServer::Handle(std::vector<zmq::message_t>& m) {
  const Meta meta = ReadMeta(m[1]);
  if (meta.command == kHello) {
    zmq::socket_t sender(context_, zmq::socket_type::dealer);
    sender.set(zmq::sockopt::linger, 0);
    sender.set(zmq::sockopt::sndhwm, 0);
    sender.connect(std::string(meta.endpoint, strnlen(meta.endpoint, sizeof(meta.endpoint))));
    senders_.insert_or_assign(meta.node_id, std::move(sender));
    return;
  }
  auto sender = senders_.find(meta.node_id);
  if (sender == senders_.end() || m.size() < 3) return;
  std::vector<uint64_t> key_scratch;
  const size_t n = m[2].size() / sizeof(uint64_t);
  const uint64_t* keys = Aligned<uint64_t>(m[2], &key_scratch);
  Meta reply;
  reply.command = kReply;
  reply.timestamp = meta.timestamp;
  reply.slice = meta.slice;
  std::vector<zmq::message_t> parts;
  parts.emplace_back(&reply, sizeof(reply));
  if (meta.command == kPull) {
    std::vector<float> vals(n * dim_);
    for (size_t i = 0; i < n; ++i)
      std::memcpy(vals.data() + i * dim_, Row(keys[i]), dim_ * sizeof(float));
    parts.push_back(std::move(m[2]));  // ps-lite answers a pull with keys and values
    parts.push_back(Owned(std::move(vals)));
  } else if (meta.command == kPush && m.size() >= 4 && m[3].size() == n * dim_ * sizeof(float)) {
    std::vector<float> grad_scratch;
    const float* grads = Aligned<float>(m[3], &grad_scratch);
    const float lr = rule_.learning_rate;
    for (size_t i = 0; i < n; ++i) {
      float* w = Row(keys[i]);
      const float* g = grads + i * dim_;
      if (rule_.kind == PsLiteRule::kSgd) {
        for (size_t j = 0; j < dim_; ++j) w[j] -= lr * g[j];
      } else {
        float* g2 = w + dim_;
        for (size_t j = 0; j < dim_; ++j) {
          g2[j] += g[j] * g[j];
          w[j] -= lr * g[j] / (std::sqrt(g2[j]) + rule_.epsilon);
        }
      }
    }
  }
  SendParts(sender->second, parts);
}

// ---------------------------------------------------------------- worker

struct PsLiteWorker::Request {
  bool push = false;
  float* out = nullptr;  // pull: keys.size() * dim floats
  int expected = 0, received = 0;
  // Several servers: for each slice, the caller's index of each of its keys.
  std::vector<std::vector<uint32_t>> positions;
};

namespace {
uint32_t NewNodeId() {
  static std::atomic<uint32_t> next{0};
  return (static_cast<uint32_t>(::getpid()) << 12) ^ next.fetch_add(1);
}
}  // namespace

PsLiteWorker::PsLiteWorker(const std::vector<std::string>& servers, size_t dim)
    : dim_(dim), node_id_(NewNodeId()) {
  receiver_.set(zmq::sockopt::linger, 0);
  receiver_.set(zmq::sockopt::rcvhwm, 0);
  receiver_.bind("tcp://127.0.0.1:*");
  const std::string endpoint = BoundEndpoint(receiver_);
  van_ = std::thread([this] { VanLoop(receiver_, queue_); });
  customer_ = std::thread([this] { Process(); });
  for (const std::string& s : servers) {
    senders_.emplace_back(context_, zmq::socket_type::dealer);
    zmq::socket_t& sender = senders_.back();
    sender.set(zmq::sockopt::linger, 0);
    sender.set(zmq::sockopt::sndhwm, 0);
    sender.connect(s);
    Meta hello;
    hello.command = kHello;
    hello.node_id = node_id_;
    std::strncpy(hello.endpoint, endpoint.c_str(), sizeof(hello.endpoint) - 1);
    sender.send(zmq::buffer(&hello, sizeof(hello)), zmq::send_flags::none);
  }
}

PsLiteWorker::~PsLiteWorker() {
  context_.shutdown();
  van_.join();
  customer_.join();
  receiver_.close();
  senders_.clear();
}

int PsLiteWorker::ZPull(std::span<const uint64_t> keys, std::span<float> vals) {
  return Send(false, keys, {}, vals.data());
}

int PsLiteWorker::ZPush(std::span<const uint64_t> keys, std::span<const float> vals) {
  return Send(true, keys, vals, nullptr);
}

int PsLiteWorker::Send(bool push, std::span<const uint64_t> keys, std::span<const float> vals,
                       float* out) {
  const int ts = next_timestamp_++;
  auto request = std::make_unique<Request>();
  request->push = push;
  request->out = out;
  const size_t servers = senders_.size();
  // Slices: server s owns keys in [s * 2^64 / S, (s + 1) * 2^64 / S).
  std::vector<std::vector<uint64_t>> slice_keys(servers);
  std::vector<std::vector<float>> slice_vals(servers);
  if (servers > 1) {
    request->positions.resize(servers);
    const uint64_t width = UINT64_MAX / servers + 1;
    for (size_t i = 0; i < keys.size(); ++i) {
      const size_t s = std::min<size_t>(keys[i] / width, servers - 1);
      slice_keys[s].push_back(keys[i]);
      if (push)
        slice_vals[s].insert(slice_vals[s].end(), vals.begin() + i * dim_,
                             vals.begin() + (i + 1) * dim_);
      else
        request->positions[s].push_back(static_cast<uint32_t>(i));
    }
    for (size_t s = 0; s < servers; ++s) request->expected += !slice_keys[s].empty();
  } else {
    request->expected = 1;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_[ts] = std::move(request);
  }
  for (size_t s = 0; s < servers; ++s) {
    if (servers > 1 && slice_keys[s].empty()) continue;
    Meta meta;
    meta.command = push ? kPush : kPull;
    meta.node_id = node_id_;
    meta.timestamp = ts;
    meta.slice = static_cast<uint32_t>(s);
    std::vector<zmq::message_t> parts;
    parts.emplace_back(&meta, sizeof(meta));
    if (servers == 1) {
      parts.push_back(View(keys.data(), keys.size_bytes()));
      if (push) parts.push_back(View(vals.data(), vals.size_bytes()));
    } else {
      parts.push_back(Owned(std::move(slice_keys[s])));
      if (push) parts.push_back(Owned(std::move(slice_vals[s])));
    }
    SendParts(senders_[s], parts);
  }
  return ts;
}

void PsLiteWorker::Process() {
  for (;;) {
    std::vector<zmq::message_t> m = queue_.Pop();
    if (m.empty()) return;
    if (m.size() < 2) continue;
    const Meta meta = ReadMeta(m[1]);
    Request* r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = requests_.find(meta.timestamp);
      if (it == requests_.end()) continue;
      r = it->second.get();
    }
    if (!r->push && m.size() >= 4) {
      const zmq::message_t& vals = m[3];
      if (r->positions.empty()) {
        std::memcpy(r->out, vals.data(), vals.size());
      } else {
        const auto& pos = r->positions[meta.slice];
        const char* src = static_cast<const char*>(vals.data());
        const size_t row = dim_ * sizeof(float);
        if (vals.size() != pos.size() * row) throw std::runtime_error("pslite_ref: bad pull reply");
        for (size_t j = 0; j < pos.size(); ++j)
          std::memcpy(r->out + pos[j] * dim_, src + j * row, row);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (++r->received < r->expected) continue;
    }
    done_.notify_all();
  }
}

void PsLiteWorker::Wait(int timestamp) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(timestamp);
  if (it == requests_.end()) return;
  Request* r = it->second.get();
  // Generous: a request of the bench's shapes takes milliseconds.
  if (!done_.wait_for(lock, std::chrono::seconds(60), [&] { return r->received == r->expected; }))
    throw std::runtime_error("pslite_ref: no reply from every server within 60 s (request " +
                             std::to_string(timestamp) + ")");
  requests_.erase(timestamp);
}

}  // namespace fleet::bench
