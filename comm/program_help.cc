#include "comm/program_help.h"

#include <dlfcn.h>
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string_view>

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

std::optional<int> ParseFlagsOrHelp(ProgramHelp help, int* argc, char*** argv, std::ostream& out) {
  // gflags knows --help and -help but not the short -h users try first.
  bool short_help = false;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = (*argv)[i];
    if (arg == "--") break;
    if (arg == "-h") short_help = true;
  }
  if (!short_help) gflags::ParseCommandLineNonHelpFlags(argc, argv, true);
  const bool full = !short_help && BoolOption("helpfull");
  if (short_help || full || BoolOption("help") || BoolOption("helpshort")) {
    AddUngroupedFlags(help);
    if (help.footer.empty()) {
      help.footer = "Library flags (glog's logging, gflags' own): --helpfull";
    }
    out << FormatProgramHelp(help);
    if (full) out << LibraryFlagsText();
    out.flush();
    return 0;
  }
  // --version, --helpxml, --helpon=... and --helpmatch=...: gflags' own.
  gflags::HandleCommandLineHelpFlags();
  return std::nullopt;
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
