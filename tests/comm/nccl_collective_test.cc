#include "comm/nccl_collective.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>

#include <gtest/gtest.h>

#include "tests/comm/collective_test_util.h"

namespace fleet {
namespace {

using fleet::testing::ExpectedAllGather;
using fleet::testing::ExpectedAllReduce;
using fleet::testing::ExpectedReduceScatter;
using fleet::testing::ExpectExactly;
using fleet::testing::LocalKvServer;
using fleet::testing::RunRanks;
using fleet::testing::SeedVector;
using fleet::testing::ThrowIfError;
using fleet::testing::UniqueJob;
using std::chrono::milliseconds;

// Number of visible GPUs, and why there are none when 0.
int GpuCount(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0) *why = "cudaGetDeviceCount found 0 devices";
  return n;
}

#define SKIP_WITHOUT_GPU(n)                                           \
  std::string why_no_gpu;                                             \
  const int n = GpuCount(&why_no_gpu);                                \
  if (n == 0) GTEST_SKIP() << "no CUDA GPU present: " << why_no_gpu

// A device buffer that copies to and from host vectors; throws on CUDA
// errors so a rank's failure reaches RunRanks.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    void* p = nullptr;
    if (count > 0 && cudaMalloc(&p, count * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMalloc failed");
    }
    ptr_ = static_cast<float*>(p);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() { return ptr_; }
  void Load(const std::vector<float>& v) {
    if (count_ && cudaMemcpy(ptr_, v.data(), count_ * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy to device failed");
    }
  }
  std::vector<float> Read() const {
    std::vector<float> v(count_);
    if (count_ && cudaMemcpy(v.data(), ptr_, count_ * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy to host failed");
    }
    return v;
  }

 private:
  size_t count_;
  float* ptr_ = nullptr;
};

TEST(NcclCollectiveTest, WithoutGpuCreateIsUnavailable) {
  std::string why;
  if (GpuCount(&why) > 0) GTEST_SKIP() << "a GPU is present; this test covers machines without one";
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  auto group = NcclCollective::Create(*client, NcclCollectiveOptions{});
  EXPECT_TRUE(group.status().IsUnavailable()) << group.status().ToString();
  EXPECT_NE(group.status().message().find("no CUDA GPU present"), std::string::npos)
      << group.status().message();
}

TEST(NcclCollectiveTest, EveryOpMatchesLocalExpectation) {
  SKIP_WITHOUT_GPU(gpus);
  const int size = std::min(gpus, 4);
  const size_t count = 1003;
  LocalKvServer kv;
  const std::string job = UniqueJob();
  RunRanks(size, [&](int rank) {
    auto client = kv.Client(job);
    NcclCollectiveOptions options;
    options.group = "grid";
    options.rank = rank;
    options.size = size;
    options.timeout = std::chrono::seconds(60);
    auto created = NcclCollective::Create(*client, options);
    ThrowIfError(created.status(), "create");
    NcclCollective& group = **created;
    DeviceBuffer data(count), big(count * size);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      data.Load(SeedVector(rank, count, size));
      ThrowIfError(group.AllReduce(data.get(), count, op), "allreduce");
      ExpectExactly(data.Read(), ExpectedAllReduce(op, count, size), "allreduce");
    }
    data.Load(SeedVector(rank, count, size));
    ThrowIfError(group.Broadcast(data.get(), count, size - 1), "broadcast");
    ExpectExactly(data.Read(), SeedVector(size - 1, count, size), "broadcast");

    data.Load(SeedVector(rank, count, size));
    ThrowIfError(group.AllGather(data.get(), big.get(), count), "allgather");
    ExpectExactly(big.Read(), ExpectedAllGather(count, size), "allgather");

    big.Load(SeedVector(rank, count * size, size));
    ThrowIfError(group.ReduceScatter(big.get(), data.get(), count), "reducescatter");
    ExpectExactly(data.Read(), ExpectedReduceScatter(rank, count, size), "reducescatter");
    ThrowIfError(group.Barrier(), "barrier");
  });
}

TEST(NcclCollectiveTest, InitTimesOutWhenARankNeverJoins) {
  SKIP_WITHOUT_GPU(gpus);
  LocalKvServer kv;
  auto client = kv.Client(UniqueJob());
  NcclCollectiveOptions options;
  options.group = "partial";
  options.rank = 1;  // waits for rank 0's id, which never comes
  options.size = 2;
  options.device = 0;
  options.timeout = milliseconds(500);
  auto group = NcclCollective::Create(*client, options);
  EXPECT_TRUE(group.status().IsTimeout()) << group.status().ToString();
  EXPECT_NE(group.status().message().find("nccl/partial/gen0/unique_id"), std::string::npos)
      << group.status().message();
}

}  // namespace
}  // namespace fleet
