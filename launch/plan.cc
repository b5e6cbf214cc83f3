#include "launch/plan.h"

#include "launch/compat_env.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <sys/stat.h>

#include "launch/net.h"

namespace fleet::launch {
namespace {

// Every validation error is "<flag>: <what is wrong>".
Status Bad(std::string_view flag, const std::string& what) { return Status::InvalidArgument(flag, what); }

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

bool IsReadableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), R_OK) == 0;
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

bool ValidJobId(const std::string& id) {
  return !id.empty() && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  }) && id != "." && id != "..";
}

// One endpoint list flag. Bare hosts get port 0 when `bare_ok`; hosts must be
// IPv4 because they are matched against this machine's interfaces.
Result<std::vector<Endpoint>> ParseList(std::string_view flag, const std::string& text, bool bare_ok) {
  if (text.empty()) return Bad(flag, "empty list");
  std::vector<Endpoint> out;
  std::set<std::string> seen;
  const std::vector<std::string> items = SplitString(text, ',');
  if (items.size() > static_cast<size_t>(kMaxProcessesPerRole)) {
    return Bad(flag, "lists " + std::to_string(items.size()) + " entries; at most " +
                         std::to_string(kMaxProcessesPerRole));
  }
  for (const std::string& item : items) {
    if (item.empty()) return Bad(flag, "empty entry in '" + text + "'");
    bool bare = item.find(':') == std::string::npos;
    if (bare && !bare_ok) return Bad(flag, "'" + item + "' has no port (want ip:port)");
    auto ep = ParseEndpoint(bare ? item + ":0" : item, {}, EndpointParseOptions{.allow_port_zero = bare});
    if (!ep.ok()) return Bad(flag, ep.status().message());
    if (!IsDottedIPv4(ep->host)) return Bad(flag, "'" + item + "' is not an IPv4 address");
    if (ep->port != 0 && !seen.insert(ep->ToString()).second) return Bad(flag, "'" + item + "' is listed twice");
    out.push_back(*ep);
  }
  return out;
}

Status CheckCount(std::string_view count_flag, int count, std::string_view list_flag, size_t listed) {
  if (count >= 0 && static_cast<size_t>(count) != listed) {
    return Bad(count_flag, std::to_string(count) + " contradicts " + std::string(list_flag) + ", which lists " +
                               std::to_string(listed));
  }
  return Status::OK();
}

std::string FirstNonLoopback(const MachineInfo& m) {
  for (const std::string& a : m.local_addresses) {
    if (!IsLoopback(a)) return a;
  }
  return {};
}

Result<std::string> FindProgram(const std::string& program, const std::string& path_env) {
  if (program.find('/') != std::string::npos) {
    if (IsExecutableFile(program)) return program;
  } else {
    for (const std::string& dir : SplitString(path_env, ':')) {
      std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
      if (IsExecutableFile(candidate)) return candidate;
    }
  }
  return Bad("PROGRAM", "'" + program + "' is not an executable file (nor found in PATH)");
}

// --http_port, or when not given: a free port for a job on this machine
// alone (so two such jobs never collide), else the well-known one the other
// machines can be told.
int HttpPort(const LaunchOptions& o, bool one_machine) {
  if (o.Given("http_port")) return o.http_port;
  return one_machine ? 0 : kDefaultHttpPort;
}

