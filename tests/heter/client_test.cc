// The heter protocol's checks and HeterClient against fake heter workers
// (RpcNodes in this process): order of replies, spreading, resends on a
// failed heter worker, and the errors of bad replies and of a heter worker
// that is gone.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "worker/heter_client.h"

namespace fleet::heter {
namespace {

using namespace std::chrono_literals;

const DenseShape kShape{3, 2, 4};

TrainRequest MakeRequest(int worker, int64_t step, int micro, int micro_batches, int batch) {
  TrainRequest r;
  r.id = {worker, step, micro, micro_batches};
  r.num_workers = 2;
  r.dense_grad_scale = 0.5f;
  r.pooled = SArray<float>(kShape.pooled_floats(batch));
  r.dense = SArray<float>(kShape.dense_floats(batch));
  r.labels = SArray<float>(static_cast<size_t>(batch));
  for (size_t i = 0; i < r.pooled.size(); ++i) r.pooled[i] = 0.01f * i + step;
  for (int b = 0; b < batch; ++b) r.labels[b] = (b + step) % 2;
  return r;
}

// The answer the fakes give: pooled_grad = 2 * pooled, probs = labels,
// loss = step + micro / 10.
TrainReply Answer(const TrainRequest& r) {
  TrainReply a;
  a.id = r.id;
  a.loss = static_cast<float>(r.id.mini_batch) + r.id.micro_batch / 10.0f;
  a.pooled_grad = SArray<float>(r.pooled.size());
  for (size_t i = 0; i < r.pooled.size(); ++i) a.pooled_grad[i] = 2 * r.pooled[i];
  a.probs = SArray<float>(r.labels.data(), r.labels.size());
  return a;
}

RpcNodeOptions FastOptions(const std::string& name) {
  RpcNodeOptions o;
  o.name = name;
  o.handler_threads = 2;
  o.van.heartbeat_interval = 100ms;
  o.van.heartbeat_timeout = 500ms;
  return o;
}

// A heter worker stand-in. `reply` decides what to do with each decoded
// request (reply at once, later, or never).
class FakeHeter {
 public:
  using Behaviour = std::function<void(TrainRequest request, Responder r)>;

  FakeHeter(const std::string& endpoint, Behaviour behaviour) : behaviour_(std::move(behaviour)) {
    auto node = RpcNode::Create(FastOptions("fake_heter"));
    CHECK(node.ok());
    node_ = std::move(node).value();
    node_->Register(pb::HETER_TRAIN, [this](Message m, Responder r) {
      auto req = DecodeTrainRequest(m, kShape);
      if (!req.ok()) return r.ReplyError(req.status());
      ++served_;
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(req->id);
      attempts_.push_back(req->attempt);
      behaviour_(std::move(req).value(), r);
    });
    node_->RegisterSync(pb::HETER_FLUSH, [this](const Message&, Message*) {
      ++flushes_;
      return Status::OK();
    });
    auto bound = node_->Listen(endpoint);
    CHECK(bound.ok()) << bound.status().ToString();
    endpoint_ = bound.value();
  }
  ~FakeHeter() { node_->Stop(); }

  const std::string& endpoint() const { return endpoint_; }
  void Stop() { node_->Stop(); }
  int served() const { return served_.load(); }
  int flushes() const { return flushes_.load(); }
  std::vector<MicroBatchId> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  std::vector<int> attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_;
  }

