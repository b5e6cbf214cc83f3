// Chaos test: faults injected into a real PS job (fleetrun in simulation
// mode, 2 ps_server + 2 ps_worker training ctr_dnn in sync mode), one fault
// per run: kill -9 of a server, of a worker, of a heter worker (a job with one)
// and of fleetrun itself, SIGSTOP of a worker and of a server, Ctrl-C (SIGINT)
// to fleetrun, kill -9 of a server while it writes its checkpoint (and of a
// collective mnist_mlp rank while it writes its own), a worker whose
// loss diverges to NaN, strangers against the KV store (slowloris, an
// endless header, forged credentials with bodies, a 300 MB PUT), an empty or garbage data folder, a collective rank dying in the
// shared-memory rendezvous, and a second job on a live job's log folder.
// For each it checks the exit code and
// the message that names the fault, that the job ends within a bound, and
// that no process of the job is left (neither the pids fleetrun logged nor
// any process carrying the job's FLEET_JOB_ID). It prints the observed times
// and messages as a table (ctest -V, or run the binary).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/launch/fleet_job.h"
#include "tests/raw_connection.h"
#include "tests/test_paths.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using fleet::testing::ProcessAlive;
using fleet::testing::ProcessesOfJob;
using fleet::testing::RawConnection;
using fleet::testing::ReadAll;
using fleet::testing::ResidentKib;

// What a job runs beyond the suite's base (ctr_dnn in sync mode on 2 servers
// and 2 workers, a hung peer noticed after 3 s).
struct JobSpec {
  std::string config = "configs/ctr_dnn.yaml";  // under FLEET_SOURCE_DIR
  std::vector<std::string> flags;               // more fleetrun flags
  std::vector<std::string> overrides;           // more -o Key=value, applied last
  size_t processes = 4;                         // fleetrun starts this many
  // A collective job instead: PROGRAM and its flags (config and overrides
  // unused; flags give --nproc_per_node).
  std::vector<std::string> program;
  // Worker 0 (rank 0) prints this once it trains.
  std::string training_line = "epoch 1 step";
};

// fleet_job.h's job (fleetrun's pid, output, job id, pids by name) and the
// endpoints the processes listen on.
struct Job : fleet::testing::FleetJob {
  // "server 0" -> "127.0.0.1:port", from fleetrun's "... listens on" lines.
  std::map<std::string, std::string> endpoints;
};

struct Outcome {
  int exit_code = -1;      // fleetrun's; 128 + signal when killed
  double seconds = 0;      // from the fault to the end of the job
  std::string message;     // the line naming the failure
  std::vector<pid_t> left; // processes of the job still alive afterwards
  fs::path logs;           // the job's log folder
  std::string output;      // fleetrun's
};

// Fills job.pids and job.endpoints from what fleetrun printed so far.
void ReadProcesses(Job& job) {
  job.ReadPids();
  const std::string out = job.Output();
  const std::regex listens(R"(fleetrun: (\w+ \d+) listens on (\S+))");
  for (std::sregex_iterator it(out.begin(), out.end(), listens), end; it != end; ++it) {
    job.endpoints[(*it)[1]] = (*it)[2];
  }
}

// A file under `dir` that process `pid` has open and whose name ends in
// ".tmp" (a checkpoint file being written), or "" if none right now.
std::string OpenTempFileUnder(pid_t pid, const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code link_ec;
    const fs::path target = fs::read_symlink(it->path(), link_ec);
    if (link_ec || target.parent_path() != dir) continue;
    const std::string name = target.filename();
    if (name.size() > 4 && name.ends_with(".tmp")) return name;
  }
  return "";
}

// Waits (at most 30 s) until `complete` exists (a save before finished) and
// process `pid` has a ".tmp" file under `dir` open, then SIGKILLs it at once.
// Returns that file's name, "" when it was never seen (the process is killed
// anyway).
std::string KillWhileWriting(pid_t pid, const fs::path& dir, const fs::path& complete) {
  std::string temp;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (temp.empty() && ProcessAlive(pid) && Clock::now() < deadline) {
    if (fs::exists(complete)) temp = OpenTempFileUnder(pid, dir);
    if (temp.empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  kill(pid, SIGKILL);
  return temp;
}

// The port of the KV store fleetrun serves (from its "KV store serving on"
// line), or -1 when it printed none within 30 s.
int KvPort(fleet::testing::FleetJob& job) {
  if (!job.WaitFor("KV store serving on ", std::chrono::seconds(30))) return -1;
  std::smatch m;
  const std::string out = job.Output();
  if (!std::regex_search(out, m, std::regex(R"(KV store serving on [^ ]*:(\d+) )"))) return -1;
  return std::stoi(m[1]);
}

// Shared-memory segments of process `pid` in /dev/shm (ShmCollective names
// them "fleet-<creator pid>-<random>").
std::vector<std::string> ShmSegmentsOf(pid_t pid) {
  std::vector<std::string> names;
  const std::string prefix = "fleet-" + std::to_string(pid) + "-";
  for (const auto& e : fs::directory_iterator("/dev/shm")) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) names.push_back(e.path().filename());
  }
  return names;
}

class ChaosTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bin_ = fleet::testing::BinDir();
    src_ = fleet::testing::SourceDir();
    dir_ = fs::temp_directory_path() / ("fleet_chaos_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    ASSERT_EQ(fleet::testing::GenerateCtrData(bin_, dir_ / "data", 4000), "");
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_);
    std::printf("\nchaos summary (time from the fault to the job's end):\n%s", table_.c_str());
  }

  // Starts fleetrun on the job (without waiting for anything).
  Job Start(const std::string& name, const JobSpec& spec) {
    std::string id = name;
    for (char& c : id) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    const std::string job_id = "chaos_" + id + "_" + std::to_string(getpid());
    const fs::path data = dir_ / "data";
    std::vector<std::string> args = {bin_ + "/fleetrun", "--http_port=0", "--grace_period=1",
                                     "--job_id=" + job_id, "--log_dir=" + (dir_ / "log").string()};
    args.insert(args.end(), spec.flags.begin(), spec.flags.end());
    if (!spec.program.empty()) {
      args.insert(args.end(), spec.program.begin(), spec.program.end());
    } else {
      args.insert(args.end(), {"--server_num=2", "--worker_num=2", "--config=" + src_ + "/" + spec.config});
      std::vector<std::string> overrides = {
          "data.train=" + (data / "train").string(), "data.test=" + (data / "test").string(),
          "data.oracle=" + (data / "oracle.txt").string(), "train.epochs=1000", "train.batch_size=64",
          "train.log_interval=5",
          // A hung peer is noticed after this long (the README's bound for it).
          "Distributed.timeout_ms=3000"};
      overrides.insert(overrides.end(), spec.overrides.begin(), spec.overrides.end());
      for (const std::string& o : overrides) args.insert(args.end(), {"-o", o});
    }
    Job job;
    static_cast<fleet::testing::FleetJob&>(job) =
        fleet::testing::StartFleetrun(std::move(args), dir_ / (id + ".out"), job_id);
    return job;
  }

  // Waits until worker 0 (rank 0) has logged training steps; false (with a failure
  // recorded) if fleetrun ended first or that took 30 s.
  bool WaitForTraining(const std::string& name, const JobSpec& spec, Job& job) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      if (ReadAll(job.output).find(spec.training_line) != std::string::npos) {
        ReadProcesses(job);
        return true;
      }
      int status = 0;
      if (waitpid(job.fleetrun, &status, WNOHANG) == job.fleetrun) {
        ADD_FAILURE() << name << ": fleetrun ended before training:\n" << ReadAll(job.output);
        return false;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    ADD_FAILURE() << name << ": no training step within 30 s:\n" << ReadAll(job.output);
    kill(job.fleetrun, SIGTERM);
    waitpid(job.fleetrun, nullptr, 0);
    return false;
  }

  // Waits for the end of a job whose fault happened at `fault` (bounded by
  // `limit_s` from then), records what happened and adds the table row.
  Outcome Finish(const std::string& name, Job& job, Clock::time_point fault, double limit_s) {
    Outcome o;
    const auto limit = fault + milliseconds(static_cast<int64_t>(limit_s * 1000));
    int status = 0;
    bool reaped = false;
    // fleetrun's end; after a kill -9 of fleetrun, the end of its processes.
    while (Clock::now() < limit) {
      if (!reaped && waitpid(job.fleetrun, &status, WNOHANG) == job.fleetrun) reaped = true;
      if (reaped && ProcessesOfJob(job.job_id).empty()) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    o.seconds = std::chrono::duration<double>(Clock::now() - fault).count();
    o.logs = dir_ / "log" / job.job_id;
    if (!reaped) {
      ADD_FAILURE() << name << ": fleetrun still running " << limit_s << " s after the fault";
      kill(job.fleetrun, SIGKILL);
      waitpid(job.fleetrun, &status, 0);
    }
    o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(milliseconds(200));  // a straggler would show now
    ReadProcesses(job);
    o.left = job.Left();
    // The first line fleetrun wrote about the end, and the last line of the
    // log tail it printed after it (the failed process's own error).
    o.output = ReadAll(job.output);
    const std::string& out = o.output;
    std::smatch m;
    if (std::regex_search(out, m, std::regex(R"(fleetrun: (received|\w+ \d+ \(pid \d+\))[^\n]*)"))) {
      o.message = m[0];
      const size_t at = m.position(0);
      const size_t tail_end = out.find("\nfleetrun: job failed", at);
      const size_t last = tail_end == std::string::npos ? std::string::npos : out.rfind("\n  | ", tail_end);
      if (last != std::string::npos && last > at) o.message += " // " + out.substr(last + 5, tail_end - last - 5);
    }
    char row[768];
    std::snprintf(row, sizeof(row), "  %-24s exit %3d  %6.2f s  left %zu  %s\n", name.c_str(), o.exit_code,
                  o.seconds, o.left.size(), o.message.empty() ? "(fleetrun printed nothing)" : o.message.c_str());
    table_ += row;
    if (!o.left.empty() || HasFailure()) std::printf("%s output:\n%s\n", name.c_str(), out.c_str());
    return o;
  }

  // Adds a table row for an outcome Finish did not describe.
  void AddRow(const std::string& name, int exit_code, double seconds, const std::string& message) {
    char row[768];
    std::snprintf(row, sizeof(row), "  %-24s exit %3d  %6.2f s  left 0  %s\n", name.c_str(), exit_code, seconds,
                  message.c_str());
    table_ += row;
  }

  // Runs `inject` on a training job (the fault is timed from its return)
  // and waits for the end, bounded by `limit_s`.
  Outcome Inject(const std::string& name, const std::function<void(Job&)>& inject, double limit_s,
                 const JobSpec& spec = {}) {
    Job job = Start(name, spec);
    if (!WaitForTraining(name, spec, job)) return {};
    EXPECT_EQ(job.pids.size(), spec.processes) << ReadAll(job.output);
    inject(job);
    return Finish(name, job, Clock::now(), limit_s);
  }

  // Runs a job whose fault is in its own configuration, timed from its start.
  Outcome Run(const std::string& name, const JobSpec& spec, double limit_s) {
    const auto start = Clock::now();
    Job job = Start(name, spec);
    return Finish(name, job, start, limit_s);
  }

  static std::string bin_, src_, table_;
  static fs::path dir_;
};

