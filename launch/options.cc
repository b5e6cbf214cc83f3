#include "launch/options.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <sstream>
#include <variant>

#include "comm/program_help.h"

namespace fleet::launch {
namespace {

using Field = std::variant<int LaunchOptions::*, double LaunchOptions::*, std::string LaunchOptions::*,
                           std::vector<std::string> LaunchOptions::*, bool LaunchOptions::*>;

struct OptionSpec {
  std::string_view name;          // without "--"; "o" is the short -o
  Field field;
  std::string_view default_text;  // as shown in --help and README
  std::string_view help;
  std::string_view group;  // --help's group, by purpose
};

constexpr std::string_view kPsGroup = "Parameter-server jobs";
constexpr std::string_view kCollectiveGroup = "Collective jobs";
constexpr std::string_view kJobGroup = "Job, KV store and logs (both kinds)";
constexpr std::string_view kProcessGroup = "Processes (both kinds)";
constexpr std::string_view kSecurityGroup = "Security (both kinds)";
constexpr std::string_view kByHandGroup = "Processes started by hand";

// The one list of fleetrun's flags. Order = order in --help, the start-up
// table and README.
const OptionSpec kOptions[] = {
    // Parameter-server mode.
    {"server_num", &LaunchOptions::server_num, "unset",
     "PS simulation on this machine: number of ps_server processes (port 0: each binds a free "
     "port); at most 1024",
     kPsGroup},
    {"worker_num", &LaunchOptions::worker_num, "unset",
     "PS simulation: number of workers (ps_worker, or PROGRAM when given); at most 1024", kPsGroup},
    {"heter_worker_num", &LaunchOptions::heter_worker_num, "0",
     "PS simulation: number of heter_worker processes; at most 1024", kPsGroup},
    {"servers", &LaunchOptions::servers, "unset",
     "PS cluster: every server as ip:port, comma-separated (at most 1024); this machine starts the "
     "ones whose ip is its own",
     kPsGroup},
    {"workers", &LaunchOptions::workers, "unset",
     "PS cluster: every worker as ip or ip:port (bare ip = port 0: the worker binds and publishes "
     "one if it needs it)",
     kPsGroup},
    {"heter_workers", &LaunchOptions::heter_workers, "unset",
     "PS cluster: every heter worker as ip:port", kPsGroup},
    {"config", &LaunchOptions::config, "unset",
     "job YAML passed to every process (required in PS mode)", kPsGroup},
    {"o", &LaunchOptions::overrides, "none",
     "-o Key.sub=value: override one config key; repeatable; passed on as --override= and "
     "FLEET_OVERRIDES",
     kPsGroup},
    // Collective mode.
    {"gpus", &LaunchOptions::gpus, "all GPUs",
     "collective: GPU ids, one process per id (FLEET_DEVICE=cuda:K); each id must exist",
     kCollectiveGroup},
    {"devices", &LaunchOptions::gpus, "all GPUs", "alias of --gpus", kCollectiveGroup},
    {"nproc_per_node", &LaunchOptions::nproc_per_node, "GPU count, or 1",
     "collective: processes on this node (at most 1024); on a machine without GPU they are CPU "
     "processes "
     "(shared memory on one node, Gloo across nodes)",
     kCollectiveGroup},
    {"ips", &LaunchOptions::ips, "unset",
     "collective multi-node: every node's ip, comma-separated, same command on each; node rank = "
     "position; "
     "the first node hosts the KV store on --http_port",
     kCollectiveGroup},
    {"master", &LaunchOptions::master, "unset",
     "collective multi-node: ip:port of the KV store, the same on every node; the node owning that "
     "address hosts it; node ranks are handed out there",
     kCollectiveGroup},
    {"nnodes", &LaunchOptions::nnodes, "1 (Slurm: SLURM_NNODES)",
     "collective: number of nodes (at most 1024); >1 without --master makes this node the master "
     "and prints the command for the others",
     kCollectiveGroup},
    {"host", &LaunchOptions::host, "first non-loopback address",
     "collective multi-node: the address this node announces when it hosts the store",
     kCollectiveGroup},
    {"node_rank", &LaunchOptions::node_rank, "0",
     "torchrun's name: 0 makes this node the master (it hosts the store on "
     "--master_addr:--master_port); "
     "others join it (their ranks are handed out in arrival order)",
     kCollectiveGroup},
    {"master_addr", &LaunchOptions::master_addr, "unset",
     "torchrun's name: the master node's address (with --node_rank 0: this node's --host)",
     kCollectiveGroup},
    {"master_port", &LaunchOptions::master_port, "29500",
     "torchrun's name: the store's port on the master (fleetrun's --http_port)", kCollectiveGroup},
    // Both modes.
    {"log_dir", &LaunchOptions::log_dir, "log",
     "process logs: serverlog.N, workerlog.N, heterlog.N (under <log_dir>/<job_id>/ when --job_id "
     "is given); the machines of a job may share it (fleetrun's own files there are per machine); "
     "no link is followed in it",
     kJobGroup},
    {"job_id", &LaunchOptions::job_id, "default",
     "scopes KV store keys and the log folder so jobs can share a machine", kJobGroup},
    {"http_port", &LaunchOptions::http_port, "a free port on one machine; 36001 across machines",
     "port of the KV store fleetrun hosts; 0 = a free port (only when the whole job is on this "
     "machine)",
     kJobGroup},
    {"bin_dir", &LaunchOptions::bin_dir, "fleetrun's folder",
     "where ps_server, ps_worker and heter_worker are", kJobGroup},
    {"max_restart", &LaunchOptions::max_restart, "0",
     "restart a failed process up to this many times (at most 100) before failing the job; the "
     "restart gets FLEET_RESTART and FLEET_RESTART_GENERATION. Multi-host PS jobs: a machine whose "
     "fleetrun died may also rejoin this many times (the same command started there again within "
     "--rendezvous_timeout)",
     kProcessGroup},
    {"grace_period", &LaunchOptions::grace_period_s, "5",
     "seconds between SIGTERM and SIGKILL when stopping processes (at most 86400)", kProcessGroup},
    {"rendezvous_timeout", &LaunchOptions::rendezvous_timeout_s, "120",
     "seconds to wait for servers to publish endpoints and for other nodes to join (at most 86400)",
     kProcessGroup},
    {"peer_timeout", &LaunchOptions::peer_timeout_s, "5",
     "multi-host jobs: seconds without a heartbeat (through the KV store) after which a host "
     "counts as "
     "dead and the job fails on every host (at most 86400)",
     kProcessGroup},
    {"auth", &LaunchOptions::auth, "on",
     "on: every ZeroMQ message authenticated (per-connection MACs; values travel in the clear), KV "
     "store "
     "requests signed, keys from the job secret; off: plain, for trusted networks only (passed on "
     "as "
     "FLEET_AUTH)",
     kSecurityGroup},
    {"job_secret_file", &LaunchOptions::job_secret_file, "unset",
     "file (mode 600) holding the job secret, needed on every machine of a multi-machine job (or "
     "FLEET_JOB_SECRET); a job on one machine gets a fresh random one",
     kSecurityGroup},
    {"metrics_token_file", &LaunchOptions::metrics_token_file, "unset",
     "file (mode 600) holding a read-only token: GET /metrics, /job (the job page) and /job/state "
     "answer a request with 'Authorization: Bearer <token>' (Prometheus's bearer token) or "
     "/job#token=<token> in a browser; without it they need the job secret, except on one machine "
     "(store on loopback), where they answer any user of the machine",
     kSecurityGroup},
    {"store_only", &LaunchOptions::store_only, "off",
     "host only the KV store, on --host (default 127.0.0.1) and --http_port (default 36001), for "
     "ps_server/ps_worker started by hand with --kv_endpoint; needs --job_secret_file (or "
     "--auth=off); runs until Ctrl-C or SIGTERM",
     kByHandGroup},
};

const OptionSpec* FindOption(std::string_view name) {
  for (const OptionSpec& spec : kOptions) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

std::string FlagName(const OptionSpec& spec) {
  return spec.name == "o" ? std::string("-o") : "--" + std::string(spec.name);
}

Status SetField(const OptionSpec& spec, std::string_view value, LaunchOptions& out) {
  std::string flag = FlagName(spec);
  return std::visit(
      [&](auto member) -> Status {
        using T = std::remove_reference_t<decltype(out.*member)>;
        if constexpr (std::is_same_v<T, int>) {
          int v = 0;
          auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
          if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
            return Status::InvalidArgument(flag + ": '" + std::string(value) + "' is not an integer");
          }
          out.*member = v;
        } else if constexpr (std::is_same_v<T, double>) {
          std::string s(value);
          char* end = nullptr;
          double v = std::strtod(s.c_str(), &end);
          if (s.empty() || end != s.c_str() + s.size()) {
            return Status::InvalidArgument(flag + ": '" + s + "' is not a number");
          }
          out.*member = v;
        } else if constexpr (std::is_same_v<T, std::string>) {
          out.*member = std::string(value);
        } else if constexpr (std::is_same_v<T, bool>) {
          if (value != "true" && value != "false") {
            return Status::InvalidArgument(flag + ": '" + std::string(value) + "' is not true or false");
          }
          out.*member = value == "true";
        } else {
          (out.*member).emplace_back(value);
        }
        return Status::OK();
      },
      spec.field);
}

std::string FieldValue(const OptionSpec& spec, const LaunchOptions& o) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_cvref_t<decltype(o.*member)>;
        if constexpr (std::is_same_v<T, int>) {
          return o.*member < 0 ? std::string("unset") : std::to_string(o.*member);
        } else if constexpr (std::is_same_v<T, double>) {
          std::ostringstream s;
          s << o.*member;
          return s.str();
        } else if constexpr (std::is_same_v<T, std::string>) {
          return (o.*member).empty() ? std::string("unset") : o.*member;
        } else if constexpr (std::is_same_v<T, bool>) {
          return std::string(o.*member ? "on" : "off");
        } else {
          std::string joined;
          for (const std::string& v : o.*member) joined += (joined.empty() ? "" : " ") + v;
          return joined.empty() ? std::string("none") : joined;
        }
      },
      spec.field);
}

