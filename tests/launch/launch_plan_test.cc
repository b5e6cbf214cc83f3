// fleetrun's flag parser and plan builder, in-process: no process started.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/cluster.h"
#include "launch/compat_env.h"
#include "launch/config_check.h"
#include "launch/net.h"
#include "launch/options.h"
#include "launch/plan.h"

namespace fleet::launch {
namespace {

namespace fs = std::filesystem;

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/launch_plan_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    for (const char* name : {"ps_server", "ps_worker", "heter_worker", "prog"}) {
      std::ofstream(dir_ / name) << "#!/bin/sh\n";
      chmod((dir_ / name).c_str(), 0755);
    }
    config_ = (dir_ / "job.yaml").string();
    std::ofstream(config_) << "a: 1\n";
    machine_.local_addresses = {"127.0.0.1", "10.0.0.2"};
    machine_.self_dir = dir_.string();
    machine_.path_env = dir_.string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result<JobLayout> Resolve(std::vector<std::string> args) {
    auto options = ParseLaunchArgs(args);
    if (!options.ok()) return options.status();
    return ResolveLayout(*options, machine_);
  }
  // The flag an invalid command line is rejected for.
  std::string RejectedFlag(std::vector<std::string> args) {
    auto job = Resolve(std::move(args));
    if (job.ok()) return "(accepted)";
    EXPECT_TRUE(job.status().IsInvalidArgument());
    const std::string& m = job.status().message();
    return m.substr(0, m.find(':'));
  }

