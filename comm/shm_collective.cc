#include "comm/shm_collective.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x464c454554534d31;  // "FLEETSM1"
constexpr int kMaxRanks = 256;
constexpr size_t kPage = 4096;
// Pieces of a chunk start on cache lines, so two ranks never write one line.
constexpr size_t kLineFloats = 64 / sizeof(float);
// How often a sleeping barrier checks that the ranks it waits for are alive.
constexpr std::chrono::milliseconds kLivenessPeriod{50};

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Shared (not FUTEX_PRIVATE): the word lives in a mapping other processes share.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

std::string RankText(const ShmCollectiveOptions& o) {
  return absl::StrCat("rank ", o.rank, " of ", o.size, " (group ", o.group, ", generation ",
                      o.generation, ")");
}

// [lo, hi) of rank r's share of n floats split over `ranks`.
std::pair<size_t, size_t> Piece(size_t n, int ranks, int r) {
  const size_t per = (n + ranks - 1) / ranks;
  const size_t piece = (per + kLineFloats - 1) / kLineFloats * kLineFloats;
  const size_t lo = std::min(n, piece * r);
  return {lo, std::min(n, lo + piece)};
}

}  // namespace

struct ShmCollective::Header {
  struct alignas(64) RankState {
    std::atomic<uint64_t> arrived{0};  // barriers this rank has arrived at
    std::atomic<int32_t> pid{0};       // 0 until the rank has mapped the segment
  };

  uint64_t magic = kMagic;
  int32_t size = 0;
  uint64_t slot_bytes = 0;
  alignas(64) std::atomic<uint32_t> wake{0};  // futex word: bumped when a rank arrives
  std::atomic<uint32_t> sleepers{0};          // ranks asleep on `wake`
  std::atomic<int32_t> mapped{0};             // ranks that mapped the segment
  RankState ranks[kMaxRanks];
};

size_t ShmCollective::HeaderBytes() { return (sizeof(Header) + kPage - 1) / kPage * kPage; }