 private:
  Behaviour behaviour_;
  std::unique_ptr<RpcNode> node_;
  std::string endpoint_;
  std::atomic<int> served_{0}, flushes_{0};
  std::mutex mu_;
  std::vector<MicroBatchId> seen_;
  std::vector<int> attempts_;
};

void ReplyNow(TrainRequest r, Responder resp) { resp.Reply(EncodeTrainReply(Answer(r))); }

HeterClientOptions ClientOptions(std::vector<std::string> heters, int rank) {
  HeterClientOptions o;
  o.heter_workers = std::move(heters);
  o.worker_rank = rank;
  o.num_workers = 2;
  o.shape = kShape;
  o.timeout = 5s;
  o.down_timeout = 1500ms;
  o.log_dir = "log";
  o.van.heartbeat_interval = 100ms;
  o.van.heartbeat_timeout = 500ms;
  return o;
}

std::unique_ptr<HeterClient> MakeClient(const HeterClientOptions& o) {
  auto c = HeterClient::Create(o);
  CHECK(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

void ExpectAnswers(const Completed& c) {
  const TrainReply want = Answer(c.request);
  EXPECT_EQ(c.reply.id, c.request.id);
  EXPECT_FLOAT_EQ(c.reply.loss, want.loss);
  ASSERT_EQ(c.reply.pooled_grad.size(), want.pooled_grad.size());
  for (size_t i = 0; i < want.pooled_grad.size(); ++i) {
    ASSERT_EQ(c.reply.pooled_grad[i], want.pooled_grad[i]) << i;
  }
}

// ---- protocol -------------------------------------------------------------

TEST(HeterProtocolTest, RequestAndReplyRoundTrip) {
  const TrainRequest r = MakeRequest(1, 7, 2, 4, 5);
  Message m = EncodeTrainRequest(r, kShape);
  ASSERT_TRUE(m.Validate().ok());
  auto back = DecodeTrainRequest(m, kShape);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->id, r.id);
  EXPECT_EQ(back->batch(), 5);
  EXPECT_EQ(back->id.contributor(), 1 * 4 + 2);
  EXPECT_EQ(back->id.contributors(2), 8);
  EXPECT_FLOAT_EQ(back->dense_grad_scale, 0.5f);
  // Zero-copy: the decoded arrays are the message's frames.
  EXPECT_EQ(static_cast<const void*>(back->pooled.data()),
            static_cast<const void*>(r.pooled.data()));

  auto reply = DecodeTrainReply(EncodeTrainReply(Answer(r)), r, "h0");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_FLOAT_EQ(reply->loss, 7.2f);
}

// Each way a request can be wrong: a clear InvalidArgument naming the thing.
TEST(HeterProtocolTest, BadRequestsAreRefusedWithTheReason) {
  auto refuse = [](Message m, const std::string& needle, DenseShape shape = kShape) {
    auto r = DecodeTrainRequest(m, shape);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  };
  const TrainRequest good = MakeRequest(1, 3, 0, 2, 4);
  // A config with another model.
  refuse(EncodeTrainRequest(good, kShape), "this heter worker's model has 3 slots x 5",
         DenseShape{3, 5, 4});
  // Ids out of range.
  TrainRequest bad_id = good;
  bad_id.id.micro_batch = 2;
  refuse(EncodeTrainRequest(bad_id, kShape), "unknown micro-batch id");
  bad_id = good;
  bad_id.id.worker_rank = 2;  // of 2 workers
  refuse(EncodeTrainRequest(bad_id, kShape), "unknown micro-batch id");
  // Frames that do not match the declared batch.
  Message short_pooled = EncodeTrainRequest(good, kShape);
  short_pooled.frames[0] = short_pooled.frames[0].Segment(0, 8);
  short_pooled.header.mutable_frames(0)->set_count(2);
  refuse(short_pooled, "pooled embeddings has 2 floats, expected 24");
  Message missing = EncodeTrainRequest(good, kShape);
  missing.frames.pop_back();
  missing.header.mutable_frames()->RemoveLast();
  refuse(missing, "carries 2 frames");
  Message wrong_type = EncodeTrainRequest(good, kShape);
  wrong_type.header.mutable_frames(2)->set_dtype(pb::DT_INT32);
  refuse(wrong_type, "payload frame 2 has type DT_INT32");
  // Non-finite numbers.
  TrainRequest nan = MakeRequest(1, 3, 0, 2, 4);
  nan.pooled[9] = std::nanf("");
  refuse(EncodeTrainRequest(nan, kShape), "non-finite pooled embedding at slot 1, sample 0");
  TrainRequest scale = good;
  scale.dense_grad_scale = -1;
  refuse(EncodeTrainRequest(scale, kShape), "dense_grad_scale");
  Message garbage = EncodeTrainRequest(good, kShape);
  garbage.header.set_meta("\xff\xff\xff");
  refuse(garbage, "does not parse");
}

TEST(HeterProtocolTest, RepliesThatDoNotAnswerTheRequestAreRefused) {
  const TrainRequest r = MakeRequest(0, 4, 1, 2, 3);
  auto refuse = [&](const TrainReply& reply, const std::string& needle) {
    auto got = DecodeTrainReply(EncodeTrainReply(reply), r, "heter worker 1");
    ASSERT_FALSE(got.ok()) << needle;
    EXPECT_TRUE(got.status().IsInvalidArgument());
    EXPECT_NE(got.status().message().find(needle), std::string::npos) << got.status().ToString();
    EXPECT_NE(got.status().message().find("heter worker 1"), std::string::npos);
  };
  TrainReply other = Answer(r);
  other.id.mini_batch = 9;
  refuse(other, "answers unknown micro-batch 1/2 of worker 0 step 9");
  TrainReply short_grad = Answer(r);
  short_grad.pooled_grad = short_grad.pooled_grad.Segment(0, 5);
  refuse(short_grad, "pooled_grad has 5 floats, expected 18");
  TrainReply fewer = Answer(r);
  fewer.probs = fewer.probs.Segment(0, 2);
  refuse(fewer, "is for 2 samples, the micro-batch has 3");
  TrainReply nan_loss = Answer(r);
  nan_loss.loss = std::nanf("");
  refuse(nan_loss, "loss is nan");
}

// ---- client ---------------------------------------------------------------

// Replies in submit order whatever order the heter workers answer in, and
// micro-batches go round robin, worker w starting at heter worker w.
TEST(HeterClientTest, RepliesComeBackInOrderAndSpreadEvenly) {
  // The first heter worker answers its micro-batches late, the second at once.
  FakeHeter slow("127.0.0.1:0", [](TrainRequest r, Responder resp) {
    std::thread([r = std::move(r), resp] {
      std::this_thread::sleep_for(30ms);
      ReplyNow(r, resp);
    }).detach();
  });
  FakeHeter fast("127.0.0.1:0", ReplyNow);
  auto client = MakeClient(ClientOptions({slow.endpoint(), fast.endpoint()}, 1));
  constexpr int kDepth = 3, kSteps = 8;
  int next = 0, done = 0;
  while (done < kSteps) {
    while (next < kSteps && client->in_flight() < kDepth) {
      ASSERT_TRUE(client->Submit(MakeRequest(1, next, 0, 1, 2 + next % 3)).ok());
      ++next;
    }
    auto c = client->WaitOldest();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->request.id.mini_batch, done);
    EXPECT_EQ(c->heter_rank, (1 + done) % 2);  // worker 1 starts at heter worker 1
    ExpectAnswers(*c);
    ++done;
  }
  EXPECT_EQ(slow.served(), 4);
  EXPECT_EQ(fast.served(), 4);
  EXPECT_EQ(client->resends(), 0);
  EXPECT_GT(client->blocked_seconds(), 0.0);
  ASSERT_TRUE(client->Flush().ok());
  EXPECT_EQ(slow.flushes(), 1);
  EXPECT_EQ(fast.flushes(), 1);
}

// A heter worker that answers a micro-batch with the wrong size or another
// micro-batch's id fails the pipeline with a clear error; no crash, and the
// error sticks.
TEST(HeterClientTest, AWrongReplyFailsThePipelineNamingTheHeterWorker) {
  FakeHeter wrong_size("127.0.0.1:0", [](TrainRequest r, Responder resp) {
    TrainReply a = Answer(r);
    a.pooled_grad = SArray<float>(a.pooled_grad.size() + 1);
    resp.Reply(EncodeTrainReply(a));
  });
  auto client = MakeClient(ClientOptions({wrong_size.endpoint()}, 0));
  ASSERT_TRUE(client->Submit(MakeRequest(0, 0, 0, 1, 2)).ok());
  auto c = client->WaitOldest();
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsInvalidArgument()) << c.status().ToString();
  EXPECT_NE(c.status().message().find("heter worker 0 (" + wrong_size.endpoint() +
                                      ", log log/heterlog.0)"),
            std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("pooled_grad has 13 floats, expected 12"), std::string::npos);
  EXPECT_FALSE(client->Submit(MakeRequest(0, 1, 0, 1, 2)).ok());  // sticky