std::string FormatAligned(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  std::string out;
  for (const auto& [k, v] : rows) out += "  " + k + std::string(width - k.size() + 2, ' ') + v + "\n";
  return out;
}

// torch.distributed.launch's rendezvous flags as fleetrun's (see options.h).
Status ApplyTorchNames(LaunchOptions& o) {
  const bool torch = o.Given("node_rank") || o.Given("master_addr") || o.Given("master_port");
  if (!torch) return Status::OK();
  for (std::string_view own : {"master", "http_port"}) {
    if (o.Given(own)) {
      return Status::InvalidArgument("--" + std::string(own) +
                                     ": give it or torchrun's --master_addr/--master_port, not both");
    }
  }
  if (o.Given("node_rank") && o.node_rank < 0) {
    return Status::InvalidArgument("--node_rank: must be >= 0, got " + std::to_string(o.node_rank));
  }
  const int port = o.Given("master_port") ? o.master_port : 29500;
  if (port < 0 || port > 65535) {
    return Status::InvalidArgument("--master_port: " + std::to_string(port) + " is not in 0..65535");
  }
  auto give = [&](std::string_view name) {
    if (!o.Given(name)) o.given.emplace_back(name);
  };
  o.http_port = port;
  give("http_port");
  if (o.nnodes <= 1) return Status::OK();  // one node: the store on this machine's port
  if (!o.Given("master_addr")) {
    return Status::InvalidArgument("--master_addr: needed with --nnodes " +
                                   std::to_string(o.nnodes) + " (the master node's address)");
  }
  if (o.node_rank <= 0) {
    if (o.Given("host") && o.host != o.master_addr) {
      return Status::InvalidArgument("--host " + o.host + " differs from --master_addr " +
                                     o.master_addr + " on the master (--node_rank 0)");
    }
    o.host = o.master_addr;
    give("host");
    return Status::OK();
  }
  o.master = o.master_addr + ":" + std::to_string(port);
  give("master");
  o.given.erase(std::remove(o.given.begin(), o.given.end(), "http_port"), o.given.end());
  return Status::OK();
}

}  // namespace