  fs::path dir_;
  std::string config_;
  MachineInfo machine_;
};

std::string EnvOf(const ProcessSpec& spec, const std::string& name) {
  for (const auto& [k, v] : spec.env) {
    if (k == name) return v;
  }
  return "(absent)";
}

bool HasArg(const ProcessSpec& spec, const std::string& arg) {
  return std::find(spec.argv.begin(), spec.argv.end(), arg) != spec.argv.end();
}

TEST(ParseLaunchArgs, StopsAtProgramAndKeepsItsArgs) {
  auto o = ParseLaunchArgs({"--nproc_per_node", "2", "-o", "A.b=1", "-oC=2", "train", "--nproc_per_node=5", "-x"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->nproc_per_node, 2);
  EXPECT_EQ(o->overrides, (std::vector<std::string>{"A.b=1", "C=2"}));
  EXPECT_EQ(o->program, "train");
  EXPECT_EQ(o->program_args, (std::vector<std::string>{"--nproc_per_node=5", "-x"}));
  EXPECT_TRUE(o->Given("nproc_per_node"));
  EXPECT_FALSE(o->Given("gpus"));

  auto dashdash = ParseLaunchArgs({"--", "-weird-program", "a"});
  ASSERT_TRUE(dashdash.ok());
  EXPECT_EQ(dashdash->program, "-weird-program");
  EXPECT_TRUE(ParseLaunchArgs({"--devices=0"})->Given("gpus"));
}

TEST(ParseLaunchArgs, BadFlagsNameTheFlag) {
  EXPECT_EQ(ParseLaunchArgs({"--nope=1"}).status().message().rfind("--nope:", 0), 0u);
  EXPECT_EQ(ParseLaunchArgs({"--http_port=80x"}).status().message().rfind("--http_port:", 0), 0u);
  EXPECT_EQ(ParseLaunchArgs({"--grace_period=abc"}).status().message().rfind("--grace_period:", 0), 0u);
  EXPECT_EQ(ParseLaunchArgs({"--log_dir"}).status().message(), "--log_dir: missing value");
}

TEST_F(PlanTest, SimulationUsesLoopbackAndPortZero) {
  auto job = Resolve({"--server_num=2", "--worker_num=3", "--heter_worker_num=1", "--config=" + config_});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->mode, Mode::kPsSimulation);
  EXPECT_EQ(JoinEndpoints(job->servers), "127.0.0.1:0,127.0.0.1:0");
  EXPECT_EQ(job->local_workers, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(job->host_kv);
  // A job on this machine alone takes a free port for its store, so two never collide.
  EXPECT_EQ(job->kv_listen, "127.0.0.1:0");
  EXPECT_EQ(job->log_dir, "log");
  EXPECT_EQ(job->bin_dir, dir_.string());
  auto given = Resolve({"--server_num=1", "--worker_num=1", "--config=" + config_, "--http_port=7777"});
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(given->kv_listen, "127.0.0.1:7777");
  auto one_node = Resolve({"--nproc_per_node=2", "prog"});
  ASSERT_TRUE(one_node.ok()) << one_node.status().ToString();
  EXPECT_EQ(one_node->kv_listen, "127.0.0.1:0");
}

TEST_F(PlanTest, ClusterStartsOnlyThisMachinesProcesses) {
  auto job = Resolve({"--servers=10.0.0.1:7000,10.0.0.2:7000", "--workers=10.0.0.1,10.0.0.2,10.0.0.2:7100",
                      "--config=" + config_, "--job_id=j7"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->mode, Mode::kPsCluster);
  EXPECT_EQ(job->local_servers, (std::vector<int>{1}));
  EXPECT_EQ(job->local_workers, (std::vector<int>{1, 2}));
  EXPECT_EQ(JoinEndpoints(job->workers), "10.0.0.1:0,10.0.0.2:0,10.0.0.2:7100");
  EXPECT_FALSE(job->host_kv);  // the first server's machine hosts it
  EXPECT_EQ(job->kv_endpoint, "10.0.0.1:36001");
  EXPECT_EQ(job->log_dir, "log/j7");
}

TEST_F(PlanTest, InvalidCommandLinesNameTheirFlag) {
  const std::string cfg = "--config=" + config_;
  EXPECT_EQ(RejectedFlag({"--servers=10.0.0.1", "--workers=10.0.0.2", cfg}), "--servers");
  EXPECT_EQ(RejectedFlag({"--servers=10.0.0.1:7000,10.0.0.1:7000", "--workers=10.0.0.2", cfg}), "--servers");
  EXPECT_EQ(RejectedFlag({"--servers=10.0.0.1:99999", "--workers=10.0.0.2", cfg}), "--servers");
  EXPECT_EQ(RejectedFlag({"--servers=10.0.0.1:7000", "--workers=10.0.0.2,", cfg}), "--workers");
  EXPECT_EQ(RejectedFlag({"--worker_num=2", "--servers=10.0.0.1:7000", "--workers=10.0.0.2", cfg}), "--worker_num");
  EXPECT_EQ(RejectedFlag({"--servers=10.0.0.1:7000", cfg}), "--workers");
  EXPECT_EQ(RejectedFlag({"--servers=127.0.0.1:7000", "--workers=10.0.0.2", cfg}), "--servers");
  EXPECT_EQ(RejectedFlag({"--servers=10.0.0.9:7000", "--workers=10.0.0.8", cfg}), "--servers");
  EXPECT_EQ(RejectedFlag({"--servers=10.0.0.1:7000", "--workers=10.0.0.2", cfg, "--http_port=0"}), "--http_port");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1"}), "--config");
  EXPECT_EQ(RejectedFlag({"--server_num=1", cfg}), "--worker_num");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1", cfg, "--bin_dir=/nonexistent"}), "--bin_dir");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1", cfg, "missing_program"}), "PROGRAM");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1", cfg, "--nnodes=2"}), "--nnodes");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1", cfg, "-o", "noequals"}), "-o");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1", cfg, "--job_id=a/b"}), "--job_id");
  EXPECT_EQ(RejectedFlag({}), "PROGRAM");
  EXPECT_EQ(RejectedFlag({"missing_program"}), "PROGRAM");
  EXPECT_EQ(RejectedFlag({"--gpus=0", "prog"}), "--gpus");
  EXPECT_EQ(RejectedFlag({"--master=10.0.0.1:36001", "prog"}), "--nnodes");
  EXPECT_EQ(RejectedFlag({"--ips=10.0.0.7,10.0.0.8", "prog"}), "--ips");
  EXPECT_EQ(RejectedFlag({"--ips=10.0.0.2,10.0.0.3", "--nnodes=3", "prog"}), "--nnodes");
}

// --master is the same on every node: the node owning the address hosts
// the store there, the others only reach it (it once hosted nowhere, so
// the same command on every node never started).
TEST_F(PlanTest, TheNodeOwningTheMasterAddressHostsTheStore) {
  auto master = Resolve({"--master=10.0.0.2:36001", "--nnodes=2", "prog"});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  EXPECT_TRUE(master->host_kv);
  EXPECT_EQ(master->kv_listen, "10.0.0.2:36001");
  EXPECT_EQ(master->collective.node_host, "10.0.0.2");
  auto other = Resolve({"--master=10.0.0.1:36001", "--nnodes=2", "prog"});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(other->host_kv);
  EXPECT_EQ(other->kv_endpoint, "10.0.0.1:36001");
  EXPECT_EQ(other->collective.node_host, "10.0.0.2");
}