  FakeHeter wrong_id("127.0.0.1:0", [](TrainRequest r, Responder resp) {
    TrainReply a = Answer(r);
    a.id.micro_batch = 5;
    resp.Reply(EncodeTrainReply(a));
  });
  auto client2 = MakeClient(ClientOptions({wrong_id.endpoint()}, 0));
  ASSERT_TRUE(client2->Submit(MakeRequest(0, 0, 0, 1, 2)).ok());
  auto c2 = client2->WaitOldest();
  ASSERT_FALSE(c2.ok());
  EXPECT_NE(c2.status().message().find("answers unknown micro-batch 5/1"), std::string::npos)
      << c2.status().ToString();

  // An error the heter worker replies with is final too, and names it.
  FakeHeter refusing("127.0.0.1:0", [](TrainRequest, Responder resp) {
    resp.ReplyError(Status::InvalidArgument("label outside [0, 1]", "sample 3"));
  });
  auto client3 = MakeClient(ClientOptions({refusing.endpoint()}, 0));
  ASSERT_TRUE(client3->Submit(MakeRequest(0, 0, 0, 1, 2)).ok());
  auto c3 = client3->WaitOldest();
  ASSERT_FALSE(c3.ok());
  EXPECT_TRUE(c3.status().IsInvalidArgument());
  EXPECT_NE(c3.status().message().find("heter worker 0"), std::string::npos);
  EXPECT_NE(c3.status().message().find("label outside [0, 1]: sample 3"), std::string::npos);
  EXPECT_EQ(client3->resends(), 0);