Status ResolveCommon(const LaunchOptions& o, JobLayout& job) {
  if (!ValidJobId(o.job_id)) return Bad("--job_id", "'" + o.job_id + "' must be letters, digits, '_', '-' or '.'");
  if (o.log_dir.empty()) return Bad("--log_dir", "empty");
  if (o.Given("http_port") && (o.http_port < 0 || o.http_port > 65535)) return Bad("--http_port", std::to_string(o.http_port) + " is not in 0..65535");
  if (o.max_restart < 0 || o.max_restart > kMaxRestart) {
    return Bad("--max_restart", std::to_string(o.max_restart) + " is not in 0.." + std::to_string(kMaxRestart));
  }
  const std::string max_s = std::to_string(static_cast<int>(kMaxSeconds));
  if (!(o.grace_period_s > 0 && o.grace_period_s <= kMaxSeconds)) {
    return Bad("--grace_period", "must be > 0 and at most " + max_s + " seconds");
  }
  if (!(o.peer_timeout_s > 0 && o.peer_timeout_s <= kMaxSeconds)) {
    return Bad("--peer_timeout", "must be > 0 and at most " + max_s + " seconds");
  }
  if (!(o.rendezvous_timeout_s > 0 && o.rendezvous_timeout_s <= kMaxSeconds)) {
    return Bad("--rendezvous_timeout", "must be > 0 and at most " + max_s + " seconds");
  }
  for (const std::string& ov : o.overrides) {
    size_t eq = ov.find('=');
    if (eq == std::string::npos || eq == 0) return Bad("-o", "'" + ov + "' is not Key.sub=value");
    // FLEET_OVERRIDES joins overrides with ';', so a value may not hold one.
    if (ov.find(';') != std::string::npos) return Bad("-o", "'" + ov + "' contains ';'");
  }
  if (o.Given("config") && !IsReadableFile(o.config)) return Bad("--config", "'" + o.config + "' is not a readable file");
  if (o.auth != "on" && o.auth != "off") return Bad("--auth", "'" + o.auth + "' must be on or off");
  if (o.auth == "off" && o.Given("job_secret_file")) return Bad("--job_secret_file", "given with --auth=off");
  job.auth = o.auth == "on";
  job.job_id = o.job_id;
  job.log_dir = o.Given("job_id") ? o.log_dir + "/" + o.job_id : o.log_dir;
  job.config = o.config;
  job.overrides = o.overrides;
  return Status::OK();
}

