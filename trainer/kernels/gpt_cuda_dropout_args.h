// GptKernels' DropoutSpec as the CUDA launchers take it (gpt_cuda_ops.h's
// DropoutArgs, kept free of the C++20 interface headers): for
// CudaGptKernels and the tests that call the launchers on the CPU
// emulation.
#pragma once

#include "trainer/kernels/gpt_cuda_ops.h"
#include "trainer/kernels/gpt_kernels.h"

namespace fleet::trainer::cuda::gpt {

inline DropoutArgs DropoutArgsOf(const DropoutSpec& d) {
  DropoutArgs a;
  a.p = d.p;
  a.seed = d.seed;
  a.site = d.site;
  a.streams = d.streams;
  a.head_offset = d.head_offset;
  return a;
}

}  // namespace fleet::trainer::cuda::gpt
