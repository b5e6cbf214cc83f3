// fleetrun's own flags: one table (kOptions in options.cc) drives parsing,
// --help, the configuration table printed at start and the README table,
// so a flag cannot be documented in one place and missing in another.
//
// Command line:  fleetrun [FLAGS] [PROGRAM [ARGS...]]
// Parsing stops at the first argument that is not a flag (or after "--"):
// that argument is the collective PROGRAM and everything after it is passed
// to PROGRAM unchanged. Flags are "--name=value" or "--name value";
// "-o Key.sub=value" (or "-oKey.sub=value") overrides one config key and may
// be repeated.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/status.h"

namespace fleet::launch {

// Every field is a flag; see kOptions in options.cc (or `fleetrun --help`)
// for each default and meaning. "Unset" is the empty string or -1.
struct LaunchOptions {
  // Parameter-server mode.
  int server_num = -1;
  int worker_num = -1;
  int heter_worker_num = -1;
  std::string servers;
  std::string workers;
  std::string heter_workers;
  std::string config;
  std::vector<std::string> overrides;  // "-o Key.sub=value", in order
  // Collective mode.
  std::string gpus;  // --gpus or its alias --devices
  int nproc_per_node = -1;
  std::string ips;
  std::string master;
  int nnodes = -1;
  std::string host;
  // torch.distributed.launch's / torchrun's names (ParseLaunchArgs turns
  // them into the flags above).
  int node_rank = -1;
  std::string master_addr;
  int master_port = -1;
  // Both modes.
  std::string log_dir = "log";
  std::string job_id = "default";
  int http_port = -1;  // unset: a free port on one machine, else kDefaultHttpPort
  std::string bin_dir;
  int max_restart = 0;
  double grace_period_s = 5.0;
  double rendezvous_timeout_s = 120.0;
  double peer_timeout_s = 5.0;
  std::string auth = "on";
  std::string job_secret_file;
  std::string metrics_token_file;
  // By hand: host only the KV store.
  bool store_only = false;

  // Positional: the collective program and its arguments (verbatim).
  std::string program;
  std::vector<std::string> program_args;

  bool help = false;
  // Names of the flags the user actually gave, without "--" (for messages
  // and the "which flags were set" checks of the validator).
  std::vector<std::string> given;
  bool Given(std::string_view name) const;
};

// Parses argv[1..]. InvalidArgument whose message starts with the flag
// ("--http_port: 'x' is not an integer") for an unknown flag, a missing
// value or a value of the wrong type. Semantic checks (lists, counts, files)
// are ResolveLayout's job. A name may be spelt with '-' for '_' (torchrun's
// --nproc-per-node). torch.distributed.launch's --master_addr A
// --master_port P (default 29500, torchrun's) --node_rank R become fleetrun's
// own: on one node (--nnodes 1, the default) the store's --http_port P; on
// node 0 of several the master, hosting the store on --host A --http_port P;
// on node R > 0 --master A:P (fleetrun hands out node ranks in arrival order;
// R only decides whether the node is the master).
Result<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args);

// "name  value" lines for the options given (and PROGRAM with its
// arguments), then `derived` (what fleetrun made of them: "(mode)", ...),
// names padded to one column; the rest have their defaults.
std::string FormatOptionsTable(
    const LaunchOptions& options,
    const std::vector<std::pair<std::string, std::string>>& derived = {});

// Usage text: every option with its default and meaning, aligned.
std::string FormatHelp();
// The same as a Markdown table (| flag | default | meaning |) for README.
std::string FormatHelpMarkdown();

// Option names in table order (without "--"), for tests.
std::vector<std::string> OptionNames();

}  // namespace fleet::launch
