// Every PS request kind (ps/ps.proto) as a stranger could send it:
// the fuzzer picks the command, table id, PsRequestMeta bytes, the
// request's deadline and typed payload frames; the request goes over
// loopback ZeroMQ to an in-process PsServer (sync, async or geo mode) and
// through the same path as a worker's (Van -> RpcNode -> handler). A server
// must answer every one and keep serving: a crash, CHECK or sanitizer
// report is a finding; so is a server that stops answering.
// Checkpoints (SAVE/LOAD with any path) go to an in-memory FileSystem.
// Input: u8 server, u8 command, u8 table, field meta, then per frame u8
// dtype + field bytes.
#include <glog/logging.h>

#include <memory>

#include "ps/ps.pb.h"
#include "comm/rpc.h"
#include "ps/server.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace fleet;
using namespace std::chrono_literals;

const char* const kModes[] = {"sync", "async", "geo"};

ps::JobConfig Job(const std::string& mode) {
  auto job = ps::ParseJobConfig(YAML::Load(
      "Distributed: {mode: " + mode + ", timeout_ms: 2000, auth: off}\n"
      "tables:\n"
      "  - {id: 0, kind: sparse, dim: 4, shard_num: 8, max_rows_per_server: 2000,"
      " optimizer: {rule: sgd}}\n"
      "  - {id: 1, kind: sparse, dim: 3, accessor: ctr, shard_num: 8, max_rows_per_server: 2000,"
      " optimizer: {rule: adam}, ctr: {embedx_threshold: 2, nonclk_coeff: 1,"
      " delete_after_unseen_passes: 1}}\n"
      "  - {id: 2, kind: dense, dim: 10, optimizer: {rule: adam}}\n"));
  CHECK(job.ok()) << job.status().ToString();
  return std::move(job).value();
}

struct Harness {
  fuzz::MemFileSystem fs;
  std::vector<std::unique_ptr<ps::PsServer>> servers;
  std::unique_ptr<RpcNode> client;
  std::vector<int> peers;
  int inputs = 0;

  Harness() {
    RpcNodeOptions co;
    co.name = "fuzzer";
    co.default_timeout = 3s;
    client = std::move(RpcNode::Create(co)).value();
    for (const char* mode : kModes) {
      ps::PsServerOptions o;
      o.job = Job(mode);
      o.fs = &fs;
      o.shutdown_grace = 1s;
      auto server = ps::PsServer::Create(o);
      CHECK(server.ok()) << server.status().ToString();
      auto bound = server.value()->Start();
      CHECK(bound.ok()) << bound.status().ToString();
      peers.push_back(client->Connect(bound.value()).value());
      servers.push_back(std::move(server).value());
    }
  }
};

Harness& TheHarness() {
  static Harness* h = new Harness();  // lives until exit: servers keep serving
  return *h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = TheHarness();
  fuzz::ByteReader in(data, size);
  const int server = in.U8() % 3;
  Message req;
  req.header.set_command(in.U8() % 16);
  req.header.set_table_id(static_cast<int8_t>(in.U8()));
  req.header.set_meta(in.Field(1024));
  while (!in.done()) {
    const auto dtype = static_cast<pb::DataType>(in.U8() % 6);
    std::string bytes = in.Field();
    const size_t elem = DataTypeSize(dtype);
    bytes.resize(bytes.size() / elem * elem);
    auto* info = req.header.add_frames();
    info->set_dtype(dtype);
    info->set_count(bytes.size() / elem);
    req.frames.push_back(Bytes(bytes.data(), bytes.size()));
  }
  RpcOptions options;
  options.timeout = 3s;
  auto reply = h.client->CallSync(h.peers[server], std::move(req), options);
  // Whatever the request, the server answers it; Unavailable would mean it
  // stopped serving (or died).
  if (!reply.ok() && reply.status().IsUnavailable()) {
    LOG(FATAL) << "server " << kModes[server] << " stopped answering: " << reply.status().ToString();
  }
  if (++h.inputs % 256 == 0) h.fs.Clear();  // bound what SAVE requests keep in memory
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  auto put_u64 = [](std::vector<uint64_t> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 8);
  };
  auto put_f = [](std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  for (int server = 0; server < 3; ++server) {
    for (int cmd = pb::PS_PULL_SPARSE; cmd <= pb::PS_STOP; ++cmd) {
      const int table = (cmd >= pb::PS_PULL_DENSE && cmd <= pb::PS_INIT_DENSE) ? 2 : cmd % 2;
      pb::PsRequestMeta meta;
      meta.set_worker_rank(0);
      meta.set_step(0);
      meta.set_contributors(1);
      if (cmd == pb::PS_SAVE || cmd == pb::PS_LOAD) meta.set_path("/fuzz/ckpt");
      if (cmd == pb::PS_BARRIER) {
        meta.set_barrier_name("b");
        meta.set_barrier_size(1);
      }
      std::string s;
      s.push_back(static_cast<char>(server));
      s.push_back(static_cast<char>(cmd));
      s.push_back(static_cast<char>(table));
      fuzz::PutField(&s, meta.SerializeAsString());
      const int push_dim = table == 1 ? 3 + 2 : 4;  // ctr pushes show and click too
      switch (cmd) {
        case pb::PS_PULL_SPARSE:
          s.push_back(pb::DT_UINT64);
          fuzz::PutField(&s, put_u64({1, 2, 3}));
          break;
        case pb::PS_PUSH_SPARSE_GRAD:
        case pb::PS_PUSH_SPARSE_DELTA:
          s.push_back(pb::DT_UINT64);
          fuzz::PutField(&s, put_u64({1, 2}));
          s.push_back(pb::DT_FLOAT);
          fuzz::PutField(&s, put_f(std::vector<float>(2 * push_dim, 0.25f)));
          break;
        case pb::PS_PUSH_DENSE_GRAD:
        case pb::PS_PUSH_DENSE_DELTA:
        case pb::PS_INIT_DENSE:
          s.push_back(pb::DT_FLOAT);
          fuzz::PutField(&s, put_f(std::vector<float>(10, 0.5f)));
          break;
        default:
          break;
      }
      seeds->push_back(s);
    }
  }
}