std::string ChaosTest::bin_, ChaosTest::src_, ChaosTest::table_;
fs::path ChaosTest::dir_;

TEST_F(ChaosTest, KillNineOfAServerFailsTheJobNamingIt) {
  pid_t victim = -1;
  Outcome o = Inject("kill -9 server 0", [&](Job& j) { kill(victim = j.pids["server 0"], SIGKILL); }, 5);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.message.find("server 0 (pid " + std::to_string(victim) + ") was killed by signal 9"),
            std::string::npos)
      << o.message;
  EXPECT_TRUE(o.left.empty());
}

TEST_F(ChaosTest, KillNineOfAWorkerFailsTheJobNamingIt) {
  Outcome o = Inject("kill -9 worker 1", [](Job& j) { kill(j.pids["worker 1"], SIGKILL); }, 5);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.message.find("worker 1 (pid"), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("killed by signal 9"), std::string::npos) << o.message;
  EXPECT_TRUE(o.left.empty());
  // The job was abandoned: its servers stop without writing their tables
  // as if it had finished.
  for (const char* log : {"serverlog.0", "serverlog.1"}) {
    EXPECT_NE(ReadAll(o.logs / log).find("stopping without the final save"), std::string::npos)
        << log << ":\n" << ReadAll(o.logs / log);
  }
}

