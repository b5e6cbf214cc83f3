// What gpt_serve's tests share: a small random GPT on the byte tokenizer,
// its checkpoint and LoRA adapter directories on disk, and gpt_serve
// (CompletionServer) over them in this process on a free port, with an
// HTTP client.
#pragma once

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "serve/gpt_serve_app.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_lora.h"

namespace fleet::serve::testing {

// 257 ids (the byte tokenizer's), context 128 (a ChatML conversation's
// markup alone is ~50 bytes), C 32, 4 heads, 2 layers.
trainer::GptConfig SmallConfig();

// A model on `device` with parameters large enough that the logits spread
// over several units (a greedy choice is never a near tie that rounding
// could flip). `status` says why not when the device is missing.
struct Model {
  explicit Model(const std::string& device = "cpu");
  Status status;
  trainer::GptCompute compute;
  std::unique_ptr<trainer::GptModel> model;
};

// Writes `model`'s parameters to <dir>/gpt.ckpt (what gpt_pretrain saves).
void WriteCheckpoint(trainer::GptModel& model, const std::string& dir);

// Writes a LoRA output directory (gpt_lora.ckpt and gpt_lora.json, as a
// LoRA run leaves it) for adapters `lora` with random nonzero A and B from
// `seed`, trained over the base checkpoint in `base_dir`.
void WriteAdapterDir(const std::string& dir, const trainer::GptLoraConfig& lora, uint64_t seed,
                     const std::string& base_dir);

struct Reply {
  int status = -1;
  nlohmann::json body;  // discarded when not JSON (a stream)
  std::string raw;
};

// A stream's events, checked for shape: "data: {...}" events (or keep-alive
// comments), each choice's last chunk with a finish_reason, [DONE] last.
struct Streamed {
  std::vector<std::string> texts;           // per choice index
  std::vector<std::string> finish_reasons;  // per choice index
  nlohmann::json usage;                     // the include_usage chunk's
  std::vector<nlohmann::json> chunks;
};
Streamed ParseStream(const std::string& raw);

// gpt_serve over a Model in this process. With `adapter_dirs` ({name,
// dir}) the model's parameters are those of <base_dir>/gpt.ckpt and the
// adapters are loaded as the program loads them.
class Server {
 public:
  static ServeOptions Default();
  explicit Server(ServeOptions options = Default(), const std::string& device = "cpu",
                  const std::string& base_dir = "",
                  const std::vector<std::pair<std::string, std::string>>& adapter_dirs = {});
  const Status& status() const { return model_.status; }
  CompletionServer& server() { return *server_; }
  int port() const { return server_->port(); }

  std::unique_ptr<httplib::Client> Client() const;
  Reply Post(const std::string& path, const std::string& body,
             const httplib::Headers& headers = {}) const;
  Reply Post(const nlohmann::json& body) const { return Post("/v1/completions", body.dump()); }
  Reply Chat(const nlohmann::json& body) const { return Post("/v1/chat/completions", body.dump()); }
  // GET `path`; its status and body.
  Reply Get(const std::string& path, const httplib::Headers& headers = {}) const;
  std::string Metrics() const { return Get("/metrics").raw; }

 private:
  data::ByteTokenizer tokenizer_;
  Model model_;
  std::vector<std::unique_ptr<trainer::GptLoraAdapters>> adapters_;
  std::unique_ptr<CompletionServer> server_;
};

}  // namespace fleet::serve::testing