Result<std::unique_ptr<ShmCollective>> ShmCollective::Create(KvStoreClient& kv,
                                                             const ShmCollectiveOptions& options) {
  if (options.size < 1 || options.size > kMaxRanks || options.rank < 0 ||
      options.rank >= options.size) {
    return Status::InvalidArgument(
        absl::StrCat("shm collective: need 0 <= rank < size <= ", kMaxRanks),
        absl::StrCat("rank ", options.rank, ", size ", options.size));
  }
  if (options.timeout.count() <= 0 || options.spin.count() < 0) {
    return Status::InvalidArgument(
        "shm collective: timeout must be positive and spin >= 0",
        absl::StrCat(options.timeout.count(), " ms, spin ", options.spin.count(), " us"));
  }
  if (options.group.empty() || options.generation < 0) {
    return Status::InvalidArgument("shm collective: need a group name and a generation >= 0",
                                   absl::StrCat("'", options.group, "', ", options.generation));
  }
  if (options.slot_bytes < 4096 || options.slot_bytes % 64 != 0 ||
      options.slot_bytes > (size_t{1} << 30)) {
    return Status::InvalidArgument(
        "shm collective: slot_bytes must be a multiple of 64 in [4 KiB, 1 GiB]",
        absl::StrCat(options.slot_bytes));
  }
  const size_t bytes = HeaderBytes() + (options.size + 1) * options.slot_bytes;
  const std::string key = absl::StrCat("shm/", options.group, "/gen", options.generation, "/name");

  std::string name;
  int fd = -1;
  if (options.rank == 0) {
    char random[16];
    if (getrandom(random, sizeof(random), 0) != sizeof(random)) {
      return Status::IOError("shm collective: getrandom failed", strerror(errno));
    }
    // The creator's pid in the name tells whose a leftover segment was.
    name = absl::StrCat("/fleet-", getpid(), "-",
                        absl::BytesToHexString(absl::string_view(random, sizeof(random))));
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return Status::IOError("shm collective: shm_open " + name, strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      close(fd);
      shm_unlink(name.c_str());
      return Status::IOError(absl::StrCat("shm collective: cannot size ", name, " to ", bytes,
                                          " bytes (is /dev/shm full?)"),
                             strerror(err));
    }
  } else {
    Result<std::string> published = kv.WaitGet(key, options.timeout);
    if (!published.ok()) {
      return published.status().WithContext(absl::StrCat("shm rendezvous of ", RankText(options),
                                                         ": rank 0 never published the "
                                                         "segment's name within ",
                                                         options.timeout.count(), " ms"));
    }
    name = *published;
    fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      return Status::Unavailable(
          absl::StrCat("shm collective: cannot open rank 0's segment ", name,
                       "; a shared-memory group needs every rank on one host (use Gloo across "
                       "hosts)"),
          strerror(errno));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      close(fd);
      return Status::InvalidArgument(
          "shm collective: rank 0's segment has another size: the ranks disagree on size or "
          "slot_bytes",
          absl::StrCat(st.st_size, " bytes, expected ", bytes));
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_errno = errno;
  close(fd);
  if (base == MAP_FAILED) {
    if (options.rank == 0) shm_unlink(name.c_str());
    return Status::IOError("shm collective: mmap of " + name, strerror(mmap_errno));
  }
  auto* header = static_cast<Header*>(base);
  if (options.rank == 0) {
    new (header) Header();
    header->size = options.size;
    header->slot_bytes = options.slot_bytes;
  } else if (header->magic != kMagic || header->size != options.size ||
             header->slot_bytes != options.slot_bytes) {
    munmap(base, bytes);
    return Status::InvalidArgument(
        "shm collective: segment " + name + " is not this group's",
        absl::StrCat("size ", header->size, ", slot_bytes ", header->slot_bytes));
  }
  header->ranks[options.rank].pid.store(getpid());
  // The last rank to map the segment removes its name: nobody needs it any
  // more, and a rank killed from here on leaks nothing.
  if (header->mapped.fetch_add(1) + 1 == options.size) shm_unlink(name.c_str());
  std::unique_ptr<ShmCollective> group(new ShmCollective(options, base, bytes));
  if (options.rank == 0) {
    if (Status st = kv.Set(key, name); !st.ok()) {
      shm_unlink(name.c_str());
      return st.WithContext("shm collective: publishing the segment's name");
    }
  }
  Status met = group->Meet("rendezvous");
  // The group failed before every rank mapped it (the last one would have
  // removed the name): rank 0 removes it.
  if (options.rank == 0 && !met.ok()) shm_unlink(name.c_str());
  if (!met.ok()) return met;
  return group;
}

int RemoveShmSegmentsOf(int creator) {
  // shm_open names live in /dev/shm on Linux.
  const std::string prefix = absl::StrCat("fleet-", creator, "-");
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::vector<std::string> names;
  while (const dirent* e = readdir(dir)) {
    if (std::string_view(e->d_name).starts_with(prefix)) names.push_back(e->d_name);
  }
  closedir(dir);
  int removed = 0;
  for (const std::string& n : names) removed += shm_unlink(("/" + n).c_str()) == 0;
  return removed;
}

int RemoveOrphanedShmSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::vector<std::string> orphans;
  while (const dirent* e = readdir(dir)) {
    const std::string_view name = e->d_name;
    if (!name.starts_with("fleet-")) continue;
    const std::string_view rest = name.substr(6);
    int creator = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), creator);
    if (ec != std::errc() || end == rest.data() || *end != '-' || creator <= 0) continue;
    struct stat st;
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != geteuid()) {
      continue;
    }
    // Alive (or another user's pid we may not signal): not ours to judge.
    if (kill(creator, 0) == 0 || errno != ESRCH) continue;
    orphans.emplace_back(name);
  }
  closedir(dir);
  int removed = 0;
  for (const std::string& n : orphans) removed += shm_unlink(("/" + n).c_str()) == 0;
  return removed;
}

ShmCollective::ShmCollective(ShmCollectiveOptions options, void* base, size_t bytes)
    : options_(std::move(options)),
      base_(base),
      bytes_(bytes),
      header_(static_cast<Header*>(base)),
      slot_floats_(options_.slot_bytes / sizeof(float)),
      inputs_(options_.size) {}

ShmCollective::~ShmCollective() { munmap(base_, bytes_); }

