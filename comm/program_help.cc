#include "comm/program_help.h"

#include <dlfcn.h>
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <string_view>
#include <vector>

namespace fleet {
namespace {

constexpr size_t kWidth = 100;
constexpr size_t kMaxNameColumn = 28;

std::string FlagColumn(const HelpFlag& f) {
  if (f.value.empty()) return f.name;
  return f.name + (f.name.starts_with("--") ? "=" : " ") + f.value;
}

// Appends `text` word by word, starting at column `indent` and wrapping at
// kWidth with continuation lines indented to `indent`.
void AppendWrapped(std::string_view text, size_t indent, std::string& out) {
  size_t column = indent;
  bool first = true;
  while (!text.empty()) {
    const size_t space = text.find(' ');
    const std::string_view word = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
    if (word.empty()) continue;
    if (!first && column + 1 + word.size() > kWidth) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
    } else if (!first) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    first = false;
  }
  out += '\n';
}

// Directories of the library sources that define gflags flags: glog's (where
// --logtostderr is defined) and gflags' own (--helpfull). Flags defined
// anywhere else are this project's.
std::set<std::string> LibraryFlagDirs() {
  std::set<std::string> dirs;
  for (const char* name : {"logtostderr", "v", "helpfull", "flagfile"}) {
    gflags::CommandLineFlagInfo info;
    if (gflags::GetCommandLineFlagInfo(name, &info)) {
      dirs.insert(std::filesystem::path(info.filename).parent_path().string());
    }
  }
  return dirs;
}

// The object file (the program or a shared library) holding `address`.
const void* ObjectHolding(const void* address) {
  Dl_info where{};
  return dladdr(address, &where) != 0 ? where.dli_fbase : nullptr;
}

// A library flag is one from glog's or gflags' sources, or one that a shared
// library defines (RocksDB's tools register dozens of flags when librocksdb is
// loaded). The project's flags live in the program itself: its libraries are
// static. glog's flags can sit in the program too (a copy relocation when the
// program sets one), hence the directory test as well.
bool IsLibraryFlag(const gflags::CommandLineFlagInfo& info, const std::set<std::string>& dirs) {
  static const void* const program = ObjectHolding(reinterpret_cast<const void*>(&ObjectHolding));
  return dirs.contains(std::filesystem::path(info.filename).parent_path().string()) ||
         ObjectHolding(info.flag_ptr) != program;
}

bool BoolOption(const char* name) {
  std::string value;
  return gflags::GetCommandLineOption(name, &value) && value == "true";
}

// Adds the project's flags that no group names as "Other flags".
void AddUngroupedFlags(ProgramHelp& help) {
  std::set<std::string> shown;
  for (const HelpGroup& g : help.groups) {
    for (const HelpFlag& f : g.flags) shown.insert(f.name);
  }
  const std::set<std::string> library = LibraryFlagDirs();
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  HelpGroup other{"Other flags", {}};
  for (const gflags::CommandLineFlagInfo& info : all) {
    if (IsLibraryFlag(info, library) || shown.contains("--" + info.name)) continue;
    other.flags.push_back(GflagsHelpFlag(info.name, info.type == "bool" ? "" : "VALUE"));
  }
  if (!other.flags.empty()) help.groups.push_back(std::move(other));
}

std::string LibraryFlagsText() {
  const std::set<std::string> library = LibraryFlagDirs();
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::string out = "\nLibrary flags (glog, gflags and the shared libraries loaded):\n";
  for (const gflags::CommandLineFlagInfo& info : all) {
    if (IsLibraryFlag(info, library)) out += gflags::DescribeOneFlag(info);
  }
  return out;
}

}  // namespace

std::string FormatProgramHelp(const ProgramHelp& help) {
  std::string out = "Usage: " + help.usage + "\n";
  if (!help.summary.empty()) out += help.summary + (help.summary.back() == '\n' ? "" : "\n");
  size_t name_width = 0;
  for (const HelpGroup& g : help.groups) {
    for (const HelpFlag& f : g.flags) name_width = std::max(name_width, FlagColumn(f).size());
  }
  name_width = std::min(name_width, kMaxNameColumn);
  const size_t text_column = 2 + name_width + 2;
  for (const HelpGroup& g : help.groups) {
    out += "\n" + g.title + ":\n";
    for (const HelpFlag& f : g.flags) {
      const std::string column = FlagColumn(f);
      out += "  " + column;
      if (column.size() > name_width) {
        out += "\n" + std::string(text_column, ' ');
      } else {
        out += std::string(text_column - 2 - column.size(), ' ');
      }
      std::string text = f.text;
      if (!f.default_text.empty()) text += " (default: " + f.default_text + ")";
      AppendWrapped(text, text_column, out);
    }
  }
  if (!help.footer.empty()) out += "\n" + help.footer + "\n";
  return out;
}

HelpFlag GflagsHelpFlag(const std::string& name, const std::string& value) {
  gflags::CommandLineFlagInfo info;
  CHECK(gflags::GetCommandLineFlagInfo(name.c_str(), &info)) << "no gflags flag --" << name;
  HelpFlag f{"--" + name, info.type == "bool" ? "" : value, info.description, ""};
  if (info.type == "string") {
    if (!info.default_value.empty()) f.default_text = "\"" + info.default_value + "\"";
  } else {
    f.default_text = info.default_value;
  }
  return f;
}

