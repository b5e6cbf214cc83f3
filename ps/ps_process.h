// PsProcess: what a parameter-server-mode program (ps_server, ps_worker,
// heter_worker) knows before it starts: its process context
// (comm/process_context.h), the job config (--config / FLEET_CONFIG with
// --override / FLEET_OVERRIDES) and the credentials of its ZeroMQ traffic,
// which the job config's Distributed.auth can turn off.
//
// Thread safety: StartPsProcess as ProcessContext::Create (before threads);
// the result is a plain value.
#pragma once

#include <malloc.h>

#include <memory>

#include "comm/job_auth.h"
#include "comm/process_context.h"
#include "comm/status.h"
#include "ps/job_config.h"

namespace fleet::ps {

struct PsProcess {
  std::unique_ptr<ProcessContext> context;  // never null
  JobConfig job;
  // TransportAuth(spec, job.distributed.auth): null for plain TCP.
  std::shared_ptr<const JobAuth> transport_auth;
};

// ProcessContext::Create(options), then the job config and the transport
// credentials; also sets the process's malloc to keep 64 MiB of freed heap
// per arena (M_TOP_PAD), so that the MiB-sized buffers of every step reuse
// mapped pages. Errors: those of ProcessContext::Create, of
// JobConfigFromFlagsAndEnv, and InvalidArgument from TransportAuth (auth on
// but no job secret).
Result<PsProcess> StartPsProcess(ProcessContextOptions options);

// The malloc setting StartPsProcess makes, for programs that run PS servers
// or clients without it (ps_bench): keep up to 64 MiB of freed memory at the
// top of each malloc arena instead of handing it back to the system at once.
// Every step allocates and frees messages and pull/push buffers of MiBs; on
// the VMs this runs on, a page touched again after going back to the system
// costs tens of microseconds, and the README's 2 x 4 simulation trains 1.3x
// faster with the pad (bench/README.md). Process-wide: call before threads
// start. The PS programs link tcmalloc (fleet_ps_allocator), whose mallopt
// ignores this and which keeps freed pages by itself; the call is for
// builds without it (-DFLEET_TCMALLOC=OFF).
inline void KeepFreedHeapPerArena() { mallopt(M_TOP_PAD, 64 << 20); }

}  // namespace fleet::ps