float* ShmCollective::slot(int rank) const {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + HeaderBytes() +
                                  rank * options_.slot_bytes);
}

float* ShmCollective::result() const { return slot(options_.size); }

Status ShmCollective::Usable(const char* op) const {
  if (broken_.ok()) return broken_;
  return Status::FailedPrecondition(
      absl::StrCat("shm ", op, ": group unusable after an earlier failure"), broken_.ToString());
}

Status ShmCollective::Meet(const char* op) {
  const uint64_t target = ++round_;
  const int n = options_.size;
  Header& h = *header_;
  // seq_cst on arrival, sleepers and wake: a rank going to sleep either sees
  // this arrival or is seen as a sleeper and woken.
  h.ranks[options_.rank].arrived.store(target);
  if (h.sleepers.load() > 0) {
    h.wake.fetch_add(1);
    FutexWakeAll(&h.wake);
  }
  // Acquire: what a rank wrote before arriving is visible after. Before
  // sleeping the check is seq_cst, the other half of the handshake above.
  auto all_arrived = [&](std::memory_order order = std::memory_order_acquire) {
    for (int r = 0; r < n; ++r) {
      if (h.ranks[r].arrived.load(order) < target) return false;
    }
    return true;
  };
  const Clock::time_point start = Clock::now();
  for (uint32_t i = 1; !all_arrived(); ++i) {
    if (i % 64 == 0) {
      if (Clock::now() - start >= options_.spin) break;
      // A peer that shares this CPU with us (the machine's other load took
      // the rest) can only arrive if we let it run.
      sched_yield();
    }
    CpuRelax();
  }
  if (all_arrived()) return Status::OK();

  const Clock::time_point deadline = start + options_.timeout;
  Clock::time_point next_liveness = start + kLivenessPeriod;
  h.sleepers.fetch_add(1);
  Status failed;
  // "3 (pid 1234)": names a rank in an error (only then: this loop runs on
  // the training step's path and allocates nothing otherwise).
  auto rank_name = [&](int r) {
    const int32_t pid = h.ranks[r].pid.load();
    return absl::StrCat(r, pid > 0 ? absl::StrCat(" (pid ", pid, ")") : "");
  };
  for (;;) {
    const uint32_t seen = h.wake.load();
    if (all_arrived(std::memory_order_seq_cst)) break;
    const Clock::time_point now = Clock::now();
    int dead = -1;
    if (now >= next_liveness) {
      next_liveness = now + kLivenessPeriod;
      for (int r = 0; r < n && dead < 0; ++r) {
        if (h.ranks[r].arrived.load(std::memory_order_acquire) >= target) continue;
        const int32_t pid = h.ranks[r].pid.load();
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) dead = r;
      }
    }
    if (dead >= 0) {
      failed = Status::Unavailable(absl::StrCat("shm ", op, " of ", RankText(options_), ": rank ",
                                                rank_name(dead), " exited before arriving"));
      break;
    }
    if (now >= deadline) {
      std::vector<std::string> missing;
      for (int r = 0; r < n; ++r) {
        if (h.ranks[r].arrived.load(std::memory_order_acquire) < target) {
          missing.push_back(rank_name(r));
        }
      }
      failed = Status::Timeout(absl::StrCat("shm ", op, " of ", RankText(options_), ": ranks ",
                                            absl::StrJoin(missing, ", "), " did not arrive within ",
                                            options_.timeout.count(), " ms"));
      break;
    }
    FutexWait(&h.wake, seen, std::min<Clock::duration>(deadline - now, kLivenessPeriod));
  }
  h.sleepers.fetch_sub(1);
  if (!failed.ok()) broken_ = failed;
  return failed;
}

namespace {

// dst[i] = op over ranks of slot_k[i], in rank order, for i in [lo, hi).
void ReduceSlots(const std::vector<const float*>& slots, ReduceOp op, size_t lo, size_t hi,
                 float* __restrict dst) {
  const float* __restrict first = slots[0];
  std::copy(first + lo, first + hi, dst + lo);
  for (size_t k = 1; k < slots.size(); ++k) {
    const float* __restrict src = slots[k];
    if (op == ReduceOp::kMax) {
      for (size_t i = lo; i < hi; ++i) dst[i] = std::max(dst[i], src[i]);
    } else {
      for (size_t i = lo; i < hi; ++i) dst[i] += src[i];
    }
  }
  if (op == ReduceOp::kMean) {
    const float scale = 1.0f / static_cast<float>(slots.size());
    for (size_t i = lo; i < hi; ++i) dst[i] *= scale;
  }
}

}  // namespace

