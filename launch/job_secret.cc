#include "launch/job_secret.h"

#include <algorithm>

#include "launch/net.h"

namespace fleet::launch {
namespace {

// Whether every process of the job runs on this machine, so a secret made
// here reaches them all through the environment.
bool WholeJobHere(const JobLayout& job) {
  switch (job.mode) {
    case Mode::kPsSimulation: return true;
    case Mode::kCollective: return job.collective.nnodes == 1;
    case Mode::kStoreOnly: return false;  // its processes are started by hand: they need the secret
    case Mode::kPsCluster: break;
  }
  for (const auto* list : {&job.servers, &job.heter_workers, &job.workers}) {
    if (!std::all_of(list->begin(), list->end(), [](const Endpoint& e) { return IsLoopback(e.host); })) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string_view SecretSourceName(SecretSource source) {
  switch (source) {
    case SecretSource::kNone: return "auth off";
    case SecretSource::kFile: return "job secret from --job_secret_file";
    case SecretSource::kEnvironment: return "job secret from FLEET_JOB_SECRET";
    case SecretSource::kGenerated: return "fresh job secret made for this run";
  }
  return "unknown";
}

Result<SecretSource> LoadJobSecret(const LaunchOptions& options, const EnvLookup& env, JobLayout& job) {
  if (!job.auth) return SecretSource::kNone;
  SecretSource source;
  if (options.Given("job_secret_file")) {
    // Read once here and handed on as FLEET_JOB_SECRET: the KV store this
    // fleetrun hosts needs the keys too.
    auto text = JobAuth::ReadSecretFile(options.job_secret_file);
    if (!text.ok()) return Status::InvalidArgument("--job_secret_file", text.status().message());
    job.job_secret = std::move(text).value();
    source = SecretSource::kFile;
  } else if (std::optional<std::string> secret = env("FLEET_JOB_SECRET")) {
    job.job_secret = *secret;
    source = SecretSource::kEnvironment;
  } else if (WholeJobHere(job)) {
    FLEET_ASSIGN_OR_RETURN(job.job_secret, JobAuth::RandomSecret());
    source = SecretSource::kGenerated;
  } else {
    return Status::InvalidArgument(
        "--job_secret_file",
        "missing: a job on several machines needs the same secret on each; give every machine a "
        "file made once with `openssl rand -hex 32 > F && chmod 600 F` (or set FLEET_JOB_SECRET), "
        "or pass --auth=off on a trusted network");
  }
  auto auth = JobAuth::FromSecret(job.job_secret, SecretSourceName(source));
  if (!auth.ok()) return Status::InvalidArgument("--job_secret_file", auth.status().message());
  job.credentials = std::move(auth).value();
  return source;
}

Result<std::string> LoadMetricsToken(const LaunchOptions& options) {
  if (!options.Given("metrics_token_file")) return std::string();
  Result<std::string> text = JobAuth::ReadSecretFile(options.metrics_token_file);
  if (!text.ok()) return Status::InvalidArgument("--metrics_token_file", text.status().message());
  constexpr std::string_view kSpace = " \t\r\n";
  const size_t first = text->find_first_not_of(kSpace);
  const std::string token = first == std::string::npos
                                ? ""
                                : text->substr(first, text->find_last_not_of(kSpace) - first + 1);
  const bool printable =
      std::all_of(token.begin(), token.end(), [](char c) { return c > ' ' && c <= '~'; });
  if (token.size() < 16 || token.size() > 256 || !printable) {
    return Status::InvalidArgument("--metrics_token_file",
                                   "the token in '" + options.metrics_token_file +
                                       "' must be 16 to 256 printable characters without spaces "
                                       "(e.g. `openssl rand -hex 16`)");
  }
  return token;
}

}  // namespace fleet::launch
