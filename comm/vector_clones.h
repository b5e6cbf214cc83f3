// FLEET_VECTOR_CLONES: compile an element-wise loop for AVX-512, AVX2 (each
// with FMA) and baseline x86-64, the best one picked at load time (GCC
// target_clones). GCC 12 dispatches "arch=x86-64-vN" clones on the CPU's ISA
// level, not on its model name (this AMD EPYC runs the v4 clones). Put it on
// a function whose loop -O3 vectorises, with __restrict pointers.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLEET_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FLEET_VECTOR_CLONES
#endif
