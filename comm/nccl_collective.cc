#include "comm/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often a wait re-checks NCCL and the stream. Short, because every
// operation pays up to one interval of latency.
constexpr std::chrono::microseconds kPollInterval{50};

std::string NcclText(ncclResult_t r) { return ncclGetErrorString(r); }
std::string CudaText(cudaError_t e) { return cudaGetErrorString(e); }

std::string RankText(const NcclCollectiveOptions& o) {
  return absl::StrCat("rank ", o.rank, " of ", o.size, " in group '", o.group, "'");
}

}  // namespace

struct NcclCollective::Impl {
  ~Impl() {
    if (comm != nullptr) {
      if (healthy) {
        // Finalize flushes outstanding work; bounded like every other wait.
        // If it does not finish, abort rather than hang in a destructor.
        ncclResult_t state = ncclCommFinalize(comm);
        const auto deadline = Clock::now() + timeout;
        while (state == ncclInProgress && Clock::now() < deadline) {
          std::this_thread::sleep_for(kPollInterval);
          ncclCommGetAsyncError(comm, &state);
        }
        if (state == ncclSuccess) {
          ncclCommDestroy(comm);
        } else {
          ncclCommAbort(comm);
        }
      } else {
        ncclCommAbort(comm);
      }
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (scratch != nullptr) cudaFree(scratch);
  }

  // Polls until the communicator's pending work (init or an enqueued op)
  // left ncclInProgress and, when `stream_too`, the stream drained. On error
  // or deadline the communicator is aborted and the group marked unhealthy.
  Status WaitDone(bool stream_too, const std::string& what) {
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    while (true) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) {
        Abort();
        return Status::Unavailable(absl::StrCat(what, ": NCCL error"), NcclText(async));
      }
      if (async == ncclSuccess) {
        if (!stream_too) return Status::OK();
        cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess) return Status::OK();
        if (q != cudaErrorNotReady) {
          Abort();
          return Status::Internal(absl::StrCat(what, ": CUDA error"), CudaText(q));
        }
      }
      if (Clock::now() >= deadline) {
        Abort();
        auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
        return Status::Timeout(absl::StrCat(what, ": not complete after ", waited.count(),
                                            " ms (timeout ", timeout.count(),
                                            " ms); communicator aborted"));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

  void Abort() {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    healthy = false;
  }

  // Fixed after Create.
  int device = 0;
  milliseconds timeout{0};
  // Owned handles; released by the destructor.
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one device float for Barrier
  bool healthy = true;
};

Result<std::unique_ptr<NcclCollective>> NcclCollective::Create(KvStoreClient& kv,
                                                              const NcclCollectiveOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("nccl collective: need 0 <= rank < size",
                                   absl::StrCat("rank ", options.rank, ", size ", options.size));
  }
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("nccl collective: timeout must be positive",
                                   absl::StrCat(options.timeout.count(), " ms"));
  }
  if (options.group.empty()) return Status::InvalidArgument("nccl collective: empty group name");
  if (options.generation < 0) {
    return Status::InvalidArgument("nccl collective: generation must be >= 0",
                                   absl::StrCat(options.generation));
  }

  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return Status::Unavailable("no CUDA GPU present",
                               e != cudaSuccess ? CudaText(e) : "cudaGetDeviceCount found 0 devices");
  }
  const int device = options.device >= 0 ? options.device : options.rank % devices;
  if (device >= devices) {
    return Status::InvalidArgument("nccl collective: no such CUDA device",
                                   absl::StrCat("device ", device, " of ", devices));
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->timeout = options.timeout;
  if ((e = cudaSetDevice(device)) != cudaSuccess) {
    return Status::Unavailable(absl::StrCat("nccl collective: cannot use CUDA device ", device), CudaText(e));
  }

  // Exchange the unique id through the KV store.
  const std::string key = absl::StrCat("nccl/", options.group, "/gen", options.generation, "/unique_id");
  ncclUniqueId id;
  if (options.rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return Status::Unavailable("nccl collective: ncclGetUniqueId failed", NcclText(r));
    FLEET_RETURN_IF_ERROR(kv.Set(key, std::string(id.internal, sizeof(id.internal)))
                              .WithContext(absl::StrCat("nccl publish id, ", RankText(options))));
  } else {
    Result<std::string> bytes = kv.WaitGet(key, options.timeout);
    if (!bytes.ok()) {
      return bytes.status().WithContext(
          absl::StrCat("nccl waiting for rank 0's unique id, ", RankText(options)));
    }
    if (bytes->size() != sizeof(id.internal)) {
      return Status::Corruption("nccl unique id has the wrong size",
                                absl::StrCat(key, ": ", bytes->size(), " bytes, want ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init and ops return at once; WaitDone bounds them
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, options.size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    impl->Abort();
    return Status::Unavailable(absl::StrCat("nccl init failed, ", RankText(options)), NcclText(r));
  }
  FLEET_RETURN_IF_ERROR(impl->WaitDone(
      false, absl::StrCat("nccl init waiting for all ", options.size, " ranks to join, ", RankText(options))));

  if ((e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking)) != cudaSuccess) {
    return Status::Internal("nccl collective: cudaStreamCreate failed", CudaText(e));
  }
  void* scratch = nullptr;
  if ((e = cudaMalloc(&scratch, sizeof(float))) != cudaSuccess) {
    return Status::Internal("nccl collective: cudaMalloc failed", CudaText(e));
  }
  impl->scratch = static_cast<float*>(scratch);
  return std::unique_ptr<NcclCollective>(new NcclCollective(options, std::move(impl)));
}

NcclCollective::NcclCollective(NcclCollectiveOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

NcclCollective::~NcclCollective() = default;

template <typename Launch>
Status NcclCollective::Run(const char* op, size_t count, Launch&& launch) {
  if (!broken_.ok()) {
    return Status::FailedPrecondition(
        absl::StrCat("nccl ", op, ": group unusable after an earlier failure"), broken_.ToString());
  }
  const std::string what =
      absl::StrCat("nccl ", op, " of ", count, " floats, ", RankText(options_));
  cudaError_t e = cudaSetDevice(impl_->device);
  Status st;
  if (e != cudaSuccess) {
    st = Status::Internal(absl::StrCat(what, ": cudaSetDevice failed"), CudaText(e));
  } else {
    ncclResult_t r = launch();
    if (r != ncclSuccess && r != ncclInProgress) {
      impl_->Abort();
      st = Status::Unavailable(absl::StrCat(what, ": launch failed"), NcclText(r));
    } else {
      st = impl_->WaitDone(true, what);
    }
  }
  if (!st.ok()) broken_ = st;
  return st;
}

Status NcclCollective::AllReduce(float* data, size_t count, ReduceOp op) {
  if (count == 0) return Run("allreduce", 0, [] { return ncclSuccess; });
  const ncclRedOp_t nccl_op = op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMean ? ncclAvg : ncclMax;
  return Run("allreduce", count, [&] {
    return ncclAllReduce(data, data, count, ncclFloat, nccl_op, impl_->comm, impl_->stream);
  });
}

Status NcclCollective::Broadcast(float* data, size_t count, int root) {
  if (root < 0 || root >= options_.size) {
    return Status::InvalidArgument("nccl broadcast: root out of range",
                                   absl::StrCat("root ", root, ", size ", options_.size));
  }
  if (count == 0) return Run("broadcast", 0, [] { return ncclSuccess; });
  return Run("broadcast", count, [&] {
    return ncclBroadcast(data, data, count, ncclFloat, root, impl_->comm, impl_->stream);
  });
}

Status NcclCollective::AllGather(const float* in, float* out, size_t count) {
  if (count == 0) return Run("allgather", 0, [] { return ncclSuccess; });
  return Run("allgather", count, [&] {
    return ncclAllGather(in, out, count, ncclFloat, impl_->comm, impl_->stream);
  });
}

Status NcclCollective::ReduceScatter(const float* in, float* out, size_t count) {
  if (count == 0) return Run("reducescatter", 0, [] { return ncclSuccess; });
  return Run("reducescatter", count, [&] {
    return ncclReduceScatter(in, out, count, ncclFloat, ncclSum, impl_->comm, impl_->stream);
  });
}

Status NcclCollective::Barrier() {
  // NCCL has no barrier; a one-float allreduce has the same effect.
  return Run("barrier", 0, [&] {
    return ncclAllReduce(impl_->scratch, impl_->scratch, 1, ncclFloat, ncclSum, impl_->comm,
                         impl_->stream);
  });
}

}  // namespace fleet