// A job with a heter worker (the small model of tests/heter: dense 4321 =
// (26 * 4 + 13) -> 32 -> 16 -> 1). Without --max_restart its death fails the
// job at once, naming it (heter_process_test covers the restart).
TEST_F(ChaosTest, KillNineOfAHeterWorkerFailsTheJobNamingIt) {
  JobSpec spec;
  spec.config = "configs/ctr_dnn_heter.yaml";
  spec.flags = {"--heter_worker_num=1"};
  spec.overrides = {"tables.0.dim=4", "tables.0.shard_num=8", "tables.1.dim=4321", "model.hidden=[32, 16]"};
  spec.processes = 5;
  pid_t victim = -1;
  Outcome o = Inject("kill -9 heter_worker 0", [&](Job& j) { kill(victim = j.pids["heter_worker 0"], SIGKILL); },
                     5, spec);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.message.find("heter_worker 0 (pid " + std::to_string(victim) + ") was killed by signal 9"),
            std::string::npos)
      << o.message;
  EXPECT_TRUE(o.left.empty());
}

// fleetrun gets no chance to stop anyone: PR_SET_PDEATHSIG takes the
// processes down with it.
TEST_F(ChaosTest, KillNineOfFleetrunLeavesNoProcess) {
  Outcome o = Inject("kill -9 fleetrun", [](Job& j) { kill(j.fleetrun, SIGKILL); }, 5);
  EXPECT_EQ(o.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(o.left.empty());
  EXPECT_LT(o.seconds, 2.0);
}

// A frozen worker: in sync mode the others wait for its push; they give up
// after Distributed.timeout_ms (3 s here) and the job fails.
TEST_F(ChaosTest, StoppedWorkerIsNoticedWithinTheTimeout) {
  Outcome o = Inject("SIGSTOP worker 1", [](Job& j) { kill(j.pids["worker 1"], SIGSTOP); }, 15);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_FALSE(o.message.empty());
  EXPECT_LT(o.seconds, 3.0 + 5.0);  // the timeout, then the stop (SIGTERM, SIGKILL after 1 s)
  EXPECT_TRUE(o.left.empty());
  // Stopping continues a stopped process, so it acts on SIGTERM instead of
  // being SIGKILLed after the grace period.
  EXPECT_NE(ReadAll(o.logs / "workerlog.1").find("ps_worker: signal 15"), std::string::npos)
      << ReadAll(o.logs / "workerlog.1");
}

// A frozen server: the workers' calls to it fail, naming the server and its
// endpoint, after Distributed.timeout_ms (3 s here) or, with a longer
// deadline, once the ZeroMQ heartbeats declare it lost (no answer to a ping
// sent each second for 5 s: 5-6 s). The stop continues it so it can act on
// SIGTERM.
TEST_F(ChaosTest, StoppedServerIsNoticedWithinABoundNamingIt) {
  struct Case {
    int timeout_ms;
    std::string error;
    double bound_s;  // of the detection
  };
  for (const Case& c : {Case{3000, "got no reply within", 3.0}, Case{20000, "missed heartbeats", 6.5}}) {
    SCOPED_TRACE(c.timeout_ms);
    JobSpec spec;
    spec.overrides = {"Distributed.timeout_ms=" + std::to_string(c.timeout_ms)};
    std::string endpoint;
    Outcome o = Inject("SIGSTOP server 1, " + std::to_string(c.timeout_ms / 1000) + " s",
                       [&](Job& j) {
                         endpoint = j.endpoints["server 1"];
                         kill(j.pids["server 1"], SIGSTOP);
                       },
                       c.bound_s + 10, spec);
    EXPECT_EQ(o.exit_code, 1);
    ASSERT_FALSE(endpoint.empty()) << o.output;
    const size_t named = o.message.find("on server 1");
    EXPECT_NE(named, std::string::npos) << o.message;
    EXPECT_EQ(o.message.find("on server 1", named + 1), std::string::npos) << "the call named twice: " << o.message;
    EXPECT_NE(o.message.find(c.error), std::string::npos) << o.message;
    EXPECT_NE(o.message.find(endpoint), std::string::npos) << o.message;
    EXPECT_LT(o.seconds, c.bound_s + 5.0);  // then the stop (SIGINT, SIGKILL after 1 s)
    EXPECT_TRUE(o.left.empty());
    // Continued by the stop, the frozen server acts on it: an abandoned
    // job's stop, without the final save.
    EXPECT_NE(ReadAll(o.logs / "serverlog.1").find("ps_server: signal 2, stopping without"),
              std::string::npos)
        << ReadAll(o.logs / "serverlog.1");
  }
}

TEST_F(ChaosTest, CtrlCStopsEveryProcess) {
  Outcome o = Inject("SIGINT fleetrun", [](Job& j) { kill(j.fleetrun, SIGINT); }, 5);
  EXPECT_EQ(o.exit_code, 128 + SIGINT);
  EXPECT_NE(o.message.find("received"), std::string::npos) << o.message;
  EXPECT_TRUE(o.left.empty());
  EXPECT_NE(ReadAll(o.logs / "serverlog.0").find("stopping without the final save"),
            std::string::npos)
      << ReadAll(o.logs / "serverlog.0");
}

// kill -9 of a server while it writes the checkpoint of its graceful stop
// (server.save_dir, when fleetrun stops the servers after the workers
// finished; 1024 shards make that save last ~0.1 s). fleetrun reports it,
// and the generation saved before in that directory is still what a server
// loads: the interrupted one has no manifest of server 0, so it is never
// taken as complete.
TEST_F(ChaosTest, KillNineDuringACheckpointSaveKeepsThePreviousOne) {
  const fs::path save = dir_ / "checkpoint";
  JobSpec spec;
  // Time for the save of 1024 shards on a loaded machine before fleetrun's SIGKILL.
  spec.flags = {"--grace_period=20"};
  spec.overrides = {"server.save_dir=" + save.string(), "tables.0.shard_num=1024"};
  spec.overrides.push_back("train.epochs=1");
  // Generation 0: a finished job, whose servers save as they stop.
  Outcome first = Run("finished, saving gen 0", spec, 60);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (const char* manifest : {"MANIFEST-g000000-s00000-of-00002", "MANIFEST-g000000-s00001-of-00002"}) {
    ASSERT_TRUE(fs::exists(save / manifest)) << manifest;
  }
  // Generation 1: one epoch, then the stop's save, during which server 0 dies.
  std::string temp;  // the file server 0 was writing when killed
  Outcome o = Inject("kill -9 server 0 saving", [&](Job& j) {
                       temp = KillWhileWriting(j.pids["server 0"], save, save / "MANIFEST-g000000-s00000-of-00002");
                     },
                     5, spec);
  ASSERT_FALSE(temp.empty()) << "server 0 was never seen writing a checkpoint file\n" << o.output;
  EXPECT_NE(temp.find("-g000001"), std::string::npos) << temp;
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.message.find("server 0 (pid "), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("killed by signal 9 (Killed) while stopping"), std::string::npos) << o.message;
  EXPECT_TRUE(o.left.empty());
  EXPECT_TRUE(fs::exists(save / temp)) << "the half-written file";
  EXPECT_FALSE(fs::exists(save / "MANIFEST-g000001-s00000-of-00002"));

  // One server loads the directory (a load takes every shard whatever the
  // number of servers that saved it), then is stopped.
  const fs::path out = dir_ / "load.out";
  std::vector<std::string> args = {bin_ + "/ps_server", "--auth=off", "--endpoint=127.0.0.1:0",
                                   "--config=" + src_ + "/configs/ctr_dnn.yaml",
                                   "--override=server.load_dir=" + save.string() + ";tables.0.shard_num=1024"};
  fleet::testing::Child server(args, {.stdout_file = out.string(), .stderr_file = out.string()});
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  std::optional<fleet::testing::Exit> ended;
  while (Clock::now() < deadline && ReadAll(out).find("listening on") == std::string::npos) {
    if ((ended = server.Poll())) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (!ended) {
    server.Kill(SIGTERM);
    ended = server.Wait(std::chrono::seconds(30));
  }
  const std::string loaded = ReadAll(out);
  EXPECT_NE(loaded.find("server 0: loaded checkpoint " + save.string()), std::string::npos) << loaded;
  EXPECT_NE(loaded.find("listening on"), std::string::npos) << loaded;
  EXPECT_TRUE(ended->exited && ended->code == 0) << loaded;
  // The load removed what the killed save left in the files it now owns (a
  // manifest's temp file names a server of 2 and stays; the data stayed for
  // good before).
  if (temp.rfind("MANIFEST", 0) != 0) {
    EXPECT_FALSE(fs::exists(save / temp)) << "the half-written file";
    EXPECT_NE(loaded.find("left in " + save.string() + " by an unfinished save of server 0"), std::string::npos)
        << loaded;
  }
  std::printf("server 0 killed writing %s; a fresh server loaded the directory and removed it\n", temp.c_str());
}

// kill -9 of collective rank 0 of mnist_mlp while it writes its checkpoint
// (every 2 steps; rank 0 writes the folder): the job fails naming it, and a
// new run on the folder resumes from the last complete save, the
// half-written file left aside.
TEST_F(ChaosTest, KillNineOfARankDuringItsCheckpointKeepsThePreviousOne) {
  const fs::path ckpt = dir_ / "mnist_checkpoint";
  auto mnist = [&](const std::string& steps) {
    JobSpec spec;
    spec.flags = {"--nproc_per_node=2"};
    spec.program = {bin_ + "/mnist_mlp", "--max_train_samples=4096", "--blas_threads=1", "--log_every_steps=2",
                    "--checkpoint_dir=" + ckpt.string(), "--checkpoint_every_steps=2",
                    "--collective_timeout_ms=3000", steps};
    spec.training_line = "train_loss";
    spec.processes = 2;
    return spec;
  };
  std::string temp;  // the file rank 0 was writing when killed
  Outcome o = Inject("kill -9 rank 0 saving", [&](Job& j) {
                       temp = KillWhileWriting(j.pids["collective 0"], ckpt, ckpt / "mlp.ckpt");
                     },
                     10, mnist("--epochs=1000"));
  ASSERT_FALSE(temp.empty()) << "rank 0 was never seen writing a checkpoint file\n" << o.output;
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.message.find("collective 0 (pid "), std::string::npos) << o.message;
  EXPECT_NE(o.message.find("killed by signal 9"), std::string::npos) << o.message;
  EXPECT_TRUE(o.left.empty());
  EXPECT_TRUE(fs::exists(ckpt / temp)) << "the half-written file";

  // The last step rank 0 logged bounds the one the complete save holds.
  int64_t logged = -1;
  const std::regex step_line(R"(step: (\d+), train_loss)");
  for (std::sregex_iterator it(o.output.begin(), o.output.end(), step_line), end; it != end; ++it) {
    logged = std::stoll((*it)[1]);
  }
  ASSERT_GT(logged, 0) << o.output;
  Outcome r = Run("resume after it", mnist("--max_steps=" + std::to_string(logged + 4)), 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("resumed from " + (ckpt / "mlp.ckpt").string() +
                                                        R"( at step (\d+))")))
      << r.output;
  const int64_t resumed = std::stoll(m[1]);
  EXPECT_GT(resumed, 0);
  EXPECT_EQ(resumed % 2, 0) << "a step that was saved";
  EXPECT_LE(resumed, logged + 2);
  EXPECT_TRUE(r.left.empty());
  std::printf("rank 0 killed writing %s after logging step %lld; the new run resumed at step %lld\n", temp.c_str(),
              static_cast<long long>(logged), static_cast<long long>(resumed));
}

