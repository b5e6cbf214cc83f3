#include "comm/cluster.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gflags/gflags.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/kv_store.h"

// The defaults below apply only when neither the flag nor its FLEET_*
// variable is given; see the table in comm/cluster.h.
DEFINE_string(role, "",
              "This process's role: server, worker, heter_worker or collective. Required "
              "(here or in FLEET_ROLE).");
DEFINE_int32(rank, 0, "This process's index within its role, in [0, world_size).");
DEFINE_int32(world_size, 0,
             "Number of processes in this role. 0 derives it from the role's endpoint list "
             "(1 when that is empty).");
DEFINE_string(servers, "", "Comma-separated ip:port list of the parameter servers.");
DEFINE_string(workers, "", "Comma-separated ip:port list of the workers (or collective ranks).");
DEFINE_string(heter_workers, "", "Comma-separated ip:port list of the heter workers.");
DEFINE_string(kv_endpoint, "",
              "host:port of the rendezvous KV store (fleetrun's). Empty: no KV store; "
              "collective mode and endpoint discovery need one.");
DEFINE_string(job_id, "default",
              "Scopes every KV-store key so jobs sharing a store never collide. Give each "
              "concurrent job its own.");
DEFINE_string(auth, "on",
              "on: every message of the job's ZeroMQ traffic is authenticated (values travel in "
              "the clear) and KV store requests are signed, all with keys derived from the job secret "
              "(FLEET_JOB_SECRET or --job_secret_file); off: plain traffic, for trusted "
              "networks only.");
DEFINE_string(job_secret_file, "",
              "File holding the job secret (mode 600; at least 32 characters, e.g. `openssl rand "
              "-hex 32`). Default: FLEET_JOB_SECRET_FILE, else the secret in FLEET_JOB_SECRET.");
DEFINE_string(device, "cpu", "cpu, cuda (the first visible GPU) or cuda:N (gpu, gpu:N also accepted).");

namespace fleet {
namespace {

// One setting's text and where it came from ("--rank", "FLEET_RANK" or
// "--rank (default)"), so errors can name the source.
struct Setting {
  std::string text;
  std::string source;
  bool given = false;  // on the command line or in the environment
};

// The launcher's values stand in for FLEET_* variables `env` lacks.
Setting Lookup(const char* flag, const char* var, const EnvLookup& env,
               const LauncherEnv& launcher) {
  gflags::CommandLineFlagInfo info;
  if (gflags::GetCommandLineFlagInfo(flag, &info) && !info.is_default) {
    return {info.current_value, absl::StrCat("--", flag), true};
  }
  if (std::optional<std::string> value = env(var)) return {*value, var, true};
  if (auto it = launcher.values.find(var); it != launcher.values.end()) {
    return {it->second.first, absl::StrCat(it->second.second, " (", launcher.launcher, "'s)"),
            true};
  }
  return {info.current_value, absl::StrCat("--", flag, " (default)"), false};
}

Result<int> ParseCount(const Setting& s) {
  int value = 0;
  const char* end = s.text.data() + s.text.size();
  auto [ptr, ec] = std::from_chars(s.text.data(), end, value);
  if (s.text.empty() || ec != std::errc() || ptr != end || value < 0) {
    return Status::InvalidArgument(absl::StrCat("bad ", s.source, ": want a non-negative integer"),
                                   absl::StrCat("'", s.text, "'"));
  }
  return value;
}

bool ValidJobId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Port 0 is allowed: in simulation fleetrun passes "ip:0" for processes that
// bind a free port and publish the real one in the KV store (launch/README.md,
// "Endpoints and port 0"); a peer resolves such an entry there.
Result<std::vector<Endpoint>> EndpointsFrom(const Setting& s) {
  return ParseEndpointList(s.text, s.source, EndpointParseOptions{.allow_port_zero = true});
}

// --workers as fleetrun takes it: a bare ip is that ip with port 0 (the
// worker binds a free port and publishes it, should it need one).
Result<std::vector<Endpoint>> WorkerEndpointsFrom(Setting s) {
  std::vector<std::string> items = absl::StrSplit(s.text, ',');
  for (std::string& item : items) {
    if (!item.empty() && item.find(':') == std::string::npos) item += ":0";
  }
  s.text = absl::StrJoin(items, ",");
  return EndpointsFrom(s);
}

// A server's or heter worker's rank when none is given: the position of its
// --endpoint (FLEET_ENDPOINT) in its role's list, so the same --servers list
// on every machine is all a by-hand start needs. nullopt when there is no
// endpoint to look for; InvalidArgument when the list is ambiguous about it.
Result<std::optional<int>> RankFromEndpoint(const ClusterSpec& spec, const EnvLookup& env,
                                            const LauncherEnv& launcher) {
  const std::vector<Endpoint>& list = spec.RoleEndpoints();
  if (spec.role == Role::kWorker || spec.role == Role::kCollective || list.size() < 2) {
    return std::optional<int>();
  }
  const Setting endpoint = Lookup("endpoint", "FLEET_ENDPOINT", env, launcher);
  if (!endpoint.given) return std::optional<int>();
  FLEET_ASSIGN_OR_RETURN(Endpoint mine, ParseEndpoint(endpoint.text, endpoint.source,
                                                      EndpointParseOptions{.allow_port_zero = true}));
  std::vector<int> found;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].host == mine.host && list[i].port == mine.port) found.push_back(static_cast<int>(i));
  }
  if (found.size() == 1) return std::optional<int>(found[0]);
  return Status::InvalidArgument(
      absl::StrCat("no --rank given and ", endpoint.source, " is ",
                   found.empty() ? "not in" : "listed more than once in", " the ",
                   std::string(RoleName(spec.role)), " list: give --rank"),
      absl::StrCat(mine.ToString(), " in ", JoinEndpoints(list)));
}

}  // namespace