std::optional<int> ParseFlagsOrHelp(ProgramHelp help, int* argc, char*** argv, std::ostream& out,
                                    std::ostream& err) {
  gflags::SetArgv(*argc, const_cast<const char**>(*argv));
  const std::string program = help.usage.substr(0, help.usage.find(' '));
  auto usage_error = [&](std::string_view flag, std::string_view what) {
    err << program << ": " << flag << ": " << what << " (see " << program << " --help)"
        << std::endl;
    return kExitUsage;
  };
  // FLAGS_<name> in the environment sets --name (Paddle's convention): a
  // default for a whole job, which the command line overrides.
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  for (const gflags::CommandLineFlagInfo& info : all) {
    const char* value = std::getenv(("FLAGS_" + info.name).c_str());
    if (value != nullptr && gflags::SetCommandLineOption(info.name.c_str(), value).empty()) {
      return usage_error("FLAGS_" + info.name, "'" + std::string(value) + "' is not a valid " +
                                                   info.type + " (environment)");
    }
  }
  std::vector<std::string> overrides;
  int kept = 1;  // argv[0]
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = (*argv)[i];
    if (arg == "--") {
      while (++i < *argc) (*argv)[kept++] = (*argv)[i];
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      (*argv)[kept++] = (*argv)[i];
      continue;
    }
    if (arg == "-h") {
      gflags::SetCommandLineOption("help", "true");
      continue;
    }
    // "-o K=V" and "-oK=V", unless it is a single-dash spelling of a flag
    // ("-override=...").
    const std::string single_dash_name(arg.substr(1, arg.find('=') - 1));
    gflags::CommandLineFlagInfo probe;
    if (arg.starts_with("-o") && !arg.starts_with("--") && !help.override_flag.empty() &&
        !gflags::GetCommandLineFlagInfo(single_dash_name.c_str(), &probe)) {
      if (arg.size() > 2) {
        overrides.emplace_back(arg.substr(2));
      } else if (i + 1 < *argc) {
        overrides.emplace_back((*argv)[++i]);
      } else {
        return usage_error("-o", "missing Key.sub=value");
      }
      continue;
    }
    std::string_view name = arg.substr(arg.starts_with("--") ? 2 : 1);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string_view::npos) {
      value = std::string(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    const std::string shown(arg.substr(0, arg.find('=')));
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(std::string(name).c_str(), &info)) {
      // --noflag: a bool flag set false.
      const bool negated =
          name.starts_with("no") && !value &&
          gflags::GetCommandLineFlagInfo(std::string(name.substr(2)).c_str(), &info) &&
          info.type == "bool";
      if (!negated) return usage_error(shown, "unknown flag");
      value = "false";
    } else if (!value && info.type == "bool") {
      value = "true";
    } else if (!value) {
      if (i + 1 >= *argc) return usage_error(shown, "missing value");
      value = (*argv)[++i];
    }
    if (gflags::SetCommandLineOption(info.name.c_str(), value->c_str()).empty()) {
      return usage_error(shown, "'" + *value + "' is not a valid " + info.type);
    }
  }
  *argc = kept;
  const bool full = BoolOption("helpfull");
  if (full || BoolOption("help") || BoolOption("helpshort")) {
    AddUngroupedFlags(help);
    if (help.footer.empty()) {
      help.footer = "Library flags (glog's logging, gflags' own): --helpfull";
    }
    out << FormatProgramHelp(help);
    if (full) out << LibraryFlagsText();
    out.flush();
    return 0;
  }
  if (kept > 1 && !help.takes_arguments) {
    return usage_error(std::string("'") + (*argv)[1] + "'", "unexpected argument");
  }
  if (!overrides.empty()) {
    std::string joined;
    CHECK(gflags::GetCommandLineOption(help.override_flag.c_str(), &joined))
        << "no gflags flag --" << help.override_flag;
    for (const std::string& o : overrides) joined += (joined.empty() ? "" : ";") + o;
    gflags::SetCommandLineOption(help.override_flag.c_str(), joined.c_str());
  }
  // --version, --helpxml, --helpon=... and --helpmatch=...: gflags' own.
  gflags::HandleCommandLineHelpFlags();
  return std::nullopt;
}

std::optional<int> ParseFlagsOrHelp(ProgramHelp help, int* argc, char*** argv, std::ostream& out) {
  return ParseFlagsOrHelp(std::move(help), argc, argv, out, std::cerr);
}

std::vector<HelpGroup> ClusterHelpGroups() {
  return {
      {"Place in the job (flag, else its FLEET_* variable; fleetrun sets them)",
       {GflagsHelpFlag("role", "ROLE"), GflagsHelpFlag("rank", "N"),
        GflagsHelpFlag("world_size", "N"), GflagsHelpFlag("servers", "ip:port,..."),
        GflagsHelpFlag("workers", "ip[:port],..."), GflagsHelpFlag("heter_workers", "ip:port,..."),
        GflagsHelpFlag("kv_endpoint", "host:port"), GflagsHelpFlag("job_id", "ID")}},
      {"Security", {GflagsHelpFlag("auth", "on|off"), GflagsHelpFlag("job_secret_file", "FILE")}},
  };
}

}  // namespace fleet