Status ResolvePs(const LaunchOptions& o, const MachineInfo& m, JobLayout& job) {
  if (!o.Given("config")) return Bad("--config", "missing (parameter-server mode needs the job YAML)");
  const bool cluster = o.Given("servers") || o.Given("workers") || o.Given("heter_workers");
  if (!cluster) {
    job.mode = Mode::kPsSimulation;
    if (o.server_num < 1) return Bad("--server_num", o.Given("server_num") ? "must be >= 1" : "missing (or give --servers)");
    if (o.worker_num < 1) return Bad("--worker_num", o.Given("worker_num") ? "must be >= 1" : "missing (or give --workers)");
    if (o.Given("heter_worker_num") && o.heter_worker_num < 0) return Bad("--heter_worker_num", "must be >= 0");
    for (const auto& [flag, count] : {std::pair{"--server_num", o.server_num}, std::pair{"--worker_num", o.worker_num},
                                      std::pair{"--heter_worker_num", o.heter_worker_num}}) {
      if (count > kMaxProcessesPerRole) {
        return Bad(flag, std::to_string(count) + " is more than the " + std::to_string(kMaxProcessesPerRole) +
                             " processes per role fleetrun starts");
      }
    }
    // The whole job is on this machine: loopback is the honest address, and
    // port 0 lets every process bind a free port and publish it.
    const Endpoint local{"127.0.0.1", 0};
    job.servers.assign(o.server_num, local);
    job.workers.assign(o.worker_num, local);
    job.heter_workers.assign(std::max(o.heter_worker_num, 0), local);
    for (int r = 0; r < o.server_num; ++r) job.local_servers.push_back(r);
    for (int r = 0; r < o.worker_num; ++r) job.local_workers.push_back(r);
    for (int r = 0; r < std::max(o.heter_worker_num, 0); ++r) job.local_heter_workers.push_back(r);
    job.host_kv = true;
    job.kv_listen = "127.0.0.1:" + std::to_string(HttpPort(o, /*one_machine=*/true));
    job.kv_endpoint = job.kv_listen;
  } else {
    job.mode = Mode::kPsCluster;
    if (!o.Given("servers")) return Bad("--servers", "missing (required with --workers)");
    if (!o.Given("workers")) return Bad("--workers", "missing (required with --servers)");
    FLEET_ASSIGN_OR_RETURN(job.servers, ParseList("--servers", o.servers, /*bare_ok=*/false));
    FLEET_ASSIGN_OR_RETURN(job.workers, ParseList("--workers", o.workers, /*bare_ok=*/true));
    if (o.Given("heter_workers")) {
      FLEET_ASSIGN_OR_RETURN(job.heter_workers, ParseList("--heter_workers", o.heter_workers, false));
    }
    FLEET_RETURN_IF_ERROR(CheckCount("--server_num", o.server_num, "--servers", job.servers.size()));
    FLEET_RETURN_IF_ERROR(CheckCount("--worker_num", o.worker_num, "--workers", job.workers.size()));
    FLEET_RETURN_IF_ERROR(CheckCount("--heter_worker_num", o.heter_worker_num, "--heter_workers", job.heter_workers.size()));
    // Loopback only when the whole job is on loopback: a 127.x address in a
    // multi-machine job is unreachable from the other machines.
    struct Named { std::string_view flag; const std::vector<Endpoint>* list; };
    const Named lists[] = {{"--servers", &job.servers}, {"--heter_workers", &job.heter_workers}, {"--workers", &job.workers}};
    bool any_loop = false, any_real = false;
    for (const Named& n : lists)
      for (const Endpoint& e : *n.list) (IsLoopback(e.host) ? any_loop : any_real) = true;
    if (any_loop && any_real) {
      for (const Named& n : lists)
        for (const Endpoint& e : *n.list)
          if (IsLoopback(e.host))
            return Bad(n.flag, "'" + e.host + "' is a loopback address but the job spans other machines");
    }
    auto is_local = [&](const Endpoint& e) { return any_loop || Contains(m.local_addresses, e.host); };
    for (size_t r = 0; r < job.servers.size(); ++r) if (is_local(job.servers[r])) job.local_servers.push_back(r);
    for (size_t r = 0; r < job.heter_workers.size(); ++r) if (is_local(job.heter_workers[r])) job.local_heter_workers.push_back(r);
    for (size_t r = 0; r < job.workers.size(); ++r) if (is_local(job.workers[r])) job.local_workers.push_back(r);
    if (job.local_servers.empty() && job.local_heter_workers.empty() && job.local_workers.empty()) {
      return Bad("--servers", "none of this machine's addresses (" + Join(m.local_addresses, ", ") +
                                  ") is in --servers, --workers or --heter_workers");
    }
    if (o.Given("http_port") && o.http_port == 0 && !any_loop) return Bad("--http_port", "0 (a free port) works only when the whole job is on this machine");
    // The launcher on the first server's machine hosts the store there.
    job.kv_endpoint = job.servers[0].host + ":" + std::to_string(HttpPort(o, /*one_machine=*/!any_real));
    job.host_kv = is_local(job.servers[0]);
    job.kv_listen = job.kv_endpoint;
  }
  job.bin_dir = o.bin_dir.empty() ? m.self_dir : o.bin_dir;
  if (!o.program.empty()) {
    job.worker_program = o.program;
    job.worker_program_args = o.program_args;
    // A machine of a cluster that runs no worker need not have it.
    if (!job.local_workers.empty()) {
      FLEET_ASSIGN_OR_RETURN(job.worker_program_path, FindProgram(o.program, m.path_env));
    }
  }
  std::vector<std::string> needed;
  if (!job.local_servers.empty()) needed.push_back("ps_server");
  if (!job.local_heter_workers.empty()) needed.push_back("heter_worker");
  if (!job.local_workers.empty() && job.worker_program.empty()) needed.push_back("ps_worker");
  for (const std::string& name : needed) {
    if (!IsExecutableFile(job.bin_dir + "/" + name)) return Bad("--bin_dir", "no executable " + name + " in '" + job.bin_dir + "'");
  }
  job.gpu_count = m.gpu_count;
  return Status::OK();
}