// Strangers without the job key against fleetrun's KV store, all at once,
// from the moment it serves: 1,100 connections each sending the start of a
// request and then a byte every 2 s (slowloris); one endless header line
// (256 MiB); 30 requests with a well-formed but forged X-Fleet-Auth and a
// 16 MiB body; a 300 MB PUT. The job starts (every process publishes and
// finds endpoints through the store), trains and ends as usual, and
// fleetrun's resident memory grows by less than 64 MiB. Before the store
// ran on comm/http_server.h: the slowloris took every one of its 1,024
// threads and a worker failed with "kv store set failed: Read"; the
// header line grew fleetrun by ~1 GiB, the forged credentials by ~560 MiB
// (their bodies were read before the signature was checked), the PUT by
// ~340 MiB.
TEST_F(ChaosTest, StrangersAgainstTheKvStoreNeitherStopTheJobNorGrowFleetrun) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  JobSpec spec;
  spec.overrides = {"train.epochs=2"};
  const auto start = Clock::now();
  Job job = Start("strangers, KV store", spec);
  const int port = KvPort(job);
  ASSERT_GT(port, 0) << job.Output();
  const int64_t before = ResidentKib(job.fleetrun);
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 1100; ++i) {
    slow.push_back(std::make_unique<RawConnection>(port));
    slow.back()->Send("GET /health HTTP/1.1\r\n");
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (int tick = 0; !done.load(); ++tick) {
      if (tick % 200 == 0) {
        for (auto& c : slow) c->Send("X");
      }
      std::this_thread::sleep_for(milliseconds(10));  // the attack's pace (2 s), checked often
    }
  });
  int64_t peak = before;
  auto sample = [&] { peak = std::max(peak, ResidentKib(job.fleetrun)); };
  // The endless header line, 1 MiB at a time, until the store closes it.
  std::string header_reply;
  {
    RawConnection endless(port);
    endless.Send("GET /health HTTP/1.1\r\nX-Endless: ");
    const std::string chunk(1 << 20, 'A');
    for (int mib = 0; mib < 256 && endless.Send(chunk); ++mib) sample();
    header_reply = endless.ReadAll();
  }
  // Forged credentials with bodies, then the 300 MB PUT.
  const std::string forged =
      "PUT /kv/x/y HTTP/1.1\r\nHost: x\r\nContent-Length: 16777216\r\nX-Fleet-Auth: v2 " +
      std::to_string(std::time(nullptr) * 1000) + " " + std::string(32, 'a') + " " +
      std::string(64, 'b') + " " + std::string(64, '0') + "\r\n\r\n";
  std::vector<std::string> forged_replies;
  {
    std::vector<std::unique_ptr<RawConnection>> liars;
    const std::string body(1 << 20, 'B');
    for (int i = 0; i < 30; ++i) {
      liars.push_back(std::make_unique<RawConnection>(port));
      liars.back()->Send(forged);
      for (int mib = 0; mib < 16 && liars.back()->Send(body); ++mib) {
      }
      sample();
    }
    for (auto& l : liars) forged_replies.push_back(l->ReadAll().substr(0, 12));
  }
  std::string put_reply;
  {
    RawConnection put(port);
    put.Send("PUT /kv/x/y HTTP/1.1\r\nHost: x\r\nContent-Length: 314572800\r\n\r\n");
    const std::string chunk(1 << 20, 'C');
    for (int mib = 0; mib < 300 && put.Send(chunk); ++mib) sample();
    put_reply = put.ReadAll();
  }
  sample();
  Outcome o = Finish("strangers, KV store", job, start, 120);
  done.store(true);
  trickle.join();
  EXPECT_EQ(header_reply.rfind("HTTP/1.1 431", 0), 0u) << header_reply.substr(0, 200);
  for (const std::string& r : forged_replies) EXPECT_EQ(r, "HTTP/1.1 403");
  EXPECT_EQ(put_reply.rfind("HTTP/1.1 401", 0), 0u) << put_reply;
  ASSERT_GT(before, 0);
  EXPECT_LT(peak - before, 64 * 1024) << "fleetrun grew by " << (peak - before) / 1024 << " MiB";
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("all workers finished"), std::string::npos) << o.output;
  EXPECT_TRUE(o.left.empty());
  std::printf("strangers against the KV store: fleetrun's RSS %+lld KiB at the peak\n",
              static_cast<long long>(peak - before));
}