Status ShmCollective::AllReduce(float* data, size_t count, ReduceOp op) {
  FLEET_RETURN_IF_ERROR(Usable("all-reduce"));
  const int me = options_.rank, n = options_.size;
  for (int r = 0; r < n; ++r) inputs_[r] = slot(r);
  for (size_t c = 0; c < count; c += slot_floats_) {
    const size_t len = std::min(slot_floats_, count - c);
    float* chunk = data + c;
    std::memcpy(slot(me), chunk, len * sizeof(float));
    FLEET_RETURN_IF_ERROR(Meet("all-reduce"));
    const auto [lo, hi] = Piece(len, n, me);
    ReduceSlots(inputs_, op, lo, hi, result());
    std::copy(result() + lo, result() + hi, chunk + lo);
    FLEET_RETURN_IF_ERROR(Meet("all-reduce"));
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const auto [a, b] = Piece(len, n, r);
      std::copy(result() + a, result() + b, chunk + a);
    }
  }
  return Status::OK();
}

Status ShmCollective::Broadcast(float* data, size_t count, int root) {
  if (root < 0 || root >= options_.size) {
    return Status::InvalidArgument("shm broadcast: root out of range",
                                   absl::StrCat("root ", root, ", size ", options_.size));
  }
  FLEET_RETURN_IF_ERROR(Usable("broadcast"));
  for (size_t c = 0; c < count; c += slot_floats_) {
    const size_t len = std::min(slot_floats_, count - c);
    if (options_.rank == root) std::memcpy(slot(root), data + c, len * sizeof(float));
    FLEET_RETURN_IF_ERROR(Meet("broadcast"));
    if (options_.rank != root) std::memcpy(data + c, slot(root), len * sizeof(float));
    FLEET_RETURN_IF_ERROR(Meet("broadcast"));
  }
  return Status::OK();
}

Status ShmCollective::AllGather(const float* in, float* out, size_t count) {
  FLEET_RETURN_IF_ERROR(Usable("all-gather"));
  const int me = options_.rank;
  const bool in_place = in == out + me * count;
  for (size_t c = 0; c < count; c += slot_floats_) {
    const size_t len = std::min(slot_floats_, count - c);
    std::memcpy(slot(me), in + c, len * sizeof(float));
    FLEET_RETURN_IF_ERROR(Meet("all-gather"));
    for (int r = 0; r < options_.size; ++r) {
      if (r == me && in_place) continue;
      std::memcpy(out + r * count + c, slot(r), len * sizeof(float));
    }
    FLEET_RETURN_IF_ERROR(Meet("all-gather"));
  }
  return Status::OK();
}

Status ShmCollective::ReduceScatter(const float* in, float* out, size_t count) {
  FLEET_RETURN_IF_ERROR(Usable("reduce-scatter"));
  const int me = options_.rank, n = options_.size;
  // Each chunk holds `len` floats of every rank's piece, piece r at r * len.
  const size_t per_piece = slot_floats_ / n;
  for (size_t c = 0; c < count; c += per_piece) {
    const size_t len = std::min(per_piece, count - c);
    for (int r = 0; r < n; ++r) {
      std::memcpy(slot(me) + r * len, in + r * count + c, len * sizeof(float));
    }
    FLEET_RETURN_IF_ERROR(Meet("reduce-scatter"));
    for (int r = 0; r < n; ++r) inputs_[r] = slot(r) + me * len;
    ReduceSlots(inputs_, ReduceOp::kSum, 0, len, out + c);
    FLEET_RETURN_IF_ERROR(Meet("reduce-scatter"));
  }
  return Status::OK();
}

Status ShmCollective::Barrier() {
  FLEET_RETURN_IF_ERROR(Usable("barrier"));
  return Meet("barrier");
}

}  // namespace fleet