Result<std::vector<std::string>> ResolveDevices(const LaunchOptions& o, const MachineInfo& m) {
  std::vector<std::string> devices;
  if (o.Given("gpus")) {
    std::set<int> seen;
    for (const std::string& item : SplitString(o.gpus, ',')) {
      int id = -1;
      auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size() || id < 0) {
        return Bad("--gpus", "'" + item + "' is not a GPU id");
      }
      if (id >= m.gpu_count) {
        return Bad("--gpus", "GPU id " + item + " does not exist (this machine has " +
                                 (m.gpu_count == 0 ? std::string("no GPU") : std::to_string(m.gpu_count) + " GPUs") + ")");
      }
      if (!seen.insert(id).second) return Bad("--gpus", "GPU id " + item + " is listed twice");
      devices.push_back("cuda:" + item);
    }
    FLEET_RETURN_IF_ERROR(CheckCount("--nproc_per_node", o.nproc_per_node, "--gpus", devices.size()));
    return devices;
  }
  if (o.Given("nproc_per_node") && (o.nproc_per_node < 1 || o.nproc_per_node > kMaxProcessesPerRole)) {
    return Bad("--nproc_per_node", std::to_string(o.nproc_per_node) + " is not in 1.." +
                                       std::to_string(kMaxProcessesPerRole));
  }
  const int n = o.nproc_per_node >= 1 ? o.nproc_per_node : std::max(m.gpu_count, 1);
  for (int i = 0; i < n; ++i) devices.push_back(m.gpu_count > 0 ? "cuda:" + std::to_string(i % m.gpu_count) : "cpu");
  return devices;
}