// "cuda" is what fleetrun sets (FLEET_DEVICE=cuda:K, like PyTorch); "gpu"
// is accepted as its synonym.
Result<std::string> CanonicalDevice(std::string_view text, std::string_view source) {
  if (text == "cpu") return std::string("cpu");
  if (text == "cuda" || text == "gpu") return std::string("cuda:0");
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view index = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  const bool digits = !index.empty() && index.size() <= 3 &&
                      index.find_first_not_of("0123456789") == std::string_view::npos;
  if ((kind != "gpu" && kind != "cuda") || !digits) {
    return Status::InvalidArgument(
        absl::StrCat("bad ", std::string(source), ": want cpu, cuda or cuda:N"),
        absl::StrCat("'", std::string(text), "'"));
  }
  return absl::StrCat("cuda:", std::string(index));
}

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kServer: return "server";
    case Role::kWorker: return "worker";
    case Role::kHeterWorker: return "heter_worker";
    case Role::kCollective: return "collective";
  }
  return "unknown";
}

Result<Role> ParseRole(std::string_view text, std::string_view source) {
  for (Role role : {Role::kServer, Role::kWorker, Role::kHeterWorker, Role::kCollective}) {
    if (text == RoleName(role)) return role;
  }
  std::string what = "bad role";
  if (!source.empty()) what.append(" in ").append(source);
  what.append(" (want server, worker, heter_worker or collective)");
  std::string which = "'";
  which.append(text).append("'");
  return Status::InvalidArgument(what, which);
}

const std::vector<Endpoint>& ClusterSpec::EndpointsOf(Role role) const {
  switch (role) {
    case Role::kServer: return servers;
    case Role::kHeterWorker: return heter_workers;
    case Role::kWorker:
    case Role::kCollective: break;
  }
  return workers;
}