// Each maximum is accepted, one more is refused before anything starts
// (--server_num=100000 used to fork until the machine ran out of memory).
TEST_F(PlanTest, CountsAboveTheDocumentedMaximaAreRefused) {
  const std::string cfg = "--config=" + config_;
  std::string many_servers, many_ips;
  for (int i = 0; i <= kMaxProcessesPerRole; ++i) many_servers += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(7000 + i);
  for (int i = 0; i <= kMaxNodes; ++i) many_ips += (i ? "," : "") + std::string("10.1.") + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
  EXPECT_EQ(RejectedFlag({"--server_num=100000", "--worker_num=1", cfg}), "--server_num");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1025", cfg}), "--worker_num");
  EXPECT_EQ(RejectedFlag({"--server_num=1", "--worker_num=1", "--heter_worker_num=1025", cfg}), "--heter_worker_num");
  EXPECT_EQ(RejectedFlag({"--servers=" + many_servers, "--workers=127.0.0.1", cfg}), "--servers");
  EXPECT_EQ(RejectedFlag({"--nproc_per_node=1025", "prog"}), "--nproc_per_node");
  EXPECT_EQ(RejectedFlag({"--nnodes=1025", "prog"}), "--nnodes");
  EXPECT_EQ(RejectedFlag({"--ips=" + many_ips, "prog"}), "--ips");
  EXPECT_EQ(RejectedFlag({"--max_restart=101", "prog"}), "--max_restart");
  EXPECT_EQ(RejectedFlag({"--grace_period=1e9", "prog"}), "--grace_period");
  EXPECT_EQ(RejectedFlag({"--rendezvous_timeout=inf", "prog"}), "--rendezvous_timeout");
  EXPECT_EQ(RejectedFlag({"--server_num=1024", "--worker_num=1024", "--heter_worker_num=1024", cfg}), "(accepted)");
  EXPECT_EQ(RejectedFlag({"--nproc_per_node=1024", "--max_restart=100", "--grace_period=86400", "prog"}), "(accepted)");
  auto huge = Resolve({"--server_num=100000", "--worker_num=1", cfg});
  EXPECT_NE(huge.status().message().find("1024"), std::string::npos) << huge.status().ToString();
}

TEST_F(PlanTest, ProcessesGetTheSameValuesAsFlagsAndEnvironment) {
  auto job = Resolve({"--server_num=2", "--worker_num=2", "--config=" + config_, "-o", "A.b=1", "-o", "C=x y"});
  ASSERT_TRUE(job.ok());
  job->kv_endpoint = "127.0.0.1:4000";
  ProcessSpec server = RenderProcess(*job, Role::kServer, 1);
  EXPECT_EQ(server.exe, dir_.string() + "/ps_server");
  EXPECT_EQ(server.log_path, "log/serverlog.1");
  EXPECT_FALSE(server.tee);
  EXPECT_EQ(EnvOf(server, "FLEET_ENDPOINT"), "127.0.0.1:0");
  EXPECT_EQ(EnvOf(server, "FLEET_OVERRIDES"), "A.b=1;C=x y");
  EXPECT_TRUE(HasArg(server, "--override=A.b=1;C=x y"));
  // Every FLEET_X is also --x=value (FLEET_OVERRIDES as --override).
  for (const auto& [k, v] : server.env) {
    // Environment only: the overrides (one --override flag instead) and the
    // restart generation (a restart changes no flag).
    if (k == "FLEET_OVERRIDES" || k == "FLEET_RESTART_GENERATION") continue;
    std::string flag = k.substr(6);
    std::transform(flag.begin(), flag.end(), flag.begin(), ::tolower);
    EXPECT_TRUE(HasArg(server, "--" + flag + "=" + v)) << k;
  }
  job->servers = {{"127.0.0.1", 5001}, {"127.0.0.1", 5002}};
  ProcessSpec worker = RenderProcess(*job, Role::kWorker, 0);
  EXPECT_TRUE(worker.tee);
  EXPECT_EQ(EnvOf(worker, "FLEET_SERVERS"), "127.0.0.1:5001,127.0.0.1:5002");
  EXPECT_EQ(EnvOf(worker, "FLEET_ENDPOINT"), "(absent)");
  EXPECT_EQ(EnvOf(worker, "FLEET_KV_ENDPOINT"), "127.0.0.1:4000");
  EXPECT_EQ(EnvOf(worker, "FLEET_WORLD_SIZE"), "2");
  // First start: generation 0, not a restart; the n-th restart: generation n.
  EXPECT_EQ(EnvOf(worker, "FLEET_RESTART_GENERATION"), "0");
  EXPECT_EQ(EnvOf(worker, "FLEET_RESTART"), "(absent)");
  ProcessSpec again = RenderProcess(*job, Role::kWorker, 0, 2);
  EXPECT_EQ(EnvOf(again, "FLEET_RESTART_GENERATION"), "2");
  EXPECT_EQ(EnvOf(again, "FLEET_RESTART"), "2");
}