Status ResolveCollective(const LaunchOptions& o, const MachineInfo& m, JobLayout& job) {
  job.mode = Mode::kCollective;
  CollectiveLayout& c = job.collective;
  c.program = o.program;
  c.program_args = o.program_args;
  FLEET_ASSIGN_OR_RETURN(c.program_path, FindProgram(o.program, m.path_env));
  FLEET_ASSIGN_OR_RETURN(c.devices, ResolveDevices(o, m));
  if (m.cuda_visible_devices && !m.cuda_visible_devices->empty() && m.gpu_count == 0 &&
      !o.Given("gpus")) {
    job.notes.push_back("note: CUDA_VISIBLE_DEVICES=" + *m.cuda_visible_devices +
                        " is set but this machine has no GPU (no /dev/nvidia<N>): " +
                        std::to_string(c.devices.size()) + " CPU process" +
                        (c.devices.size() == 1 ? "" : "es") +
                        (o.Given("nproc_per_node") ? "" : " (--nproc_per_node=N for more)"));
  }
  if (o.Given("nnodes") && (o.nnodes < 1 || o.nnodes > kMaxNodes)) {
    return Bad("--nnodes", std::to_string(o.nnodes) + " is not in 1.." + std::to_string(kMaxNodes));
  }
  auto port = [&](bool one_machine) { return std::to_string(HttpPort(o, one_machine)); };
  const bool slurm = !m.slurm_nodelist.empty() && !m.slurm_nnodes.empty() && !m.slurm_procid.empty();
  if (o.Given("host") && !IsDottedIPv4(o.host)) return Bad("--host", "'" + o.host + "' is not an IPv4 address");
  if (o.Given("host") && !Contains(m.local_addresses, o.host)) return Bad("--host", "'" + o.host + "' is not an address of this machine");
  const std::string host = o.Given("host") ? o.host : FirstNonLoopback(m);

  if (o.Given("ips")) {
    if (o.Given("master")) return Bad("--master", "cannot be combined with --ips");
    std::vector<std::string> ips = SplitString(o.ips, ',');
    if (ips.size() > static_cast<size_t>(kMaxNodes)) {
      return Bad("--ips", "lists " + std::to_string(ips.size()) + " nodes; at most " + std::to_string(kMaxNodes));
    }
    for (const std::string& ip : ips) {
      if (!IsDottedIPv4(ip)) return Bad("--ips", "'" + ip + "' is not an IPv4 address");
    }
    if (std::set<std::string>(ips.begin(), ips.end()).size() != ips.size()) return Bad("--ips", "an address is listed twice");
    FLEET_RETURN_IF_ERROR(CheckCount("--nnodes", o.nnodes, "--ips", ips.size()));
    auto it = std::find_if(ips.begin(), ips.end(), [&](const std::string& ip) { return Contains(m.local_addresses, ip); });
    if (it == ips.end()) return Bad("--ips", "none of this machine's addresses (" + Join(m.local_addresses, ", ") + ") is listed");
    c.nnodes = ips.size();
    c.node_rank = it - ips.begin();
    c.node_rank_source = c.nnodes > 1 ? NodeRankSource::kKnown : NodeRankSource::kSingleNode;
    if (c.nnodes > 1 && o.Given("http_port") && o.http_port == 0) return Bad("--http_port", "0 (a free port) cannot be used with --ips: the other nodes must know it");
    if (c.nnodes > 1 && IsLoopback(ips[0])) return Bad("--ips", "'" + ips[0] + "' is a loopback address but the job spans other machines");
    job.kv_endpoint = ips[0] + ":" + port(c.nnodes == 1);
    job.host_kv = c.node_rank == 0;
    job.kv_listen = job.kv_endpoint;
    c.node_host = ips[c.node_rank];
    c.node_hosts = ips;
  } else if (o.Given("master")) {
    auto ep = ParseEndpoint(o.master);
    if (!ep.ok()) return Bad("--master", ep.status().message());
    if (!o.Given("nnodes")) return Bad("--nnodes", "missing (required with --master)");
    c.nnodes = o.nnodes;
    c.node_rank_source = NodeRankSource::kAssigned;
    job.kv_endpoint = ep->ToString();
    // The same command on every node: the node that owns the master's
    // address hosts the store there; the others meet through it.
    job.host_kv = !IsLoopback(ep->host) && Contains(m.local_addresses, ep->host);
    if (job.host_kv) {
      if (ep->port == 0) return Bad("--master", "port 0: the other nodes must know the port");
      job.kv_listen = job.kv_endpoint;
    }
    // A master on loopback: every node is this machine (tests, trials).
    c.node_host = job.host_kv ? ep->host : IsLoopback(ep->host) || host.empty() ? "127.0.0.1" : host;
  } else if (slurm) {
    int nnodes = 0, node_rank = -1;
    const std::string& id = m.slurm_nodeid.empty() ? m.slurm_procid : m.slurm_nodeid;
    std::from_chars(m.slurm_nnodes.data(), m.slurm_nnodes.data() + m.slurm_nnodes.size(), nnodes);
    std::from_chars(id.data(), id.data() + id.size(), node_rank);
    c.nnodes = o.Given("nnodes") ? o.nnodes : nnodes;
    if (c.nnodes < 1 || c.nnodes > kMaxNodes || node_rank < 0 || node_rank >= c.nnodes) {
      return Bad("--nnodes", "Slurm gives node " + id + " of " + m.slurm_nnodes + ", which does not fit");
    }
    c.node_rank = node_rank;
    c.node_rank_source = c.nnodes > 1 ? NodeRankSource::kKnown : NodeRankSource::kSingleNode;
    if (c.nnodes > 1 && o.Given("http_port") && o.http_port == 0) return Bad("--http_port", "0 (a free port) cannot be used under Slurm: the other nodes must know it");
    if (m.slurm_master_ip.empty()) return Bad("--nnodes", "cannot resolve the first host of SLURM_NODELIST '" + m.slurm_nodelist + "'");
    job.host_kv = node_rank == 0;
    if (c.nnodes == 1) {
      // One node: the whole job is on loopback, as without Slurm.
      job.kv_listen = "127.0.0.1:" + port(true);
      job.kv_endpoint = job.kv_listen;
    } else {
      // Node 0 listens on every interface: the name other nodes resolve may
      // differ from what this node's resolver says (127.0.1.1 in /etc/hosts).
      job.kv_listen = "0.0.0.0:" + port(false);
      job.kv_endpoint =
          (node_rank == 0 && !host.empty() ? host : m.slurm_master_ip) + ":" + port(false);
    }
    c.from_slurm = true;
    c.node_host = c.nnodes == 1 ? "127.0.0.1" : host;
    if (c.node_host.empty()) return Bad("--host", "this machine has no non-loopback IPv4 address; pass --host");
  } else if (o.nnodes > 1) {
    if (host.empty()) return Bad("--host", "this machine has no non-loopback IPv4 address; pass --host");
    c.nnodes = o.nnodes;
    c.node_rank_source = NodeRankSource::kAssigned;
    c.print_join_command = true;
    job.host_kv = true;
    job.kv_listen = host + ":" + port(false);
    job.kv_endpoint = job.kv_listen;
    c.node_host = host;
  } else {
    // One node: the whole job is on loopback.
    job.host_kv = true;
    job.kv_listen = "127.0.0.1:" + port(true);
    job.kv_endpoint = job.kv_listen;
    c.node_host = "127.0.0.1";
  }
  c.world_size = c.devices.size();
  const auto iface = m.interface_of.find(c.node_host);
  if (c.nnodes > 1 && !IsLoopback(c.node_host) && !m.nccl_socket_ifname && iface != m.interface_of.end()) {
    c.nccl_socket_ifname = "=" + iface->second;  // "=": this interface exactly, not a prefix
  }
  return Status::OK();
}