bool LaunchOptions::Given(std::string_view name) const {
  return std::find(given.begin(), given.end(), name) != given.end();
}

Result<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args) {
  LaunchOptions out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg == "--") {
      if (i + 1 < args.size()) {
        out.program = args[i + 1];
        out.program_args.assign(args.begin() + i + 2, args.end());
      }
      break;
    }
    if (arg == "-h" || arg == "--help" || arg == "--helpshort") {
      out.help = true;
      continue;
    }
    std::string_view name;
    std::optional<std::string_view> value;
    std::string spelt;  // the name with '-' read as '_'
    if (arg.starts_with("--")) {
      name = arg.substr(2);
      size_t eq = name.find('=');
      if (eq != std::string_view::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      spelt = std::string(name);
      std::replace(spelt.begin(), spelt.end(), '-', '_');
      name = spelt;
    } else if (arg.starts_with("-o")) {
      name = "o";
      if (arg.size() > 2) value = arg.substr(2);
    } else if (arg.starts_with("-") && arg.size() > 1) {
      return Status::InvalidArgument(std::string(arg) + ": unknown flag (see fleetrun --help)");
    } else {
      // First non-flag: PROGRAM (collective, or a PS job's workers); the rest is its own.
      out.program = std::string(arg);
      out.program_args.assign(args.begin() + i + 1, args.end());
      break;
    }
    const OptionSpec* spec = FindOption(name);
    if (spec == nullptr) {
      return Status::InvalidArgument("--" + std::string(name) + ": unknown flag (see fleetrun --help)");
    }
    if (!value && std::holds_alternative<bool LaunchOptions::*>(spec->field)) {
      value = "true";  // a switch: --store_only
    } else if (!value) {
      if (i + 1 >= args.size()) return Status::InvalidArgument(FlagName(*spec) + ": missing value");
      value = args[++i];
    }
    FLEET_RETURN_IF_ERROR(SetField(*spec, *value, out));
    std::string canonical(spec->name == "devices" ? "gpus" : spec->name);
    if (!out.Given(canonical)) out.given.push_back(canonical);
  }
  FLEET_RETURN_IF_ERROR(ApplyTorchNames(out));
  return out;
}

