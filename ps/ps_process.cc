#include "ps/ps_process.h"

#include <malloc.h>

namespace fleet::ps {

Result<PsProcess> StartPsProcess(ProcessContextOptions options) {
  // Keep up to 64 MiB of freed memory at the top of each malloc arena
  // instead of handing it back to the system at once. Every step allocates
  // and frees messages and pull/push buffers of MiBs; on the VMs this runs
  // on, a page touched again after going back to the system costs tens of
  // microseconds, and the README's 2 x 4 simulation trains 1.3x faster with
  // the pad (bench/README.md). Process-wide; here, before any thread.
  mallopt(M_TOP_PAD, 64 << 20);
  PsProcess p;
  FLEET_ASSIGN_OR_RETURN(p.context, ProcessContext::Create(std::move(options)));
  FLEET_ASSIGN_OR_RETURN(p.job, JobConfigFromFlagsAndEnv(p.context->env()));
  FLEET_ASSIGN_OR_RETURN(p.transport_auth, p.context->TransportAuthFor(p.job.distributed.auth));
  return p;
}

}  // namespace fleet::ps