TEST_F(PlanTest, APsJobsWorkersMayBeAProgramWithItsOwnFlags) {
  fs::remove(dir_ / "ps_worker");  // not needed when the workers run PROGRAM
  auto job = Resolve({"--server_num=2", "--worker_num=2", "--config=" + config_, "-o", "A.b=1",
                      "prog", "--epochs=2", "-o", "x"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->worker_program_path, dir_.string() + "/prog");
  ProcessSpec worker = RenderProcess(*job, Role::kWorker, 1);
  EXPECT_EQ(worker.exe, dir_.string() + "/prog");
  // Its flags are its own; the job's values come in the environment only.
  EXPECT_EQ(worker.argv, (std::vector<std::string>{"prog", "--epochs=2", "-o", "x"}));
  EXPECT_EQ(EnvOf(worker, "FLEET_ROLE"), "worker");
  EXPECT_EQ(EnvOf(worker, "FLEET_RANK"), "1");
  EXPECT_EQ(EnvOf(worker, "FLEET_CONFIG"), config_);
  EXPECT_EQ(EnvOf(worker, "FLEET_OVERRIDES"), "A.b=1");
  EXPECT_EQ(EnvOf(worker, "FLEET_SERVERS"), "127.0.0.1:0,127.0.0.1:0");
  EXPECT_EQ(worker.log_path, "log/workerlog.1");
  // The servers are ps_server as always.
  ProcessSpec server = RenderProcess(*job, Role::kServer, 0);
  EXPECT_EQ(server.exe, dir_.string() + "/ps_server");
  EXPECT_TRUE(HasArg(server, "--override=A.b=1"));
  // A server-only machine of a cluster does not look for PROGRAM.
  auto servers_only = Resolve(
      {"--servers=10.0.0.2:7000", "--workers=10.0.0.9", "--config=" + config_, "missing_program"});
  EXPECT_TRUE(servers_only.ok()) << servers_only.status().ToString();
}

TEST_F(PlanTest, AProgramsJobConfigNeedsOnlyTheServersSections) {
  std::ofstream(config_) << "tables:\n  - {id: 0, kind: sparse, dim: 4}\n";
  auto ps_worker = Resolve({"--server_num=1", "--worker_num=1", "--config=" + config_});
  ASSERT_TRUE(ps_worker.ok()) << ps_worker.status().ToString();
  Status st = CheckPsJobConfig(*ps_worker);
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("model"), std::string::npos) << st.ToString();  // ps_worker's section
  auto program = Resolve({"--server_num=1", "--worker_num=1", "--config=" + config_, "prog"});
  ASSERT_TRUE(program.ok()) << program.status().ToString();
  EXPECT_TRUE(CheckPsJobConfig(*program).ok()) << CheckPsJobConfig(*program).ToString();
  // The servers' sections are checked as always.
  program->overrides = {"tables.0.dimm=3"};
  st = CheckPsJobConfig(*program);
  EXPECT_NE(st.message().find("tables.0.dimm"), std::string::npos) << st.ToString();
}