std::string ClusterSpec::ToString() const {
  return absl::StrCat(std::string(RoleName(role)), " ", rank, "/", world_size, " job=", job_id,
                      " device=", device, " kv=", kv_endpoint ? kv_endpoint->ToString() : "none",
                      " servers=", JoinEndpoints(servers), " workers=", JoinEndpoints(workers),
                      " heter_workers=", JoinEndpoints(heter_workers), " auth=",
                      !auth         ? "off"
                      : credentials ? "on"
                                    : "on (no secret)",
                      launcher_env.empty() ? "" : absl::StrCat(" (from ", launcher_env, ")"));
}

namespace {

// The variables a LauncherEnv is read from, in the order the summary shows them.
constexpr const char* kTorchVariables[] = {"RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "TORCHELASTIC_USE_AGENT_STORE"};
constexpr const char* kPaddleVariables[] = {"TRAINING_ROLE",
                                            "PADDLE_PSERVERS_IP_PORT_LIST",
                                            "PADDLE_TRAINER_ENDPOINTS",
                                            "PADDLE_TRAINERS_NUM",
                                            "PADDLE_TRAINER_ID",
                                            "POD_IP",
                                            "PADDLE_PORT"};

Result<int> LauncherCount(const EnvLookup& env, const char* var, const char* launcher) {
  return ParseCount(Setting{env(var).value_or(""), absl::StrCat(var, " (", launcher, "'s)"), true});
}

Status ReadTorchEnv(const EnvLookup& env, LauncherEnv& out) {
  auto set = [&out](const char* fleet, std::string value, const char* from) {
    out.values[fleet] = {std::move(value), from};
  };
  if (env("RANK")) {
    FLEET_ASSIGN_OR_RETURN(int rank, LauncherCount(env, "RANK", "torchrun"));
    set("FLEET_RANK", std::to_string(rank), "RANK");
  }
  int world = 0;
  if (env("WORLD_SIZE")) {
    FLEET_ASSIGN_OR_RETURN(world, LauncherCount(env, "WORLD_SIZE", "torchrun"));
    set("FLEET_WORLD_SIZE", std::to_string(world), "WORLD_SIZE");
  }
  const std::optional<std::string> addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
  if (addr.has_value() != port.has_value()) {
    return Status::InvalidArgument(
        "torchrun's MASTER_ADDR and MASTER_PORT go together: rank 0 hosts the job's KV store "
        "there; give both",
        addr ? "MASTER_PORT unset" : "MASTER_ADDR unset");
  }
  bool one_host = false;
  if (addr) {
    FLEET_ASSIGN_OR_RETURN(Endpoint master, ParseEndpoint(absl::StrCat(*addr, ":", *port),
                                                          "MASTER_ADDR:MASTER_PORT (torchrun's)"));
    // torchrun's agent hosts its own store on MASTER_PORT when it says so
    // (its static rendezvous, and c10d's since torch 2.4); the job's KV
    // store then takes the next port, which every rank can compute.
    const char* from = "MASTER_ADDR:MASTER_PORT";
    if (env("TORCHELASTIC_USE_AGENT_STORE") == "True") {
      if (master.port >= 65535) {
        return Status::InvalidArgument(
            "under torchrun's agent store rank 0 hosts the job's KV store on MASTER_PORT+1; "
            "give a MASTER_PORT below 65535",
            absl::StrCat("MASTER_PORT=", *port));
      }
      ++master.port;
      from = "MASTER_ADDR:MASTER_PORT+1";
    }
    set("FLEET_KV_ENDPOINT", master.ToString(), from);
    out.host_kv_store = master.ToString();
    one_host = master.host.starts_with("127.") || master.host == "localhost";
  }
  if (env("LOCAL_WORLD_SIZE")) {
    FLEET_ASSIGN_OR_RETURN(int local, LauncherCount(env, "LOCAL_WORLD_SIZE", "torchrun"));
    set("FLEET_NPROC_PER_NODE", std::to_string(local), "LOCAL_WORLD_SIZE");
    if (local > 0 && world > 0 && world % local == 0) {
      set("FLEET_NNODES", std::to_string(world / local), "WORLD_SIZE/LOCAL_WORLD_SIZE");
    }
  } else if (one_host) {
    set("FLEET_NNODES", "1", "MASTER_ADDR");
  }
  if (env("LOCAL_RANK") && CountGpus() > 0) {
    FLEET_ASSIGN_OR_RETURN(int local_rank, LauncherCount(env, "LOCAL_RANK", "torchrun"));
    set("FLEET_DEVICE", absl::StrCat("cuda:", local_rank), "LOCAL_RANK");
  }
  return Status::OK();
}

Status ReadPaddleEnv(Role role, const EnvLookup& env, LauncherEnv& out) {
  if (std::optional<std::string> training_role = env("TRAINING_ROLE")) {
    const std::string& t = *training_role;
    const std::optional<Role> said = t == "PSERVER"   ? std::optional<Role>(Role::kServer)
                                     : t == "TRAINER" ? std::optional<Role>(Role::kWorker)
                                     : t == "HETER_TRAINER"
                                         ? std::optional<Role>(Role::kHeterWorker)
                                         : std::nullopt;
    if (!said) {
      return Status::InvalidArgument(
          "bad TRAINING_ROLE (Paddle's): want PSERVER, TRAINER or HETER_TRAINER",
          absl::StrCat("'", t, "'"));
    }
    if (*said != role) {
      return Status::InvalidArgument(
          absl::StrCat("TRAINING_ROLE=", t, " (Paddle's) starts a ", std::string(RoleName(*said)),
                       ", not a ", std::string(RoleName(role))),
          "TRAINING_ROLE");
    }
  }
  auto copy = [&](const char* var, const char* fleet) {
    if (std::optional<std::string> v = env(var)) out.values[fleet] = {*v, var};
  };
  copy("PADDLE_PSERVERS_IP_PORT_LIST", "FLEET_SERVERS");
  copy("PADDLE_TRAINER_ENDPOINTS", "FLEET_WORKERS");
  if (role == Role::kWorker) {
    if (env("PADDLE_TRAINER_ID")) {
      FLEET_ASSIGN_OR_RETURN(int id, LauncherCount(env, "PADDLE_TRAINER_ID", "Paddle"));
      out.values["FLEET_RANK"] = {std::to_string(id), "PADDLE_TRAINER_ID"};
    }
    if (env("PADDLE_TRAINERS_NUM")) {
      FLEET_ASSIGN_OR_RETURN(int n, LauncherCount(env, "PADDLE_TRAINERS_NUM", "Paddle"));
      out.values["FLEET_WORLD_SIZE"] = {std::to_string(n), "PADDLE_TRAINERS_NUM"};
    }
  } else {
    const std::optional<std::string> ip = env("POD_IP"), port = env("PADDLE_PORT");
    if (ip && port) {
      FLEET_ASSIGN_OR_RETURN(Endpoint mine, ParseEndpoint(absl::StrCat(*ip, ":", *port),
                                                          "POD_IP:PADDLE_PORT (Paddle's)"));
      out.values["FLEET_ENDPOINT"] = {mine.ToString(), "POD_IP:PADDLE_PORT"};
    }
  }
  return Status::OK();
}

}  // namespace

Result<LauncherEnv> ReadLauncherEnv(Role role, const EnvLookup& env) {
  LauncherEnv out;
  // fleetrun's processes carry torchrun's names too (launch/compat_env.h):
  // its own variables say where they are.
  if (env("FLEET_ROLE") || env("FLEET_KV_ENDPOINT")) return out;
  const bool torch = role == Role::kCollective;
  const auto& names =
      torch ? std::vector<const char*>(std::begin(kTorchVariables), std::end(kTorchVariables))
            : std::vector<const char*>(std::begin(kPaddleVariables), std::end(kPaddleVariables));
  for (const char* name : names) {
    if (std::optional<std::string> value = env(name)) {
      absl::StrAppend(&out.summary, out.summary.empty() ? "" : " ", name, "=", *value);
    }
  }
  if (out.summary.empty()) return out;
  out.launcher = torch ? "torchrun" : "Paddle";
  out.summary = absl::StrCat(out.launcher, "'s ", out.summary);
  FLEET_RETURN_IF_ERROR(torch ? ReadTorchEnv(env, out) : ReadPaddleEnv(role, env, out));
  return out;
}

EnvLookup WithLauncherEnv(EnvLookup env, LauncherEnv launcher) {
  return [env = std::move(env), values = std::move(launcher.values)](
             const std::string& name) -> std::optional<std::string> {
    if (std::optional<std::string> value = env(name)) return value;
    if (auto it = values.find(name); it != values.end()) return it->second.first;
    return std::nullopt;
  };
}

int CountGpus(const std::string& dev_dir) {
  struct CloseDir {
    void operator()(DIR* d) const { closedir(d); }
  };
  std::unique_ptr<DIR, CloseDir> dir(opendir(dev_dir.c_str()));
  if (!dir) return 0;
  int count = 0;
  while (dirent* ent = readdir(dir.get())) {
    std::string_view name = ent->d_name;
    if (!name.starts_with("nvidia") || name.size() == 6) continue;
    std::string_view digits = name.substr(6);
    if (std::all_of(digits.begin(), digits.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      ++count;
    }
  }
  return count;
}

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup EnvFromMap(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

Result<ClusterSpec> ClusterSpecFromFlagsAndEnv(const EnvLookup& env) {
  return ClusterSpecFromFlagsAndEnv(env, LauncherEnv());
}

Result<ClusterSpec> ClusterSpecFromFlagsAndEnv(const EnvLookup& env, const LauncherEnv& launcher) {
  ClusterSpec spec;
  spec.launcher_env = launcher.summary;

  Setting role = Lookup("role", "FLEET_ROLE", env, launcher);
  if (role.text.empty()) {
    return Status::InvalidArgument("no role given: pass --role or set FLEET_ROLE",
                                   "server, worker, heter_worker or collective");
  }
  FLEET_ASSIGN_OR_RETURN(spec.role, ParseRole(role.text, role.source));

  FLEET_ASSIGN_OR_RETURN(spec.servers,
                         EndpointsFrom(Lookup("servers", "FLEET_SERVERS", env, launcher)));
  FLEET_ASSIGN_OR_RETURN(spec.workers,
                         WorkerEndpointsFrom(Lookup("workers", "FLEET_WORKERS", env, launcher)));
  FLEET_ASSIGN_OR_RETURN(
      spec.heter_workers,
      EndpointsFrom(Lookup("heter_workers", "FLEET_HETER_WORKERS", env, launcher)));

  Setting rank = Lookup("rank", "FLEET_RANK", env, launcher);
  FLEET_ASSIGN_OR_RETURN(spec.rank, ParseCount(rank));
  if (!rank.given) {
    FLEET_ASSIGN_OR_RETURN(std::optional<int> derived, RankFromEndpoint(spec, env, launcher));
    if (derived) {
      spec.rank = *derived;
      rank.source = "the position of --endpoint in the list";
    } else if (spec.role == Role::kWorker && spec.workers.size() > 1) {
      return Status::InvalidArgument(
          "no --rank given (FLEET_RANK) and --workers lists several workers: give each its --rank",
          JoinEndpoints(spec.workers));
    }
  }
  Setting world = Lookup("world_size", "FLEET_WORLD_SIZE", env, launcher);
  FLEET_ASSIGN_OR_RETURN(spec.world_size, ParseCount(world));
  const std::vector<Endpoint>& mine = spec.RoleEndpoints();
  const int listed = static_cast<int>(mine.size());
  if (spec.world_size == 0) {
    // 0 (the flag's default, or given) means "derive it".
    spec.world_size = listed > 0 ? listed : 1;
  } else if (listed > 0 && spec.world_size != listed) {
    return Status::InvalidArgument(
        absl::StrCat(world.source, " disagrees with the ", std::string(RoleName(spec.role)),
                     " endpoint list"),
        absl::StrCat("world_size ", spec.world_size, " but ", listed, " endpoints"));
  }
  if (spec.rank >= spec.world_size) {
    return Status::InvalidArgument(absl::StrCat("bad ", rank.source, ": rank out of range"),
                                   absl::StrCat("rank ", spec.rank, ", world size ", spec.world_size));
  }

  Setting kv = Lookup("kv_endpoint", "FLEET_KV_ENDPOINT", env, launcher);
  if (!kv.text.empty()) {
    FLEET_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint(kv.text, kv.source));
    spec.kv_endpoint = std::move(ep);
  }

  Setting job = Lookup("job_id", "FLEET_JOB_ID", env, launcher);
  if (!ValidJobId(job.text)) {
    return Status::InvalidArgument(
        absl::StrCat("bad ", job.source, ": want 1-128 characters of [A-Za-z0-9_.-]"),
        absl::StrCat("'", job.text, "'"));
  }
  spec.job_id = job.text;

  Setting device = Lookup("device", "FLEET_DEVICE", env, launcher);
  FLEET_RETURN_IF_ERROR(CanonicalDevice(device.text, device.source).status());
  spec.device = device.text;  // as given; logs show what the user wrote

  spec.log_dir = Lookup("log_dir", "FLEET_LOG_DIR", env, launcher).text;

  Setting auth = Lookup("auth", "FLEET_AUTH", env, launcher);
  if (auth.text != "on" && auth.text != "off") {
    return Status::InvalidArgument(absl::StrCat("bad ", auth.source, ": want on or off"),
                                   absl::StrCat("'", auth.text, "'"));
  }
  spec.auth = auth.text == "on";
  if (spec.auth) {
    Setting file = Lookup("job_secret_file", "FLEET_JOB_SECRET_FILE", env, launcher);
    if (!file.text.empty()) {
      auto read = JobAuth::FromFile(file.text);
      if (!read.ok()) return read.status().WithContext(file.source);
      spec.credentials = std::move(read).value();
    } else if (std::optional<std::string> secret = env("FLEET_JOB_SECRET")) {
      FLEET_ASSIGN_OR_RETURN(spec.credentials, JobAuth::FromSecret(*secret, "FLEET_JOB_SECRET"));
    }
  }

  if (std::optional<std::string> generation = env("FLEET_RESTART_GENERATION")) {
    FLEET_ASSIGN_OR_RETURN(spec.restart_generation,
                           ParseCount(Setting{*generation, "FLEET_RESTART_GENERATION", true}));
  }
  if (std::optional<std::string> restart = env("FLEET_RESTART")) {
    FLEET_ASSIGN_OR_RETURN(int count, ParseCount(Setting{*restart, "FLEET_RESTART", true}));
    spec.restarted = count > 0;
  }
  return spec;
}

Result<std::shared_ptr<const JobAuth>> TransportAuth(const ClusterSpec& spec, bool config_auth) {
  if (!spec.auth || !config_auth) return std::shared_ptr<const JobAuth>();
  if (!spec.credentials) {
    return Status::InvalidArgument(
        "auth is on (the default) but this process has no job secret: set FLEET_JOB_SECRET, "
        "pass --job_secret_file=FILE (mode 600), or turn auth off on a trusted network "
        "(--auth=off / FLEET_AUTH=off, or Distributed.auth: off)",
        absl::StrCat(std::string(RoleName(spec.role)), " ", spec.rank));
  }
  return spec.credentials;
}

namespace {

// Whether the process that registered as `holder` still runs: "ip:port" (a
// server or heter worker) accepts a TCP connection within a second; "host
// pid N" (a worker) on this host has its pid. A worker on another host
// counts as running.
bool HolderAlive(const std::string& holder) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string local = absl::StrCat(host, " pid ");
  if (holder.rfind(local, 0) == 0) {
    const int pid = std::atoi(holder.c_str() + local.size());
    return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
  }
  Result<Endpoint> ep = ParseEndpoint(holder);
  if (!ep.ok()) return true;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(ep->port));
  if (inet_pton(AF_INET, ep->host.c_str(), &addr.sin_addr) != 1) return true;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;
  bool alive = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (!alive && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof(error);
    alive = poll(&p, 1, 1000) != 1 ||  // no answer within the second: not refused
            (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0);
  }
  close(fd);
  return alive;
}

}  // namespace

