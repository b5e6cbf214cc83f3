// ProgramHelp: what every FleetPS program prints for --help, in one shape:
//
//   Usage: ps_server --endpoint=ip:port --config=job.yaml [flags]
//   <one or two lines on what it does>
//
//   <Group title>:
//     --flag=VALUE   what it does (default: x)
//   ...
//   Library flags (glog, gflags): --helpfull
//
// Programs whose flags are gflags call ParseFlagsOrHelp instead of
// gflags::ParseCommandLineFlags; programs with their own parser (fleetrun,
// gpt_generate) build a ProgramHelp and print FormatProgramHelp. Thread-
// compatible: call from main() before starting threads.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace fleet {

// One flag as --help shows it.
struct HelpFlag {
  std::string name;               // as typed: "--endpoint", "-c"
  std::string value;              // placeholder after '=' ("ip:port"), empty for a bool
  std::string text;               // what it does
  std::string default_text = {};  // empty: no "(default: ...)"
};

struct HelpGroup {
  std::string title;  // by purpose: "This server", "Cluster", "Security"
  std::vector<HelpFlag> flags;
};

struct ProgramHelp {
  std::string usage;    // after "Usage: ", starting with the program's name
  std::string summary;  // what the program does (may be several lines)
  std::vector<HelpGroup> groups;
  // The last line; empty for none. ParseFlagsOrHelp fills in the pointer to
  // --helpfull when left empty.
  std::string footer = {};
  // Programs that read a job config: the string gflags flag that holds its
  // ';'-joined overrides ("override"). ParseFlagsOrHelp then takes FleetX's
  // and fleetrun's "-o Key.sub=value" (also "-oKey.sub=value"; repeatable)
  // and appends each to it, after any --override given. Empty: -o is an
  // unknown flag.
  std::string override_flag = {};
  // Whether arguments that are not flags are the program's (e.g. files);
  // false: the first one is a usage error.
  bool takes_arguments = false;
};

// The exit code of every usage error (an unknown flag, a missing or
// malformed value, a flag that contradicts another), in every program.
inline constexpr int kExitUsage = 2;

// The help text: usage line first, then the summary, the groups, the footer.
// Long descriptions wrap at 100 columns.
std::string FormatProgramHelp(const ProgramHelp& help);

// The gflags flag `name` (declared with DEFINE_* in any linked file) as a
// HelpFlag: its description, and its default unless empty. CHECK-fails on a
// name no linked file defines (a programmer's typo).
HelpFlag GflagsHelpFlag(const std::string& name, const std::string& value = "VALUE");

// Parses the command line into gflags with FleetPS's help and errors:
// --help, -h and --helpshort print `help` to `out` (flags of this project
// that no group names are added as "Other flags", so none is hidden);
// --helpfull prints that and then every library flag (glog's, gflags').
// Flags are "--name=value", "--name value", "--bool", "--nobool" (one dash
// works too), plus "-o Key=value" with help.override_flag; "--" ends them.
// A FLAGS_<name> environment variable sets --name first (Paddle's
// convention, e.g. a default for every process of a job), so the command
// line wins over it.
// An unknown flag, a missing value or one gflags cannot parse is printed
// once to `err` ("<program>: --name: unknown flag (see <program> --help)").
// An argument that is not a flag is one too, unless help.takes_arguments.
// Returns the exit code main() should return: 0 once help was printed,
// kExitUsage (2) after a usage error; nullopt when the flags are set (argv
// is left with argv[0] and the arguments that are not flags, in order).
std::optional<int> ParseFlagsOrHelp(ProgramHelp help, int* argc, char*** argv, std::ostream& out,
                                    std::ostream& err);
// The same, errors to std::cerr.
std::optional<int> ParseFlagsOrHelp(ProgramHelp help, int* argc, char*** argv, std::ostream& out);

// The groups of the process flags comm/cluster.cc defines (place in the job,
// rendezvous, security), shared by the programs fleetrun starts.
std::vector<HelpGroup> ClusterHelpGroups();

}  // namespace fleet