std::string FormatOptionsTable(const LaunchOptions& options,
                               const std::vector<std::pair<std::string, std::string>>& derived) {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const OptionSpec& spec : kOptions) {
    // --devices is --gpus's alias: Given("gpus") covers both.
    if (spec.name == "devices" || !options.Given(spec.name)) continue;
    rows.emplace_back(FlagName(spec), FieldValue(spec, options));
  }
  if (!options.program.empty()) {
    std::string program = options.program;
    for (const std::string& a : options.program_args) program += " " + a;
    rows.emplace_back("PROGRAM", program);
  }
  rows.insert(rows.end(), derived.begin(), derived.end());
  return FormatAligned(rows);
}

std::string FormatHelp() {
  ProgramHelp help{"fleetrun [FLAGS] [PROGRAM [ARGS...]]",
                   "Starts a FleetPS job and stops it when a process fails.\n"
                   "  parameter-server mode: fleetrun --server_num=S --worker_num=W --config=job.yaml\n"
                   "                         fleetrun --servers=ip:port,.. --workers=ip,.. --config=job.yaml\n"
                   "                         (either with PROGRAM [ARGS...]: the workers run it, e.g.\n"
                   "                         python3 train.py over the fleetps module, instead of ps_worker)\n"
                   "  collective mode:       fleetrun [--gpus=0,1 | --nproc_per_node=N] PROGRAM [ARGS...]\n"
                   "See README.md (Running jobs) and launch/README.md.",
                   {},
                   ""};
  for (const OptionSpec& spec : kOptions) {
    auto group = std::find_if(help.groups.begin(), help.groups.end(),
                              [&](const HelpGroup& g) { return g.title == spec.group; });
    if (group == help.groups.end()) group = help.groups.insert(group, {std::string(spec.group), {}});
    group->flags.push_back({FlagName(spec), spec.name == "o" ? "Key.sub=value" : "",
                            std::string(spec.help), std::string(spec.default_text)});
  }
  return FormatProgramHelp(help);
}

std::string FormatHelpMarkdown() {
  std::string out = "| Flag | Default | Meaning |\n|---|---|---|\n";
  for (const OptionSpec& spec : kOptions) {
    out += "| `" + FlagName(spec) + "` | " + std::string(spec.default_text) + " | " + std::string(spec.help) + " |\n";
  }
  return out;
}

std::vector<std::string> OptionNames() {
  std::vector<std::string> out;
  for (const OptionSpec& spec : kOptions) out.emplace_back(spec.name);
  return out;
}

}  // namespace fleet::launch