TEST_F(PlanTest, CollectiveDevicesAndRanks) {
  machine_.gpu_count = 2;
  auto all = Resolve({"prog", "--lr=1"});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->collective.devices, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_EQ(all->collective.program_path, dir_.string() + "/prog");
  auto one = Resolve({"--gpus=1", "prog"});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->collective.devices, (std::vector<std::string>{"cuda:1"}));
  EXPECT_EQ(RejectedFlag({"--gpus=2", "prog"}), "--gpus");
  EXPECT_EQ(RejectedFlag({"--gpus=0,0", "prog"}), "--gpus");
  EXPECT_EQ(RejectedFlag({"--gpus=0,1", "--nproc_per_node=3", "prog"}), "--nproc_per_node");

  machine_.gpu_count = 0;
  auto cpu = Resolve({"--nproc_per_node=3", "--ips=10.0.0.1,10.0.0.2", "prog", "--lr=1"});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ(cpu->collective.devices, (std::vector<std::string>(3, "cpu")));
  EXPECT_EQ(cpu->collective.node_rank, 1);
  EXPECT_EQ(cpu->collective.nnodes, 2);
  EXPECT_FALSE(cpu->host_kv);
  EXPECT_EQ(cpu->kv_endpoint, "10.0.0.1:36001");
  cpu->collective.rank_offset = 3;
  cpu->collective.world_size = 6;
  ProcessSpec p = RenderProcess(*cpu, Role::kCollective, 2);
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.argv, (std::vector<std::string>{"prog", "--lr=1"}));  // PROGRAM keeps its own flags
  EXPECT_EQ(EnvOf(p, "FLEET_RANK"), "5");
  EXPECT_EQ(EnvOf(p, "FLEET_LOCAL_RANK"), "2");
  EXPECT_EQ(EnvOf(p, "FLEET_WORLD_SIZE"), "6");
  EXPECT_EQ(EnvOf(p, "FLEET_NODE_RANK"), "1");
  EXPECT_EQ(EnvOf(p, "FLEET_NNODES"), "2");
  EXPECT_EQ(EnvOf(p, "FLEET_NPROC_PER_NODE"), "3");
  EXPECT_EQ(EnvOf(p, "FLEET_DEVICE"), "cpu");
  EXPECT_EQ(EnvOf(p, "FLEET_HOST"), "10.0.0.2");  // this host's --ips entry, for Gloo
  EXPECT_EQ(EnvOf(RenderProcess(*all, Role::kCollective, 0), "FLEET_HOST"), "127.0.0.1");  // one host
  EXPECT_EQ(EnvOf(p, "NCCL_SOCKET_IFNAME"), "(absent)");  // a CPU rank
  EXPECT_EQ(p.log_path, "log/workerlog.5");
  EXPECT_FALSE(p.tee);
}

// torch.distributed.launch's / torchrun's command line, names with '-' or
// '_': one node serves the store on --master_port; node 0 of several is the
// master on --master_addr; another node joins it there.
TEST_F(PlanTest, TorchrunFlagsMeanFleetrunsOwn) {
  machine_.gpu_count = 0;
  auto one = Resolve({"--nproc-per-node", "2", "--nnodes", "1", "--node_rank", "0",
                      "--master_addr", "127.0.0.1", "--master_port", "29512", "prog", "--x"});
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->collective.devices, (std::vector<std::string>(2, "cpu")));
  EXPECT_TRUE(one->host_kv);
  EXPECT_EQ(one->kv_listen, "127.0.0.1:29512");
  EXPECT_EQ(one->collective.program_args, (std::vector<std::string>{"--x"}));
  auto master = Resolve({"--nproc_per_node=2", "--nnodes=2", "--node_rank=0",
                         "--master_addr=10.0.0.2", "prog"});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  EXPECT_TRUE(master->host_kv);
  EXPECT_EQ(master->kv_endpoint, "10.0.0.2:29500");  // torchrun's default port
  auto other = Resolve({"--nproc_per_node=2", "--nnodes=2", "--node_rank=1",
                        "--master_addr=10.0.0.1", "--master_port=6000", "prog"});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(other->host_kv);
  EXPECT_EQ(other->kv_endpoint, "10.0.0.1:6000");
  EXPECT_EQ(RejectedFlag({"--nnodes=2", "--node_rank=1", "prog"}), "--master_addr");
  EXPECT_EQ(RejectedFlag({"--master=10.0.0.1:5", "--master_port=6", "prog"}), "--master");
  EXPECT_EQ(RejectedFlag({"--master_port=70000", "prog"}), "--master_port");
  EXPECT_EQ(RejectedFlag({"--node_rank=-1", "prog"}), "--node_rank");
}