  // A failure of the heter worker's own work (here its push to the servers
  // timed out) travels in the reply: an answer, not a lost heter worker, so
  // it is not resent even though its code is Timeout.
  FakeHeter push_failed("127.0.0.1:0", [](TrainRequest r, Responder resp) {
    resp.Reply(
        EncodeFailureReply(r.id, Status::Timeout("push_dense_grad got no reply", "server 0")));
  });
  auto client4 = MakeClient(ClientOptions({push_failed.endpoint()}, 0));
  ASSERT_TRUE(client4->Submit(MakeRequest(0, 0, 0, 1, 2)).ok());
  auto c4 = client4->WaitOldest();
  ASSERT_FALSE(c4.ok());
  EXPECT_TRUE(c4.status().IsTimeout()) << c4.status().ToString();
  EXPECT_NE(c4.status().message().find("heter worker 0"), std::string::npos)
      << c4.status().ToString();
  EXPECT_NE(c4.status().message().find("push_dense_grad got no reply: server 0"),
            std::string::npos);
  EXPECT_EQ(client4->resends(), 0);
  EXPECT_EQ(push_failed.served(), 1);
}

// A heter worker that takes requests and never answers: each call fails at
// its deadline, is resent (to the same one: it is the only one), and once it
// has been failing for down_timeout the pipeline fails naming it.
TEST(HeterClientTest, AHeterWorkerThatStopsAnsweringFailsTheJobInTime) {
  std::mutex mu;
  std::vector<Responder> kept;
  FakeHeter silent("127.0.0.1:0", [&](TrainRequest, Responder resp) {
    std::lock_guard<std::mutex> lock(mu);
    kept.push_back(resp);
  });
  auto o = ClientOptions({silent.endpoint()}, 0);
  o.timeout = 300ms;
  o.down_timeout = 600ms;
  // Its log is on this machine (as in a simulation): the error quotes it.
  o.log_dir = ::testing::TempDir() + "/heter_client_silent";
  std::filesystem::create_directories(o.log_dir);
  {
    std::ofstream log(o.log_dir + "/heterlog.0");
    for (int i = 0; i < 12; ++i) log << "line " << i << "\n";
  }
  auto client = MakeClient(o);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(client->Submit(MakeRequest(0, 0, 0, 1, 2)).ok());
  auto c = client->WaitOldest();
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsUnavailable()) << c.status().ToString();
  EXPECT_NE(c.status().message().find("heter worker 0 (" + silent.endpoint()), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("Distributed.heter.down_timeout_ms is 600"),
            std::string::npos);
  EXPECT_NE(c.status().message().find("Timeout"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find("the last 10 lines of its log:\n  | line 2\n"),
            std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("  | line 11"), std::string::npos);
  // First deadline (300 ms) + the window (600 ms), with slack for a loaded machine.
  EXPECT_LT(took, 3s);
  EXPECT_GE(took, 850ms);
  silent.Stop();
}

