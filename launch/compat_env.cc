#include "launch/compat_env.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "launch/net.h"

namespace fleet::launch {
namespace {

bool ParseInt(std::string_view text, int* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace

std::string FormatNodeInfo(const NodeInfo& info) {
  return std::to_string(info.nproc) + "|" + Join(info.endpoints) + "|" + info.master;
}

Result<NodeInfo> ParseNodeInfo(std::string_view text) {
  const std::vector<std::string> parts = SplitString(text, '|');
  NodeInfo info;
  if (parts.size() != 3 || !ParseInt(parts[0], &info.nproc) || info.nproc < 1) {
    return Status::InvalidArgument("node info is not <nproc>|<endpoints>|<master>",
                                   std::string(text));
  }
  info.endpoints = SplitString(parts[1], ',');
  if (static_cast<int>(info.endpoints.size()) != info.nproc) {
    return Status::InvalidArgument("node info lists another number of endpoints than processes",
                                   std::string(text));
  }
  info.master = parts[2];
  return info;
}

std::vector<std::pair<std::string, std::string>> CompatEnv(const CompatPlace& p) {
  const size_t colon = p.master.rfind(':');
  std::vector<std::pair<std::string, std::string>> env = {
      // torchrun
      {"RANK", std::to_string(p.rank)},
      {"WORLD_SIZE", std::to_string(p.world_size)},
      {"LOCAL_RANK", std::to_string(p.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(p.local_world_size)},
      {"MASTER_ADDR", p.master.substr(0, colon)},
      {"MASTER_PORT", colon == std::string::npos ? "" : p.master.substr(colon + 1)},
      // Paddle's fleetrun
      {"PADDLE_TRAINER_ID", std::to_string(p.rank)},
      {"PADDLE_TRAINERS_NUM", std::to_string(p.world_size)},
      {"PADDLE_CURRENT_ENDPOINT", p.trainer_endpoints.at(p.rank)},
      {"PADDLE_TRAINER_ENDPOINTS", Join(p.trainer_endpoints)},
  };
  if (p.device.starts_with("cuda:")) env.emplace_back("FLAGS_selected_gpus", p.device.substr(5));
  return env;
}

Result<std::vector<int>> FreeTcpPorts(const std::string& host, int count) {
  std::vector<int> fds, ports;
  auto close_all = [&] {
    for (int fd : fds) close(fd);
  };
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      close_all();
      return Status::IOError("cannot open a socket to find a free port", std::strerror(errno));
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
        bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const std::string why = std::strerror(errno);
      close_all();
      return Status::IOError("cannot bind a free port on " + host, why);
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  close_all();
  return ports;
}

int VisibleGpuCount(const std::optional<std::string>& cuda_visible_devices, int physical) {
  if (!cuda_visible_devices) return physical;
  int count = 0;
  for (const std::string& entry : SplitString(*cuda_visible_devices, ',')) {
    int id = -1;
    const bool index = ParseInt(entry, &id) && id >= 0 && id < physical;
    const bool uuid = (entry.starts_with("GPU-") || entry.starts_with("MIG-")) && physical > 0;
    if (!index && !uuid) break;
    ++count;
  }
  return count;
}

std::string FormatDistributedEnvs(const std::vector<std::pair<std::string, std::string>>& env) {
  static constexpr std::string_view kPrefixes[] = {
      "PADDLE_", "FLAGS_selected", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "FLEET_"};
  std::vector<std::pair<std::string, std::string>> rows = {{"Distributed Envs", "Value"}};
  for (const auto& [name, value] : env) {
    if (name == "FLEET_JOB_SECRET") continue;
    bool shown = false;
    for (std::string_view prefix : kPrefixes) shown = shown || name.starts_with(prefix);
    if (shown) rows.emplace_back(name, value);
  }
  size_t name_width = 0, value_width = 0;
  for (const auto& [name, value] : rows) {
    name_width = std::max(name_width, name.size());
    value_width = std::max(value_width, value.size());
  }
  const std::string rule =
      "  +" + std::string(name_width + 2, '-') + "+" + std::string(value_width + 2, '-') + "+\n";
  std::string out = rule;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [name, value] = rows[i];
    out += "  | " + name + std::string(name_width - name.size(), ' ') + " | " + value +
           std::string(value_width - value.size(), ' ') + " |\n";
    if (i == 0) out += rule;
  }
  return out + rule;
}

}  // namespace fleet::launch
