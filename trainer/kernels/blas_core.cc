// OpenBLAS chooses its kernels when it loads, from the CPU's model number
// or from OPENBLAS_CORETYPE. A CPU newer than the library gets its generic
// kernels: Debian 12's 0.3.21 does not know Emerald Rapids (family 6,
// model 0xCF) and runs SSE3 ("Prescott") GEMMs there, which made the CTR
// worker's step 3.8x slower than with its AVX-512 ("SkylakeX") kernels on
// the same machine (train_bench ctr_ps, compute only: 11.4k against 43.1k
// samples/s). Whether that variable is set differs between machines, so
// every program that links the CPU kernels checks, before main runs: when
// the user did not choose, OpenBLAS fell back to a pre-AVX2 core and the CPU
// runs AVX-512 (or AVX2 and FMA), the program starts itself again (exec:
// the same process id, arguments and environment) with OPENBLAS_CORETYPE
// naming those kernels. A library in a host process (the Python module)
// never restarts its host: only a main program does.
//
// This file is linked into every target that links fleet_trainer (an
// INTERFACE source: a constructor alone in a static library would never be
// pulled in).
#include <cblas.h>
#include <link.h>
#include <strings.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "trainer/kernels/cpu_kernels.h"

namespace fleet {
namespace trainer::kernels {

const char* BlasKernelsForThisCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace trainer::kernels

namespace {

// The names OpenBLAS gives its cores from before AVX2.
constexpr const char* kOldCores[] = {"Unknown",  "Katmai",  "Coppermine", "Northwood", "Prescott",
                                     "Banias",   "Atom",    "Core2",      "Penryn",    "Dunnington",
                                     "Nehalem",  "Athlon",  "Opteron",    "Opteron_SSE3",
                                     "Barcelona", "Nano",   "Sandybridge", "Bobcat"};

bool OldCore(const char* name) {
  if (name == nullptr) return true;
  for (const char* old : kOldCores) {
    if (strcasecmp(name, old) == 0) return true;
  }
  return false;
}

// Whether `address` is in the main program (dl_iterate_phdr reports it
// first), not in a shared library loaded into someone else's process.
bool InMainProgram(const void* address) {
  struct Probe {
    uintptr_t address;
    bool inside = false;
  } probe{reinterpret_cast<uintptr_t>(address)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* p = static_cast<Probe*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
          if (p->address >= begin && p->address < begin + ph.p_memsz) p->inside = true;
        }
        return 1;  // the main program only
      },
      &probe);
  return probe.inside;
}

// glibc passes a constructor the program's arguments and environment.
__attribute__((constructor)) void RestartWithBetterBlas(int argc, char** argv, char** envp) {
  if (argc < 1 || argv == nullptr || std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* better = trainer::kernels::BlasKernelsForThisCpu();
  if (better == nullptr || !OldCore(openblas_get_corename())) return;
  if (!InMainProgram(reinterpret_cast<const void*>(&RestartWithBetterBlas))) return;
  if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Not restarted (no /proc?): run on with the kernels OpenBLAS chose, and
  // leave the environment as the user gave it to the programs we start.
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace
}  // namespace fleet
