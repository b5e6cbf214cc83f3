#include "launch/config_check.h"

#include <string>
#include <utility>

#include "comm/file_system.h"
#include "ps/job_config.h"
#include "worker/config.h"

namespace fleet::launch {

namespace {

// The config as the job's processes read it: ps_worker reads the workers'
// sections too; a PROGRAM run as the workers reads its own settings, so only
// the servers' part is fleetrun's to check.
Result<worker::PsJobConfig> LoadForProcesses(const JobLayout& job) {
  if (job.worker_program.empty()) return worker::LoadPsJobConfig(job.config, job.overrides);
  worker::PsJobConfig config;
  FLEET_ASSIGN_OR_RETURN(config.job, ps::LoadJobConfig(job.config, job.overrides));
  return config;
}

}  // namespace

Status CheckPsJobConfig(const JobLayout& job) {
  FLEET_ASSIGN_OR_RETURN(worker::PsJobConfig config, LoadForProcesses(job));
  // On a cluster these paths are another machine's; its processes check them.
  if (job.mode != Mode::kPsSimulation) return Status::OK();
  const std::pair<const char*, const std::string*> dirs[] = {
      {"server.save_dir", &config.job.server.save_dir},
      {"server.recovery_dir", &config.job.server.recovery_dir},
      {"train.save_dir", &config.worker.train.save_dir}};
  for (const auto& [key, dir] : dirs) {
    if (!dir->empty()) FLEET_RETURN_IF_ERROR(CheckWritableDir(DefaultFileSystem(), *dir).WithContext(key));
  }
  return Status::OK();
}

Result<std::string> DefaultRecoveryDir(JobLayout* job, int max_restart) {
  if (max_restart == 0) return std::string();
  FLEET_ASSIGN_OR_RETURN(worker::PsJobConfig config, LoadForProcesses(*job));
  if (!config.job.server.recovery_dir.empty()) return std::string();
  const std::string dir = job->log_dir + "/recovery";
  job->overrides.push_back("server.recovery_dir=" + dir);
  return dir;
}

}  // namespace fleet::launch