// One of two heter workers dies mid-run: what it had in flight is resent to
// the other one with attempt 1; when it comes back on the same endpoint (as
// fleetrun --max_restart does) it gets micro-batches again; nothing fails.
TEST(HeterClientTest, MicroBatchesOfADeadHeterWorkerAreResentAndItIsUsedAgainWhenBack) {
  std::mutex mu;
  std::vector<std::pair<TrainRequest, Responder>> held;
  auto dying = std::make_unique<FakeHeter>("127.0.0.1:0", [&](TrainRequest r, Responder resp) {
    std::lock_guard<std::mutex> lock(mu);
    held.emplace_back(std::move(r), resp);  // never answered: it will die with them
  });
  const std::string dying_endpoint = dying->endpoint();
  FakeHeter healthy("127.0.0.1:0", ReplyNow);
  auto o = ClientOptions({dying_endpoint, healthy.endpoint()}, 0);
  o.down_timeout = 5s;
  auto client = MakeClient(o);
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(client->Submit(MakeRequest(0, s, 0, 1, 2)).ok());
  // Steps 0 and 2 went to the dying one.
  while (dying->served() < 2) std::this_thread::sleep_for(5ms);
  dying->Stop();
  std::map<int64_t, int> attempts;
  for (int s = 0; s < 4; ++s) {
    auto c = client->WaitOldest();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->request.id.mini_batch, s);
    EXPECT_EQ(c->heter_rank, 1);
    ExpectAnswers(*c);
    attempts[s] = c->request.attempt;
  }
  EXPECT_EQ(attempts[0], 1);
  EXPECT_EQ(attempts[1], 0);
  EXPECT_EQ(attempts[2], 1);
  EXPECT_EQ(client->resends(), 2);
  // Back on the same endpoint: probes find it, and it serves again.
  FakeHeter back(dying_endpoint, ReplyNow);
  dying.reset();
  int served_by_back = 0;
  for (int s = 4; s < 40 && served_by_back == 0; ++s) {
    ASSERT_TRUE(client->Submit(MakeRequest(0, s, 0, 1, 2)).ok());
    auto c = client->WaitOldest();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (c->heter_rank == 0) ++served_by_back;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_GT(served_by_back, 0);
}

// The only heter worker fails a micro-batch (its deadline passes) and then
// answers another one before the failed one's probe is due: the answer
// clears its down mark, and the failed micro-batch must go back to it. It
// waited for a probe of a heter worker no longer marked down, forever: a
// ps_worker hung after its heter worker came up late (README.md's by-hand
// heter job, in CI).
TEST(HeterClientTest, AMicroBatchFailedByTheOnlyHeterWorkerIsResentOnceItAnswersAgain) {
  using Clock = std::chrono::steady_clock;
  std::mutex mu;
  Clock::time_point first_sent{};
  std::vector<Responder> never_answered;  // kept: a dropped one replies an error
  // Step 0's first attempt is never answered (its deadline passes at 300
  // ms); step 1, sent 250 ms after it, is answered at 400 ms: after step 0
  // failed and inside the 200 ms before its probe would be due. Resends are
  // answered at once.
  FakeHeter heter("127.0.0.1:0", [&](TrainRequest r, Responder resp) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.id.mini_batch == 0 && r.attempt == 0) {
      first_sent = Clock::now();
      never_answered.push_back(resp);
      return;
    }
    if (r.id.mini_batch == 1) {
      std::thread([resp, r, at = first_sent + 400ms] {
        std::this_thread::sleep_until(at);
        resp.Reply(EncodeTrainReply(Answer(r)));
      }).detach();
      return;
    }
    resp.Reply(EncodeTrainReply(Answer(r)));
  });
  auto o = ClientOptions({heter.endpoint()}, 0);
  o.timeout = 300ms;
  o.down_timeout = 3s;
  auto client = MakeClient(o);
  ASSERT_TRUE(client->Submit(MakeRequest(0, 0, 0, 1, 2)).ok());
  while (heter.served() < 1) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(250ms);
  ASSERT_TRUE(client->Submit(MakeRequest(0, 1, 0, 1, 2)).ok());
  // Bounded here: the fault this test is about never returns.
  auto first = std::async(std::launch::async, [&] { return client->WaitOldest(); });
  if (first.wait_for(5s) != std::future_status::ready) {
    ADD_FAILURE() << "WaitOldest did not return in 5 s: the failed micro-batch was never resent";
    std::fflush(stdout);
    std::_Exit(1);
  }
  Result<Completed> c0 = first.get();
  ASSERT_TRUE(c0.ok()) << c0.status().ToString();
  EXPECT_EQ(c0->request.id.mini_batch, 0);
  EXPECT_EQ(c0->request.attempt, 1);
  ExpectAnswers(*c0);
  Result<Completed> c1 = client->WaitOldest();
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  EXPECT_EQ(c1->request.id.mini_batch, 1);
  ExpectAnswers(*c1);
  EXPECT_EQ(client->resends(), 1);
}

}  // namespace
}  // namespace fleet::heter
