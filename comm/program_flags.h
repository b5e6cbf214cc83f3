// The config-driven programs' own flags, after ParseConfigArgs (comm/yaml_config.h)
// has taken -c and -o: "--name=value" or "--name value" for the names the
// program knows, and -h / --help / --helpshort. One reader for gpt_generate,
// gpt_serve and gpt_convert, so they accept and refuse the same shapes.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/program_help.h"
#include "comm/status.h"

namespace fleet {

struct ProgramFlags {
  bool help = false;
  std::vector<std::pair<std::string, std::string>> values;  // (name, value), in order
};

// InvalidArgument for an argument that is not a flag, a name `known` refuses
// ("unknown flag --x (see --help)") or a flag without its value.
inline Result<ProgramFlags> ParseProgramFlags(const std::vector<std::string>& args,
                                              const std::function<bool(std::string_view)>& known) {
  ProgramFlags out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help" || arg == "--helpshort") {
      out.help = true;
      continue;
    }
    if (!arg.starts_with("--")) {
      return Status::InvalidArgument("unexpected argument \"" + arg + "\" (see --help)");
    }
    const size_t eq = arg.find('=');
    std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (!known(name)) return Status::InvalidArgument("unknown flag --" + name + " (see --help)");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) return Status::InvalidArgument("--" + name + " needs a value");
      value = args[++i];
    }
    out.values.emplace_back(std::move(name), std::move(value));
  }
  return out;
}

// What such a program does first with its parsed flags (a Flags with a
// `bool help`): refused, the reason on `err` as "<program>: ..." and exit
// status 2; --help, FormatProgramHelp(help) on `out` and exit status 0;
// otherwise nullopt: go on.
template <typename Flags>
std::optional<int> FlagsExitStatus(const Result<Flags>& flags, std::string_view program,
                                   const ProgramHelp& help, std::ostream& out, std::ostream& err) {
  if (!flags.ok()) {
    err << program << ": " << flags.status().ToString() << "\n";
    return 2;
  }
  if (flags->help) {
    out << FormatProgramHelp(help);
    return 0;
  }
  return std::nullopt;
}

}  // namespace fleet