// --store_only: the KV store alone, for ps_server / ps_worker started by
// hand (README.md, "By hand"). Every flag about processes is refused.
Result<JobLayout> ResolveStoreOnly(const LaunchOptions& o) {
  static constexpr std::string_view kProcessFlags[] = {
      "server_num", "worker_num", "heter_worker_num", "servers", "workers", "heter_workers",
      "gpus", "nproc_per_node", "ips", "master", "nnodes", "max_restart"};
  for (std::string_view f : kProcessFlags) {
    if (o.Given(f)) return Bad("--" + std::string(f), "cannot be combined with --store_only, which starts no process");
  }
  if (!o.program.empty()) return Bad("PROGRAM", "'" + o.program + "' given with --store_only, which starts no process");
  if (o.Given("host") && !IsDottedIPv4(o.host)) return Bad("--host", "'" + o.host + "' is not an IPv4 address");
  JobLayout job;
  FLEET_RETURN_IF_ERROR(ResolveCommon(o, job));
  job.mode = Mode::kStoreOnly;
  job.host_kv = true;
  job.kv_listen = (o.Given("host") ? o.host : std::string("127.0.0.1")) + ":" +
                  std::to_string(HttpPort(o, /*one_machine=*/false));
  job.kv_endpoint = job.kv_listen;
  return job;
}

// The spec runs a PROGRAM: argv[0] as the user gave it, then its ARGS.
void RunProgram(const std::string& path, const std::string& program,
                const std::vector<std::string>& args, ProcessSpec* spec) {
  spec->exe = path;
  spec->argv.push_back(program);
  spec->argv.insert(spec->argv.end(), args.begin(), args.end());
}

}  // namespace

