// A cluster of hosts on one machine, for tests of multi-host jobs: each host
// is a network namespace with loopback and one interface (eth0) at
// 198.18.0.<i+1>/24 (RFC 2544's benchmarking range), joined by a bridge
// that lives in a namespace of its own, so nothing touches the machine's
// interfaces. There is no default route: the hosts reach each other and
// nothing else. Processes run in a host's namespace with the machine's
// file system, users and /proc, so a test can start binaries and watch
// their processes as usual.
//
// Everything is deleted by the destructor (deleting a namespace deletes its
// veth); namespaces left by a test binary that crashed are deleted by the
// next Create (their names carry the creating pid, which no longer runs).
//
// Needs root and iproute2's `ip` (and `tc` for CapBandwidth). Unavailable()
// says why a cluster cannot be made here, for GTEST_SKIP.
//
// Not thread-safe; create and use a cluster from one thread.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tests/child_process.h"

namespace fleet::testing {

class NetnsCluster {
 public:
  // Every namespace a cluster makes is named <kPrefix><pid>x<serial>h<host>
  // (the bridge's: ...br).
  static constexpr const char* kPrefix = "fleetnc";

  // "" when clusters can be made here, else why not (for GTEST_SKIP).
  static std::string Unavailable() {
    if (geteuid() != 0) return "needs root to create network namespaces (run the test as root)";
    for (const char* tool : {"ip", "tc"}) {
      if (Run(std::string("command -v ") + tool).has_value()) {
        return std::string("needs iproute2's `") + tool + "` (scripts/setup.sh installs iproute2)";
      }
    }
    return "";
  }

  // A cluster of `hosts` hosts (1..253). nullptr with `*error` set when a
  // command failed (e.g. namespaces are not permitted in this container).
  static std::unique_ptr<NetnsCluster> Create(int hosts, std::string* error) {
    DeleteStaleNamespaces();
    static int serial = 0;
    std::unique_ptr<NetnsCluster> c(new NetnsCluster(
        std::string(kPrefix) + std::to_string(getpid()) + "x" + std::to_string(serial++)));
    const std::string br = c->BridgeNamespace();
    std::vector<std::string> steps = {"ip netns add " + br,
                                      "ip -n " + br + " link add br0 type bridge",
                                      "ip -n " + br + " link set br0 up"};
    for (int h = 0; h < hosts; ++h) {
      const std::string ns = c->base_ + "h" + std::to_string(h), port = "p" + std::to_string(h);
      steps.insert(steps.end(),
                   {"ip netns add " + ns,
                    "ip -n " + br + " link add " + port + " type veth peer name eth0 netns " + ns,
                    "ip -n " + br + " link set " + port + " master br0 up",
                    "ip -n " + ns + " link set lo up",
                    "ip -n " + ns + " addr add " + Address(h) + "/24 dev eth0",
                    "ip -n " + ns + " link set eth0 up"});
    }
    for (const std::string& step : steps) {
      if (auto failed = Run(step)) {
        *error = "`" + step + "` failed: " + *failed;
        return nullptr;
      }
      // Recorded as soon as made, so the destructor deletes what exists.
      if (step.starts_with("ip netns add ")) c->namespaces_.push_back(step.substr(13));
    }
    c->hosts_ = hosts;
    return c;
  }

  ~NetnsCluster() {
    // Hosts first: their veth ends go with them, then the bridge.
    for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) Run("ip netns del " + *it);
  }
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  int hosts() const { return hosts_; }
  static std::string Address(int host) { return "198.18.0." + std::to_string(host + 1); }
  std::string Namespace(int host) const { return base_ + "h" + std::to_string(host); }

  // Forks a child that enters `host`'s namespace and then runs
  // `in_child` (which should exec, or _exit). A child that cannot enter the
  // namespace exits 126.
  Child Spawn(int host, const std::function<void()>& in_child) const {
    return Child::Fork(
        [&in_child] {
          in_child();
          return 127;
        },
        {.in_child = [this, host] {
          if (!Enter(host)) _exit(126);
        }});
  }

  // Moves the calling process (single-threaded: a forked child) into
  // `host`'s namespace; false when that failed.
  bool Enter(int host) const {
    const int fd = open(("/var/run/netns/" + Namespace(host)).c_str(), O_RDONLY | O_CLOEXEC);
    const bool entered = fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
    if (fd >= 0) close(fd);
    return entered;
  }

