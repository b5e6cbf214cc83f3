#include "bench/pslite_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace fleet::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A free TCP port on 127.0.0.1 for the scheduler, which ps-lite binds at a
// port it is told (another process may take it meanwhile: Start then fails
// and says so).
Result<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError("socket", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return Status::IOError("cannot find a free port on 127.0.0.1", std::strerror(errno));
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

Result<std::unique_ptr<PsLiteCluster>> PsLiteCluster::Start(const PsLiteClusterOptions& options) {
  std::unique_ptr<PsLiteCluster> cluster(new PsLiteCluster());
  cluster->options_ = options;
  FLEET_ASSIGN_OR_RETURN(const int port, FreePort());
  const std::vector<std::string> argv = {
      options.binary,
      absl::StrCat("--dim=", options.dim),
      absl::StrCat("--rule=", options.rule.kind == TableRule::kAdagrad ? "adagrad" : "sgd"),
      absl::StrCat("--learning_rate=", options.rule.learning_rate),
      absl::StrCat("--initial_g2sum=", options.rule.initial_g2sum),
      absl::StrCat("--epsilon=", options.rule.epsilon)};
  auto env = [&](const char* role) {
    return std::vector<std::string>{absl::StrCat("DMLC_ROLE=", role),
                                    "DMLC_PS_ROOT_URI=127.0.0.1",
                                    absl::StrCat("DMLC_PS_ROOT_PORT=", port),
                                    "DMLC_NODE_HOST=127.0.0.1",
                                    absl::StrCat("DMLC_NUM_SERVER=", options.servers),
                                    absl::StrCat("DMLC_NUM_WORKER=", options.workers)};
  };
  FLEET_ASSIGN_OR_RETURN(Child scheduler, SpawnChild(argv, env("scheduler"), "ps-lite scheduler"));
  cluster->servers_.push_back(std::move(scheduler));
  for (int s = 0; s < options.servers; ++s) {
    FLEET_ASSIGN_OR_RETURN(Child server,
                           SpawnChild(argv, env("server"), absl::StrCat("ps-lite server ", s)));
    cluster->servers_.push_back(std::move(server));
  }
  for (int w = 0; w < options.workers; ++w) {
    FLEET_ASSIGN_OR_RETURN(Child worker,
                           SpawnChild(argv, env("worker"), absl::StrCat("ps-lite worker ", w)));
    cluster->workers_.push_back(std::move(worker));
  }
  // A worker says "ready" once ps::Start returned (every node registered).
  const auto deadline = Clock::now() + options.timeout;
  for (Child& w : cluster->workers_) {
    FLEET_ASSIGN_OR_RETURN(std::string line,
                           ReadLine(w, deadline, "ps::Start (the job coming up)"));
    if (line != "ready")
      return Status::Internal(absl::StrCat(w.name, " said '", line, "' instead of ready"));
  }
  return cluster;
}

PsLiteCluster::~PsLiteCluster() {
  for (Child& w : workers_) (void)WriteLine(w, "quit");
  for (Child& w : workers_) Reap(w, std::chrono::seconds(15));
  for (Child& s : servers_) Reap(s, std::chrono::seconds(15));
}

Result<std::vector<std::string>> PsLiteCluster::Ask(const std::vector<int>& which,
                                                    const std::string& line) {
  for (int w : which) FLEET_RETURN_IF_ERROR(WriteLine(workers_[w], line));
  const auto deadline = Clock::now() + options_.timeout;
  std::vector<std::string> answers;
  const std::string verb = line.substr(0, line.find(' '));
  for (int w : which) {
    FLEET_ASSIGN_OR_RETURN(std::string answer, ReadLine(workers_[w], deadline, "'" + verb + "'"));
    if (answer.rfind("error", 0) == 0) {
      return Status::Corruption(absl::StrCat(workers_[w].name, ": ", verb, ": ", answer.substr(5)));
    }
    answers.push_back(std::move(answer));
  }
  return answers;
}

std::vector<pid_t> PsLiteCluster::client_pids() const {
  std::vector<pid_t> pids;
  for (const Child& c : workers_) pids.push_back(c.pid);
  return pids;
}

std::vector<pid_t> PsLiteCluster::server_pids() const {
  std::vector<pid_t> pids;
  for (const Child& c : servers_) pids.push_back(c.pid);
  return pids;
}

double PsLiteCluster::CpuSeconds(const std::vector<Child>& processes) const {
  double total = 0;
  for (const Child& c : processes) total += ProcessCpuSeconds(c.pid);
  return total;
}

Status PsLiteCluster::Prepare(int window, size_t keys, uint64_t universe,
                              const std::vector<uint64_t>& starts) {
  for (int w = 0; w < static_cast<int>(workers_.size()); ++w) {
    FLEET_RETURN_IF_ERROR(
        Ask({w}, absl::StrCat("prepare ", window, " ", keys, " ", universe, " ", starts[w]))
            .status());
  }
  return Status::OK();
}

Status PsLiteCluster::Verify(size_t n, uint64_t first_index) {
  return Ask({0}, absl::StrCat("verify ", n, " ", first_index)).status();
}

Status PsLiteCluster::Populate(uint64_t universe) {
  return Ask({0}, absl::StrCat("populate ", universe)).status();
}

Result<PsLiteRun> PsLiteCluster::Run(bool push, int64_t ops) {
  std::vector<int> all(workers_.size());
  std::iota(all.begin(), all.end(), 0);
  PsLiteRun run;
  const double client0 = CpuSeconds(workers_), server0 = CpuSeconds(servers_);
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> answers,
                         Ask(all, absl::StrCat("run ", push ? "push" : "pull", " ", ops)));
  run.client_cpu_s = CpuSeconds(workers_) - client0;
  run.server_cpu_s = CpuSeconds(servers_) - server0;
  for (size_t w = 0; w < answers.size(); ++w) {
    std::istringstream in(answers[w]);
    std::string done;
    double wall = 0;
    in >> done >> wall;
    size_t count = 0;
    for (double us; in >> us; ++count) run.lat_us.push_back(us);
    if (done != "done" || count != static_cast<size_t>(ops)) {
      return Status::Corruption(absl::StrCat(workers_[w].name, " answered run with '",
                                             answers[w].substr(0, 60), "...' (", count,
                                             " latencies, expected ", ops, ")"));
    }
    run.wall_s = std::max(run.wall_s, wall);
  }
  return run;
}

}  // namespace fleet::bench