Result<JobLayout> ResolveLayout(const LaunchOptions& o, const MachineInfo& m) {
  if (o.store_only) return ResolveStoreOnly(o);
  static constexpr std::string_view kPsFlags[] = {"server_num", "worker_num", "heter_worker_num",
                                                  "servers", "workers", "heter_workers"};
  static constexpr std::string_view kCollectiveFlags[] = {"gpus", "nproc_per_node", "ips", "master", "nnodes", "host"};
  std::string ps_flag;
  for (std::string_view f : kPsFlags) {
    if (o.Given(f) && ps_flag.empty()) ps_flag = "--" + std::string(f);
  }
  if (ps_flag.empty() && o.program.empty()) {
    return Bad("PROGRAM", "missing (collective mode: fleetrun [flags] PROGRAM [ARGS...]; "
                          "parameter-server mode: --server_num/--worker_num or --servers/--workers)");
  }
  if (!ps_flag.empty()) {
    for (std::string_view f : kCollectiveFlags) {
      if (o.Given(f)) return Bad("--" + std::string(f), "is a collective-mode flag; " + ps_flag + " chose parameter-server mode");
    }
  }
  JobLayout job;
  FLEET_RETURN_IF_ERROR(ResolveCommon(o, job));
  if (!ps_flag.empty()) {
    FLEET_RETURN_IF_ERROR(ResolvePs(o, m, job));
  } else {
    FLEET_RETURN_IF_ERROR(ResolveCollective(o, m, job));
  }
  return job;
}

bool IsProcessContractVariable(std::string_view name) {
  static constexpr std::string_view kContract[] = {
      "FLEET_ROLE",           "FLEET_RANK",           "FLEET_WORLD_SIZE",
      "FLEET_LOCAL_RANK",     "FLEET_NNODES",         "FLEET_NODE_RANK",
      "FLEET_NPROC_PER_NODE", "FLEET_DEVICE",         "FLEET_HOST",
      "FLEET_SERVERS",        "FLEET_WORKERS",        "FLEET_HETER_WORKERS",
      "FLEET_ENDPOINT",       "FLEET_KV_ENDPOINT",    "FLEET_JOB_ID",
      "FLEET_LOG_DIR",        "FLEET_CONFIG",         "FLEET_AUTH",
      "FLEET_OVERRIDES",      "FLEET_RESTART",        "FLEET_RESTART_GENERATION",
      "FLEET_JOB_SECRET",     "FLEET_JOB_SECRET_FILE"};
  return std::find(std::begin(kContract), std::end(kContract), name) != std::end(kContract);
}