  // Runs `fn` in a child in `host`'s namespace; its exit code (fn's return
  // value), 128 + signal when killed.
  int RunIn(int host, const std::function<int()>& fn) const {
    Child child = Spawn(host, [&] { _exit(fn()); });
    const Exit exit = child.Wait(std::chrono::seconds(60));
    return exit.timed_out ? -1 : exit.ShellCode();
  }

  // Pulls `host`'s cable: its eth0 goes down, so its processes run on but
  // reach no other host and are reached by none (no reset, no answer: a
  // crashed host or a network failure as the others see it). "" on
  // success, else ip's complaint.
  std::string CutOff(int host) const {
    return Run("ip -n " + Namespace(host) + " link set eth0 down").value_or("");
  }

  // Drops every packet between `host` and the others (nftables rules on its
  // eth0, in its namespace; its own loopback traffic flows): its link stays
  // up and nothing is reset, so its peers' connections and requests hang
  // until their own timeouts (a switch or firewall failing silently).
  // Heal() lifts it. "" on success, else nft's complaint (nftables missing:
  // scripts/setup.sh installs it).
  std::string SilentCut(int host) const {
    const std::string nft = "ip netns exec " + Namespace(host) + " nft ";
    for (const std::string& step :
         {nft + "add table inet fleet_cut",
          nft + "'add chain inet fleet_cut in { type filter hook input priority 0; }'",
          nft + "'add chain inet fleet_cut out { type filter hook output priority 0; }'",
          nft + "add rule inet fleet_cut in iifname eth0 drop",
          nft + "add rule inet fleet_cut out oifname eth0 drop"}) {
      if (auto failed = Run(step)) return "`" + step + "` failed: " + *failed;
    }
    return "";
  }
  std::string Heal(int host) const {
    return Run("ip netns exec " + Namespace(host) + " nft delete table inet fleet_cut")
        .value_or("");
  }

  // Gives `host` a second address on its eth0 (same /24) and makes it the
  // one the kernel picks as the source of connections to the other hosts:
  // a machine with two addresses that the job knows by the first. "" on
  // success, else ip's complaint.
  std::string AddPreferredAddress(int host, const std::string& address) const {
    const std::string ns = Namespace(host);
    for (const std::string& step :
         {"ip -n " + ns + " addr add " + address + "/24 dev eth0",
          "ip -n " + ns + " route replace 198.18.0.0/24 dev eth0 src " + address}) {
      if (auto failed = Run(step)) return "`" + step + "` failed: " + *failed;
    }
    return "";
  }

  // Caps what `host` sends to `rate` (tc's syntax, e.g. "20mbit") with a
  // token bucket filter on its eth0. "" on success, else tc's complaint.
  std::string CapBandwidth(int host, const std::string& rate) const {
    const auto failed = Run("tc -n " + Namespace(host) + " qdisc add dev eth0 root tbf rate " +
                            rate + " burst 64kb latency 200ms");
    return failed.value_or("");
  }

 private:
  explicit NetnsCluster(std::string base) : base_(std::move(base)) {}
  std::string BridgeNamespace() const { return base_ + "br"; }

  // Runs a shell command; nullopt on success, else its output (or status).
  static std::optional<std::string> Run(const std::string& command) {
    CommandResult run = RunCommand(command);
    if (run.exit_code == 0) return std::nullopt;
    std::string& out = run.output;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out.empty() ? "exit status " + std::to_string(run.exit_code) : out;
  }

  // Namespaces named by a cluster of a process that no longer runs.
  static void DeleteStaleNamespaces() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/var/run/netns", ec)) {
      const std::string name = entry.path().filename();
      if (!name.starts_with(kPrefix)) continue;
      const pid_t owner = std::atoi(name.c_str() + std::string_view(kPrefix).size());
      if (owner > 0 && (kill(owner, 0) == 0 || errno != ESRCH)) continue;
      Run("ip netns del " + name);
    }
  }

  const std::string base_;
  std::vector<std::string> namespaces_;
  int hosts_ = 0;
};

}  // namespace fleet::testing