// A training directory that is empty, or holds only garbage lines: every
// worker exits 2 naming data.train and what it found there (they died with
// SIGFPE), and so does fleetrun.
TEST_F(ChaosTest, NoUsableTrainingDataExitsTwoNamingTheData) {
  for (const auto& [name, lines] : {std::pair<std::string, std::string>{"empty", ""},
                                    {"garbage", "not a ctr line\n\x01\x02\x03\n"}}) {
    const fs::path train = dir_ / ("train_" + name);
    fs::create_directories(train);
    if (!lines.empty()) std::ofstream(train / "part-0") << lines;
    JobSpec spec;
    spec.overrides = {"data.train=" + train.string()};
    Outcome o = Run(name + " data dir", spec, 30);
    EXPECT_EQ(o.exit_code, 2) << o.output;
    EXPECT_NE(o.output.find("no training data: no worker of 2 got a batch"), std::string::npos) << o.output;
    EXPECT_NE(o.output.find("'" + train.string() + "': data.train"), std::string::npos) << o.output;
    EXPECT_TRUE(o.left.empty());
  }
}

// A collective rank dies during the shared-memory rendezvous: rank 1 of
// mnist_mlp is stopped as soon as it starts (so it cannot map rank 0's
// segment), killed once rank 0 has created the segment. fleetrun stops the
// job and no /dev/shm/fleet-<pid>-* segment of it is left (3 MiB each
// leaked in 2 of 2 tries before).
TEST_F(ChaosTest, RankDyingInTheShmRendezvousLeavesNoSegment) {
  JobSpec spec;
  spec.flags = {"--nproc_per_node=2"};
  spec.program = {bin_ + "/mnist_mlp", "--max_train_samples=4096", "--blas_threads=1", "--epochs=1",
                  "--collective_timeout_ms=60000"};
  spec.processes = 2;
  Job job = Start("rank dies in shm rendezvous", spec);
  ASSERT_TRUE(job.WaitFor("started collective 1", std::chrono::seconds(30))) << job.Output();
  const pid_t rank0 = job.pids["collective 0"], rank1 = job.pids["collective 1"];
  kill(rank1, SIGSTOP);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (ShmSegmentsOf(rank0).empty() && ProcessAlive(rank0) && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const std::vector<std::string> segments = ShmSegmentsOf(rank0);
  kill(rank1, SIGKILL);
  const auto fault = Clock::now();
  Outcome o = Finish("rank dies in shm rendezvous", job, fault, 15);
  ASSERT_FALSE(segments.empty()) << "rank 0 never created its segment\n" << o.output;
  EXPECT_EQ(o.exit_code, 1) << o.output;
  EXPECT_NE(o.message.find("collective 1 (pid " + std::to_string(rank1) + ") was killed by signal 9"),
            std::string::npos)
      << o.message;
  EXPECT_TRUE(o.left.empty());
  EXPECT_TRUE(ShmSegmentsOf(rank0).empty()) << ShmSegmentsOf(rank0).front();
}

// A second job on the same machine that would write into a live job's log
// folder (same --log_dir and --job_id) is refused at once, naming the live
// job's fleetrun, and starts nothing; the first job's logs are untouched
// (it truncated them before) and the first job finishes.
TEST_F(ChaosTest, SecondJobOnALiveJobsLogDirIsRefused) {
  JobSpec spec;
  spec.overrides = {"train.epochs=2"};
  Job first = Start("log dir taken", spec);
  ASSERT_TRUE(WaitForTraining("log dir taken", spec, first));
  const fs::path worker_log = dir_ / "log" / first.job_id / "workerlog.0";
  const std::string before = ReadAll(worker_log);
  const auto start = Clock::now();
  fleet::testing::FleetJob second = fleet::testing::StartFleetrun(
      {bin_ + "/fleetrun", "--http_port=0", "--job_id=" + first.job_id, "--log_dir=" + (dir_ / "log").string(),
       "--server_num=1", "--worker_num=1", "--config=" + src_ + "/configs/ctr_dnn.yaml"},
      dir_ / "second.out", first.job_id);
  const std::optional<int> rc = second.WaitForExit(std::chrono::seconds(30));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string said = second.Output();
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 2) << said;
  EXPECT_NE(said.find("is in use by another live job (fleetrun job " + first.job_id +
                      " host (one machine) pid " + std::to_string(first.fleetrun)),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("started"), std::string::npos) << said;
  EXPECT_EQ(ReadAll(worker_log).rfind(before, 0), 0u) << "the first job's log was rewritten";
  AddRow("second job, same log dir", *rc, seconds, said.substr(0, said.find('\n')));
  Outcome o = Finish("first job, log dir kept", first, Clock::now(), 90);
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_TRUE(o.left.empty());
}