ProcessSpec RenderProcess(const JobLayout& job, Role role, int rank, int restart) {
  ProcessSpec spec;
  spec.role = role;
  // (name, value) pairs given to the process; each becomes FLEET_<NAME> and,
  // for the FleetPS binaries, --<name>=value. One list, so flags and
  // environment cannot drift apart.
  std::vector<std::pair<std::string, std::string>> vars;
  std::string overrides;
  for (const std::string& ov : job.overrides) overrides += (overrides.empty() ? "" : ";") + ov;
  if (role == Role::kCollective) {
    const CollectiveLayout& c = job.collective;
    spec.rank = c.rank_offset + rank;
    vars = {{"role", "collective"},
            {"rank", std::to_string(spec.rank)},
            {"world_size", std::to_string(c.world_size)},
            {"local_rank", std::to_string(rank)},
            {"nnodes", std::to_string(c.nnodes)},
            {"node_rank", std::to_string(c.node_rank)},
            {"nproc_per_node", std::to_string(c.devices.size())},
            {"device", c.devices.at(rank)},
            // The address this host has in the job: ranks bind and advertise
            // it for their own connections (Gloo), never loopback unless the
            // job is on one host.
            {"host", c.node_host}};
    if (c.trainer_endpoints.size() == static_cast<size_t>(c.world_size)) {
      const CompatPlace place{spec.rank, c.world_size, rank, static_cast<int>(c.devices.size()),
                              c.master, c.trainer_endpoints, c.devices.at(rank)};
      for (auto& [name, value] : CompatEnv(place)) spec.env.emplace_back(name, value);
    }
    if (c.devices.at(rank).starts_with("cuda:") && !c.nccl_socket_ifname.empty()) {
      spec.env.emplace_back("NCCL_SOCKET_IFNAME", c.nccl_socket_ifname);
    }
    RunProgram(c.program_path, c.program, c.program_args, &spec);
  } else {
    spec.rank = rank;
    const std::vector<Endpoint>& mine = role == Role::kServer ? job.servers
                                        : role == Role::kWorker ? job.workers
                                                                : job.heter_workers;
    std::string device = "cpu";
    if (role == Role::kHeterWorker && job.gpu_count > 0) device = "cuda:" + std::to_string(rank % job.gpu_count);
    vars = {{"role", std::string(RoleName(role))},
            {"rank", std::to_string(rank)},
            {"world_size", std::to_string(mine.size())},
            {"servers", JoinEndpoints(job.servers)},
            {"workers", JoinEndpoints(job.workers)},
            {"heter_workers", JoinEndpoints(job.heter_workers)},
            {"device", device}};
    if (role == Role::kServer) spec.abandon_signal = SIGINT;
    if (role != Role::kWorker) {
      spec.endpoint = mine.at(rank).ToString();
      vars.emplace_back("endpoint", spec.endpoint);
    }
    if (role == Role::kWorker && !job.worker_program.empty()) {
      RunProgram(job.worker_program_path, job.worker_program, job.worker_program_args, &spec);
    } else {
      const char* binary = role == Role::kServer   ? "ps_server"
                           : role == Role::kWorker ? "ps_worker"
                                                   : "heter_worker";
      spec.exe = job.bin_dir + "/" + binary;
      spec.argv.push_back(spec.exe);
    }
  }
  // A PROGRAM (collective, or a PS job's workers) has flags of its own: it
  // gets the environment only.
  const bool env_only =
      role == Role::kCollective || (role == Role::kWorker && !job.worker_program.empty());
  vars.emplace_back("kv_endpoint", job.kv_endpoint);
  vars.emplace_back("job_id", job.job_id);
  vars.emplace_back("log_dir", job.log_dir);
  if (!job.config.empty()) vars.emplace_back("config", job.config);
  vars.emplace_back("auth", job.auth ? "on" : "off");

  for (const auto& [name, value] : vars) {
    std::string upper = name;
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char ch) { return std::toupper(ch); });
    spec.env.emplace_back("FLEET_" + upper, value);
    if (!env_only) spec.argv.push_back("--" + name + "=" + value);
  }
  spec.env.emplace_back("FLEET_OVERRIDES", overrides);
  // Environment only, so a restart changes no flag: the generation keys the
  // collective rendezvous (fresh keys for a restarted process); FLEET_RESTART
  // tells a server to reload its checkpoint.
  spec.env.emplace_back("FLEET_RESTART_GENERATION", std::to_string(restart));
  if (restart > 0) spec.env.emplace_back("FLEET_RESTART", std::to_string(restart));
  // Environment only: a flag would show in `ps` to every user.
  if (job.auth && !job.job_secret.empty()) spec.env.emplace_back("FLEET_JOB_SECRET", job.job_secret);
  // One flag holding the ';'-joined list: gflags keeps only the last of a
  // repeated flag.
  if (!env_only && !overrides.empty()) spec.argv.push_back("--override=" + overrides);
  const char* prefix = role == Role::kServer ? "serverlog" : role == Role::kHeterWorker ? "heterlog" : "workerlog";
  spec.log_path = job.log_dir + "/" + prefix + "." + std::to_string(spec.rank);
  spec.tee = (role == Role::kWorker || role == Role::kCollective) && spec.rank == 0;
  return spec;
}

}  // namespace fleet::launch