Status RegisterRank(const ClusterSpec& spec, const std::string& who,
                    std::chrono::milliseconds timeout) {
  if (!spec.kv_endpoint) return Status::OK();
  KvStoreClient kv(spec.kv_endpoint->ToString(), spec.job_id, {.auth = spec.credentials});
  const std::string role(RoleName(spec.role));
  const std::string key = absl::StrCat("ranks/", role, "/", spec.rank);
  FLEET_ASSIGN_OR_RETURN(int64_t claims, kv.Add(key + "/claims", 1));
  // A restart (fleetrun's --max_restart) takes its own rank over.
  if (claims == 1 || spec.restart_generation > 0) {
    return kv.Set(key, who).WithContext("cannot register at " + key);
  }
  Result<std::string> holder = kv.WaitGet(key, timeout);
  // A rank whose holder is gone (it stopped, or crashed and is started
  // again by hand) is free again.
  if (holder.ok() && (*holder == who || !HolderAlive(*holder))) {
    return kv.Set(key, who).WithContext("cannot register at " + key);
  }
  return Status::InvalidArgument(
      absl::StrCat(role, " rank ", spec.rank, " is already taken by ",
                   holder.ok() ? *holder : std::string("another process"), " (this is ", who,
                   "): give each ", role, " its own --rank",
                   spec.role == Role::kWorker
                       ? std::string()
                       : absl::StrCat(", or leave --rank out: a ", role,
                                      "'s rank is the position of its --endpoint in its list")),
      key);
}

