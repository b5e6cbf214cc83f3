#include "tests/gpt_serve/serve_fixture.h"

#include <glog/logging.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "trainer/checkpoint.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/models/gpt_hf.h"
#include "trainer/models/gpt_lora_files.h"
#include "trainer/optimizer.h"

namespace fleet::serve::testing {

using nlohmann::json;

trainer::GptConfig SmallConfig() {
  trainer::GptConfig c;
  c.vocab_size = 257;  // the byte tokenizer's
  c.max_position_embeddings = 128;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_layers = 2;
  return c;
}

namespace {

std::vector<float> Uniform(size_t n, uint32_t seed, float bound) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-bound, bound);
  std::vector<float> p(n);
  for (float& x : p) x = u(rng);
  return p;
}

}  // namespace

Model::Model(const std::string& device) {
  Result<trainer::GptCompute> c = trainer::CreateGptCompute(device, trainer::Precision::kFp32, 1);
  if (!c.ok()) {
    status = c.status();
    return;
  }
  compute = std::move(*c);
  model = std::move(
      trainer::GptModel::Create(SmallConfig(), compute.backend.get(), compute.kernels.get())
          .value());
  CHECK(model->arena().ParamsFromHost(Uniform(model->arena().size(), 11, 0.4f)).ok());
}

void WriteCheckpoint(trainer::GptModel& model, const std::string& dir) {
  std::filesystem::create_directories(dir);
  // SGD keeps no state: the file holds the parameters alone.
  trainer::Sgd sgd(&model.arena(), 0.1f);
  CHECK(trainer::SaveCheckpoint(dir + "/" + trainer::kGptCheckpointFile, model.arena(), sgd).ok());
}

void WriteAdapterDir(const std::string& dir, const trainer::GptLoraConfig& lora, uint64_t seed,
                     const std::string& base_dir) {
  trainer::GptConfig config = SmallConfig();
  config.lora = lora;
  trainer::CpuBackend backend;
  auto adapters = std::move(trainer::GptLoraAdapters::Create(config, &backend).value());
  trainer::ParamArena& arena = adapters->arena();
  CHECK(arena.ParamsFromHost(Uniform(arena.size(), static_cast<uint32_t>(seed), 0.3f)).ok());
  std::filesystem::create_directories(dir);
  trainer::Sgd sgd(&arena, 0.1f);
  CHECK(trainer::SaveCheckpoint(dir + "/" + trainer::kGptLoraCheckpointFile, arena, sgd).ok());
  const std::string sha = trainer::PretrainedFingerprint(base_dir).value();
  CHECK(trainer::WriteGptLoraManifest(dir, config, base_dir, sha).ok());
}

Streamed ParseStream(const std::string& raw) {
  Streamed s;
  size_t pos = 0;
  bool done = false;
  while (pos < raw.size()) {
    const size_t end = raw.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << raw;
    if (end == std::string::npos) break;
    const std::string event = raw.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind(": ", 0) == 0) continue;  // a comment (keep-alive)
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_FALSE(done) << "an event after [DONE]: " << event;
    if (event == "data: [DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(event.substr(6));
    s.chunks.push_back(j);
    EXPECT_TRUE(j.contains("choices")) << event;
    if (j["choices"].empty()) {
      s.usage = j["usage"];
      continue;
    }
    for (const json& choice : j["choices"]) {
      const size_t index = choice["index"];
      if (s.texts.size() <= index) {
        s.texts.resize(index + 1);
        s.finish_reasons.resize(index + 1);
      }
      EXPECT_TRUE(s.finish_reasons[index].empty()) << "a chunk after the finish: " << event;
      const json& piece = choice.contains("delta") ? choice["delta"]["content"] : choice["text"];
      if (piece.is_string()) s.texts[index] += piece.get<std::string>();
      if (!choice["finish_reason"].is_null()) s.finish_reasons[index] = choice["finish_reason"];
    }
  }
  EXPECT_TRUE(done) << raw;
  return s;
}

ServeOptions Server::Default() {
  ServeOptions o;
  o.service.scheduler.max_batch = 4;
  o.service.scheduler.max_queue = 16;
  o.service.request_timeout = std::chrono::seconds(60);
  return o;
}

Server::Server(ServeOptions options, const std::string& device, const std::string& base_dir,
               const std::vector<std::pair<std::string, std::string>>& adapter_dirs)
    : model_(device) {
  if (!model_.status.ok()) return;
  std::vector<ServedAdapter> served;
  if (!base_dir.empty()) {
    CHECK(trainer::LoadPretrainedGpt(base_dir, SmallConfig(), &model_.model->arena()).ok());
    const std::string sha = trainer::PretrainedFingerprint(base_dir).value();
    for (const auto& [name, dir] : adapter_dirs) {
      auto a = trainer::LoadGptLoraAdapters(dir, SmallConfig(), base_dir, sha,
                                            model_.compute.backend.get());
      CHECK(a.ok()) << a.status().ToString();
      served.push_back({name, a->get()});
      adapters_.push_back(std::move(*a));
    }
  }
  auto server = CompletionServer::Start(model_.model.get(), &tokenizer_, ChatTemplate(),
                                        std::move(served), options);
  CHECK(server.ok()) << server.status().ToString();
  server_ = std::move(*server);
}

std::unique_ptr<httplib::Client> Server::Client() const {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
  c->set_read_timeout(60, 0);
  return c;
}

Reply Server::Post(const std::string& path, const std::string& body,
                   const httplib::Headers& headers) const {
  auto r = Client()->Post(path.c_str(), headers, body, "application/json");
  if (!r) return {};
  return {r->status, json::parse(r->body, nullptr, false), r->body};
}

Reply Server::Get(const std::string& path, const httplib::Headers& headers) const {
  auto r = Client()->Get(path.c_str(), headers);
  if (!r) return {};
  return {r->status, json::parse(r->body, nullptr, false), r->body};
}

}  // namespace fleet::serve::testing