// A worker whose model diverges (dense learning rate 1e30: the weights
// overflow after a step or two). In async mode the worker's own check fails
// the job ("training loss is NaN") before it pushes more; in sync mode the
// step's NaN gradient reaches the servers first, which refuse it. Either
// way fleetrun exits 1 and nothing reaches train.save_dir.
TEST_F(ChaosTest, ADivergingWorkerFailsTheJobAndSavesNothing) {
  for (const auto& [mode, error] : {std::pair<std::string, std::string>{"async", "training loss is "},
                                    {"sync", "NaN and Inf are refused"}}) {
    SCOPED_TRACE(mode);
    const fs::path save = dir_ / ("diverged_" + mode);
    JobSpec spec;
    spec.overrides = {"Distributed.mode=" + mode, "tables.1.optimizer.learning_rate=1e30", "train.epochs=1",
                      "train.save_dir=" + save.string()};
    Outcome o = Run("diverging loss, " + mode, spec, 30);
    EXPECT_EQ(o.exit_code, 1);
    EXPECT_NE(o.message.find(error), std::string::npos) << o.message;
    EXPECT_TRUE(o.left.empty());
    // Checked writable at the start (so it exists), never written.
    EXPECT_TRUE(fs::is_directory(save));
    EXPECT_TRUE(fs::is_empty(save)) << save;
  }
}

}  // namespace