std::string EndpointKey(Role role, int rank) {
  return "endpoints/" + std::string(RoleName(role)) + "/" + std::to_string(rank);
}

Status PublishEndpoint(const ClusterSpec& spec, const std::string& bound) {
  if (!spec.kv_endpoint) return Status::OK();
  KvStoreClient kv(spec.kv_endpoint->ToString(), spec.job_id, {.auth = spec.credentials});
  const std::string key = EndpointKey(spec.role, spec.rank);
  return kv.Set(key, bound).WithContext("cannot publish the endpoint at " + key);
}

Result<std::vector<std::string>> ResolveEndpoints(const std::vector<Endpoint>& list, Role role,
                                                  const ClusterSpec& spec,
                                                  std::chrono::milliseconds timeout) {
  std::vector<std::string> out;
  for (size_t r = 0; r < list.size(); ++r) {
    if (list[r].port != 0) {
      out.push_back(list[r].ToString());
      continue;
    }
    // The process bound a free port: its real endpoint is in the KV store.
    if (!spec.kv_endpoint) {
      return Status::InvalidArgument(absl::StrCat(
          std::string(RoleName(role)), " ", r,
          " has port 0 and there is no KV store (--kv_endpoint) to look its endpoint up"));
    }
    KvStoreClient kv(spec.kv_endpoint->ToString(), spec.job_id, {.auth = spec.credentials});
    FLEET_ASSIGN_OR_RETURN(std::string real,
                           kv.WaitGet(EndpointKey(role, static_cast<int>(r)), timeout));
    out.push_back(std::move(real));
  }
  return out;
}

}  // namespace fleet
