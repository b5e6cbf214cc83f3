#include "ps/ps_process.h"

namespace fleet::ps {

Result<PsProcess> StartPsProcess(ProcessContextOptions options) {
  KeepFreedHeapPerArena();  // process-wide; here, before any thread
  PsProcess p;
  FLEET_ASSIGN_OR_RETURN(p.context, ProcessContext::Create(std::move(options)));
  FLEET_ASSIGN_OR_RETURN(p.job, JobConfigFromFlagsAndEnv(p.context->env()));
  FLEET_ASSIGN_OR_RETURN(p.transport_auth, p.context->TransportAuthFor(p.job.distributed.auth));
  return p;
}

}  // namespace fleet::ps
