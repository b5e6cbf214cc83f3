// CUDA kernels on the CPU; see cuda_emulation.h.
#include "trainer/kernels/cuda_emulation.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <glog/logging.h>
#include <ucontext.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace fleet::cuda_emulation {
namespace {

constexpr unsigned kWarp = 32;
// Kernels keep their fragments in registers, here on the fiber's stack.
constexpr size_t kStackBytes = 256 << 10;

enum class State { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  uint3 index;
  unsigned linear = 0;
  State state = State::kRunnable;
  unsigned collectives = 0;  // shuffles and mmas so far: picks the exchange bank
};

// What the lanes of a warp hand each other at a warp barrier. Two banks,
// used by turns: a lane writes bank p of its next collective only after the
// barrier of the one before, which every lane passed after reading bank p.
// So one barrier per collective.
struct WarpBank {
  uint64_t bits[kWarp];
  uint32_t a[kWarp][4];
  uint32_t b[kWarp][2];
  float c[kWarp][4];
};
struct WarpExchange {
  WarpBank bank[2];
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<WarpExchange> warps;
  std::vector<unsigned char> shared_storage;
  unsigned char* shared = nullptr;  // 128-byte aligned, as __shared__ on a GPU
  size_t shared_bytes = 0;
  ucontext_t scheduler;
  const std::function<void()>* kernel = nullptr;
  size_t current = 0;
};

Block* running = nullptr;

Fiber& Current() {
  CHECK(running != nullptr) << "a CUDA intrinsic called outside an emulated kernel";
  return running->fibers[running->current];
}

void Wait(State at) {
  Fiber& f = Current();
  f.state = at;
  swapcontext(&f.context, &running->scheduler);
}

void FiberMain() {
  (*running->kernel)();
  Current().state = State::kDone;
  // Returning resumes uc_link, the scheduler.
}

const char* Name(State s) {
  switch (s) {
    case State::kRunnable:
      return "running";
    case State::kAtBlockBarrier:
      return "at __syncthreads";
    case State::kAtWarpBarrier:
      return "at a warp barrier (shuffle, __syncwarp or mma)";
    case State::kDone:
      return "returned";
  }
  return "?";
}

// Opens the barriers whose threads have all arrived. Returns false when
// none can open: the threads wait for each other in different places.
bool OpenBarriers(Block& block, std::string* why) {
  bool opened = false;
  const size_t n = block.fibers.size();
  for (size_t w = 0; w * kWarp < n; ++w) {
    const size_t end = std::min(n, (w + 1) * kWarp);
    size_t at_warp = 0;
    for (size_t i = w * kWarp; i < end; ++i)
      at_warp += block.fibers[i].state == State::kAtWarpBarrier;
    if (at_warp == 0) continue;
    if (at_warp == end - w * kWarp) {
      for (size_t i = w * kWarp; i < end; ++i) block.fibers[i].state = State::kRunnable;
      opened = true;
    }
  }
  if (opened) return true;
  size_t at_block = 0, done = 0;
  for (const Fiber& f : block.fibers) {
    at_block += f.state == State::kAtBlockBarrier;
    done += f.state == State::kDone;
  }
  if (at_block > 0 && at_block + done == n) {
    for (Fiber& f : block.fibers) {
      if (f.state == State::kAtBlockBarrier) f.state = State::kRunnable;
    }
    return true;
  }
  // Name the first thread of each distinct state, enough to find the bug.
  std::string states;
  State last = State::kRunnable;
  for (const Fiber& f : block.fibers) {
    if (!states.empty() && f.state == last) continue;
    absl::StrAppend(&states, states.empty() ? "" : "; ", "thread ", f.linear, ": ", Name(f.state));
    last = f.state;
  }
  *why = absl::StrCat("block (", blockIdx.x, ",", blockIdx.y, ",", blockIdx.z,
                      "): threads wait at different barriers: ", states);
  return false;
}

std::string RunBlock(Block& block, bool reverse_first) {
  for (size_t i = 0; i < block.fibers.size(); ++i) {
    Fiber& f = block.fibers[i];
    f.state = State::kRunnable;
    f.collectives = 0;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &block.scheduler;
    makecontext(&f.context, FiberMain, 0);
  }
  // Passes alternate in direction (and blocks in the direction they start
  // with), so a thread that reads shared memory another writes without a
  // barrier between them runs before the writer in some pass, and sees the
  // fill pattern or an old value instead.
  for (bool reverse = reverse_first;; reverse = !reverse) {
    const size_t n = block.fibers.size();
    for (size_t step = 0; step < n; ++step) {
      const size_t i = reverse ? n - 1 - step : step;
      Fiber& f = block.fibers[i];
      if (f.state != State::kRunnable) continue;
      block.current = i;
      threadIdx = f.index;
      swapcontext(&block.scheduler, &f.context);
    }
    bool all_done = true;
    for (const Fiber& f : block.fibers) all_done &= f.state == State::kDone;
    if (all_done) return "";
    std::string why;
    if (!OpenBarriers(block, &why)) return why;
  }
}

// A bf16 or fp16 element of a packed register: the low half is element 0.
float Half(uint32_t reg, int which, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(which == 0 ? reg & 0xffffu : reg >> 16);
  if (bf16) {
    const uint32_t widened = uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &widened, sizeof(f));
    return f;
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

}  // namespace

std::string Launch(dim3 grid, dim3 block_dim, size_t shared_bytes,
                   const std::function<void()>& kernel) {
  CHECK(running == nullptr) << "emulated kernels do not nest";
  const size_t threads = size_t{block_dim.x} * block_dim.y * block_dim.z;
  if (threads == 0 || threads > 1024) return absl::StrCat("block of ", threads, " threads");
  Block block;
  block.kernel = &kernel;
  block.fibers.resize(threads);
  block.warps.resize((threads + kWarp - 1) / kWarp);
  block.shared_storage.resize(shared_bytes + 128);
  block.shared = block.shared_storage.data() +
                 (128 - reinterpret_cast<uintptr_t>(block.shared_storage.data()) % 128) % 128;
  block.shared_bytes = shared_bytes;
  for (unsigned z = 0, i = 0; z < block_dim.z; ++z) {
    for (unsigned y = 0; y < block_dim.y; ++y) {
      for (unsigned x = 0; x < block_dim.x; ++x, ++i) {
        block.fibers[i].index = uint3{x, y, z};
        block.fibers[i].linear = i;
        block.fibers[i].stack = std::make_unique_for_overwrite<char[]>(kStackBytes);
      }
    }
  }
  blockDim = block_dim;
  gridDim = grid;
  running = &block;
  std::string error;
  size_t blocks_run = 0;
  for (unsigned z = 0; z < grid.z && error.empty(); ++z) {
    for (unsigned y = 0; y < grid.y && error.empty(); ++y) {
      for (unsigned x = 0; x < grid.x && error.empty(); ++x) {
        blockIdx = uint3{x, y, z};
        std::memset(block.shared, 0xA5, block.shared_bytes);
        error = RunBlock(block, blocks_run++ % 2 == 1);
      }
    }
  }
  // After an error the fibers' stacks are dropped without unwinding: kernels
  // hold no owning objects.
  running = nullptr;
  return error;
}

void* DynamicShared() {
  CHECK(running != nullptr) << "shared memory outside an emulated kernel";
  return running->shared;
}

void SyncThreads() { Wait(State::kAtBlockBarrier); }

void SyncWarp() { Wait(State::kAtWarpBarrier); }

unsigned LaneId() { return Current().linear % kWarp; }

namespace {
WarpBank& NextBank() {
  Fiber& f = Current();
  return running->warps[f.linear / kWarp].bank[f.collectives++ % 2];
}
}  // namespace

uint64_t ShuffleBits(uint64_t bits, unsigned lane) {
  WarpBank& x = NextBank();
  x.bits[LaneId()] = bits;
  SyncWarp();
  return x.bits[lane % kWarp];
}

void Mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], bool bf16) {
  WarpBank& x = NextBank();
  const unsigned me = LaneId();
  std::memcpy(x.a[me], a, sizeof(x.a[me]));
  std::memcpy(x.b[me], b, sizeof(x.b[me]));
  std::memcpy(x.c[me], c, sizeof(x.c[me]));
  SyncWarp();
  // A[row][k] is in lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) +
  // 2 (k >= 8), half k % 2; B[k][col] in lane col * 4 + (k % 8) / 2,
  // register (k >= 8), half k % 2.
  auto A = [&](unsigned row, unsigned k) {
    return Half(x.a[(row % 8) * 4 + (k % 8) / 2][(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2,
                bf16);
  };
  auto B = [&](unsigned k, unsigned col) {
    return Half(x.b[col * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k % 2, bf16);
  };
  const unsigned g = me / 4, t = me % 4;
  float out[4];
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + i % 2;
    float sum = x.c[me][i];
    for (unsigned k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    out[i] = sum;
  }
  std::memcpy(d, out, sizeof(out));
}

void LdMatrixX4Trans(uint32_t r[4], const void* row) {
  WarpBank& x = NextBank();
  const unsigned me = LaneId();
  const auto address = reinterpret_cast<uintptr_t>(row);
  CHECK_EQ(address % 16, 0u) << "ldmatrix: lane " << me
                              << " passed a row that is not 16-byte aligned";
  x.bits[me] = address;
  SyncWarp();
  const unsigned g = me / 4, t = me % 4;
  auto element = [&](unsigned lane) {  // element g of the row lane `lane` passed
    uint16_t e;
    std::memcpy(&e, reinterpret_cast<const char*>(x.bits[lane]) + 2 * g, sizeof(e));
    return uint32_t{e};
  };
  for (unsigned i = 0; i < 4; ++i) r[i] = element(8 * i + 2 * t) | element(8 * i + 2 * t + 1) << 16;
}

}  // namespace fleet::cuda_emulation

namespace fleet::cuda_emulation_support {

cudaError_t Launched(const std::string& error) {
  if (error.empty()) return cudaSuccess;
  LOG(ERROR) << "emulated kernel: " << error;
  return cudaErrorLaunchFailure;
}

}  // namespace fleet::cuda_emulation_support