TEST_F(PlanTest, SlurmGivesNodeRankAndMaster) {
  machine_.slurm_procid = "1";
  machine_.slurm_nodeid = "1";
  machine_.slurm_nnodes = "2";
  machine_.slurm_nodelist = "gpu[07-08]";
  machine_.slurm_master_ip = "10.0.0.1";
  auto job = Resolve({"prog"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->collective.node_rank, 1);
  EXPECT_EQ(job->collective.nnodes, 2);
  EXPECT_EQ(job->collective.node_rank_source, NodeRankSource::kKnown);
  EXPECT_FALSE(job->host_kv);
  EXPECT_EQ(job->kv_endpoint, "10.0.0.1:36001");
}

// CUDA_VISIBLE_DEVICES on a machine without GPU: one line says the processes
// run on the CPU, and how to get more than one.
TEST_F(PlanTest, CudaVisibleDevicesWithoutGpuIsNoted) {
  machine_.gpu_count = 0;
  machine_.cuda_visible_devices = "0,1";
  auto job = Resolve({"prog"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->notes.size(), 1u);
  EXPECT_EQ(
      job->notes[0],
      "note: CUDA_VISIBLE_DEVICES=0,1 is set but this machine has no GPU (no /dev/nvidia<N>): 1 "
      "CPU process (--nproc_per_node=N for more)");
  machine_.cuda_visible_devices.reset();
  auto quiet = Resolve({"prog"});
  ASSERT_TRUE(quiet.ok());
  EXPECT_TRUE(quiet->notes.empty());
}

// fleetrun passes its environment through to every process, except the
// FLEET_* variables of the process contract, which it sets itself.
TEST(Plan, OnlyTheProcessContractsVariablesAreFleetruns) {
  for (const char* own :
       {"FLEET_RANK", "FLEET_KV_ENDPOINT", "FLEET_JOB_SECRET", "FLEET_OVERRIDES"}) {
    EXPECT_TRUE(IsProcessContractVariable(own)) << own;
  }
  for (const char* users : {"FLEET_GPT2_VOCAB_DIR", "FLEET_CTR_DATA", "OMP_NUM_THREADS", "PATH"}) {
    EXPECT_FALSE(IsProcessContractVariable(users)) << users;
  }
}

// A single-node Slurm job is on one machine: its store listens on loopback
// (and port 0 is allowed), as without Slurm.
TEST_F(PlanTest, SlurmSingleNodeBindsTheStoreToLoopback) {
  machine_.slurm_procid = "0";
  machine_.slurm_nodeid = "0";
  machine_.slurm_nnodes = "1";
  machine_.slurm_nodelist = "gpu07";
  machine_.slurm_master_ip = "10.0.0.1";
  auto job = Resolve({"--http_port=0", "prog"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_TRUE(job->host_kv);
  EXPECT_EQ(job->kv_listen, "127.0.0.1:0");
  EXPECT_EQ(job->kv_endpoint, "127.0.0.1:0");
}

TEST(Net, SlurmFirstHostAndGpuCount) {
  EXPECT_EQ(*FirstSlurmHost("gpu[03-05,9],cpu1"), "gpu03");
  EXPECT_EQ(*FirstSlurmHost("node7,node8"), "node7");
  EXPECT_FALSE(FirstSlurmHost("gpu[03").ok());
  char tmpl[] = "/tmp/gpu_count.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  for (const char* n : {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"}) std::ofstream(std::string(tmpl) + "/" + n);
  EXPECT_EQ(CountGpus(tmpl), 2);
  fs::remove_all(tmpl);
}

// torchrun's and Paddle's variables beside FLEET_*, once the launcher has
// the ports; FLAGS_selected_gpus is the id CUDA gives the rank's GPU.
// GPU ranks on several nodes: NCCL's bootstrap uses the interface of this
// node's address in the job, unless fleetrun was given NCCL_SOCKET_IFNAME.
TEST_F(PlanTest, NcclUsesTheInterfaceOfTheNodesAddress) {
  machine_.gpu_count = 1;
  machine_.interface_of = {{"127.0.0.1", "lo"}, {"10.0.0.2", "ens5"}};
  auto job = Resolve({"--ips=10.0.0.1,10.0.0.2", "prog"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  job->collective.world_size = 2;
  EXPECT_EQ(EnvOf(RenderProcess(*job, Role::kCollective, 0), "NCCL_SOCKET_IFNAME"), "=ens5");
  auto one = Resolve({"prog"});  // one node: NCCL finds its peers on loopback
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(EnvOf(RenderProcess(*one, Role::kCollective, 0), "NCCL_SOCKET_IFNAME"), "(absent)");
  machine_.nccl_socket_ifname = "ib0";  // given by the user: inherited as it is
  auto given = Resolve({"--ips=10.0.0.1,10.0.0.2", "prog"});
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(EnvOf(RenderProcess(*given, Role::kCollective, 0), "NCCL_SOCKET_IFNAME"), "(absent)");
}

TEST_F(PlanTest, CollectiveProcessesGetTorchrunAndPaddleNames) {
  machine_.gpu_count = 2;
  auto job = Resolve({"prog"});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->collective.node_host, "127.0.0.1");
  job->collective.trainer_endpoints = {"127.0.0.1:4001", "127.0.0.1:4002"};
  job->collective.master = "127.0.0.1:4000";
  ProcessSpec p = RenderProcess(*job, Role::kCollective, 1);
  EXPECT_EQ(EnvOf(p, "RANK"), "1");
  EXPECT_EQ(EnvOf(p, "WORLD_SIZE"), "2");
  EXPECT_EQ(EnvOf(p, "LOCAL_RANK"), "1");
  EXPECT_EQ(EnvOf(p, "LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(EnvOf(p, "MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(EnvOf(p, "MASTER_PORT"), "4000");
  EXPECT_EQ(EnvOf(p, "PADDLE_TRAINER_ID"), "1");
  EXPECT_EQ(EnvOf(p, "PADDLE_TRAINERS_NUM"), "2");
  EXPECT_EQ(EnvOf(p, "PADDLE_CURRENT_ENDPOINT"), "127.0.0.1:4002");
  EXPECT_EQ(EnvOf(p, "PADDLE_TRAINER_ENDPOINTS"), "127.0.0.1:4001,127.0.0.1:4002");
  EXPECT_EQ(EnvOf(p, "FLAGS_selected_gpus"), "1");
  const std::string table = FormatDistributedEnvs(p.env);
  EXPECT_NE(table.find("| PADDLE_TRAINER_ENDPOINTS | 127.0.0.1:4001,127.0.0.1:4002"),
            std::string::npos)
      << table;
}

TEST(CompatEnv, NodeInfoRoundTripsAndRejectsGarbage) {
  const NodeInfo info{2, {"10.0.0.2:5001", "10.0.0.2:5002"}, ""};
  Result<NodeInfo> back = ParseNodeInfo(FormatNodeInfo(info));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->nproc, 2);
  EXPECT_EQ(back->endpoints, info.endpoints);
  EXPECT_FALSE(ParseNodeInfo("2|10.0.0.2:5001|").ok());
  EXPECT_FALSE(ParseNodeInfo("x||").ok());
  EXPECT_FALSE(ParseNodeInfo("3").ok());
}

// CUDA_VISIBLE_DEVICES decides how many GPUs fleetrun deals out by default.
TEST(CompatEnv, VisibleGpuCountFollowsCudaVisibleDevices) {
  EXPECT_EQ(VisibleGpuCount(std::nullopt, 8), 8);
  EXPECT_EQ(VisibleGpuCount(std::string("2,3"), 8), 2);
  EXPECT_EQ(VisibleGpuCount(std::string(""), 8), 0);
  EXPECT_EQ(VisibleGpuCount(std::string("1,9,2"), 8), 1);  // CUDA stops at the first invalid id
  EXPECT_EQ(VisibleGpuCount(std::string("GPU-1a2b,GPU-3c4d"), 8), 2);
  EXPECT_EQ(VisibleGpuCount(std::string("0,1"), 0), 0);
}

TEST(CompatEnv, FreeTcpPortsAreDistinct) {
  Result<std::vector<int>> ports = FreeTcpPorts("127.0.0.1", 4);
  ASSERT_TRUE(ports.ok()) << ports.status().ToString();
  std::vector<int> sorted = *ports;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
  for (int p : *ports) EXPECT_GT(p, 0);
  EXPECT_FALSE(FreeTcpPorts("10.255.255.254", 1).ok());  // not an address of this machine
}

TEST(Readme, DocumentsEveryFlag) {
  const char* src = std::getenv("FLEET_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  std::ifstream in(std::string(src) + "/README.md");
  std::stringstream s;
  s << in.rdbuf();
  for (const std::string& name : OptionNames()) {
    const std::string flag = name == "o" ? "`-o`" : "`--" + name + "`";
    EXPECT_NE(s.str().find(flag), std::string::npos) << flag << " missing from the flag table in README.md";
  }
}

}  // namespace
}  // namespace fleet::launch
