// fleetps_reference_client OUT_DIR: the C++ side of fleetps_test's round
// trips. Run as worker 1 of a 2-worker sync job over tests/python/tables.yaml
// (fleetps_job.py execs it in place of its Python worker 1), it makes the
// steps that worker 0 makes through the fleetps module, with ps::PsClient
// directly, and writes what it pulled to OUT_DIR as raw float32 files
// (<name>.f32) for worker 0 to compare. The keys and gradients are fixed
// formulas that fleetps_job.py repeats.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "python/job.h"

namespace fleet::python {
namespace {

constexpr uint32_t kSparse = 0, kDense = 1;

// The keys both workers pull: low and high 64-bit values, so the shard of
// every kind of key is read the same way by both clients.
std::vector<uint64_t> Keys() { return {1, 2, 3, 977, 123456789012345ULL, (1ULL << 63) + 5, ~0ULL}; }

// Worker 1's gradient of row i, column d (fleetps_job.py: cpp_sparse_grads).
std::vector<float> SparseGrads(size_t rows, size_t dim) {
  std::vector<float> g(rows * dim);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t d = 0; d < dim; ++d) g[i * dim + d] = 0.01f * (i + 1) * (d + 1);
  }
  return g;
}

std::vector<float> DenseGrads(size_t dim) {
  std::vector<float> g(dim);
  for (size_t d = 0; d < dim; ++d) g[d] = 0.5f - 0.1f * d;
  return g;
}

Status Write(const std::string& dir, const std::string& name, std::span<const float> values) {
  const std::string path = dir + "/" + name + ".f32";
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  out.close();
  if (!out) return Status::IOError("cannot write", path);
  return Status::OK();
}

Status Run(const std::string& out_dir) {
  FLEET_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Job::Join({}));
  FLEET_ASSIGN_OR_RETURN(std::shared_ptr<ps::PsClient> client, job->client());
  ps::PsClient& c = *client;
  const std::vector<uint64_t> keys = Keys();
  std::vector<float> rows(keys.size() * c.PullDim(kSparse));

  FLEET_RETURN_IF_ERROR(c.PullSparse(kSparse, keys, rows));
  FLEET_RETURN_IF_ERROR(Write(out_dir, "sparse_initial", rows));
  FLEET_RETURN_IF_ERROR(c.Barrier("pulled_initial"));

  ps::PushOptions step0;
  step0.step = 0;
  const std::vector<float> grads = SparseGrads(keys.size(), c.PushDim(kSparse));
  FLEET_RETURN_IF_ERROR(c.PushSparseGrad(kSparse, keys, grads, step0));
  FLEET_RETURN_IF_ERROR(c.Barrier("pushed_sparse"));
  FLEET_RETURN_IF_ERROR(c.PullSparse(kSparse, keys, rows));
  FLEET_RETURN_IF_ERROR(Write(out_dir, "sparse_updated", rows));

  // Worker 0 set the dense values, and reads sparse_updated after this barrier.
  FLEET_RETURN_IF_ERROR(c.Barrier("dense_initialized"));
  const size_t dim = job->config().table(kDense)->dim;
  FLEET_RETURN_IF_ERROR(c.PushDenseGrad(kDense, DenseGrads(dim), step0));
  FLEET_RETURN_IF_ERROR(c.Barrier("pushed_dense"));
  std::vector<float> dense(dim);
  FLEET_RETURN_IF_ERROR(c.PullDense(kDense, dense));
  FLEET_RETURN_IF_ERROR(Write(out_dir, "dense_updated", dense));
  // Worker 0 reads the files after this barrier.
  FLEET_RETURN_IF_ERROR(c.Barrier("written"));
  job->Close();
  return Status::OK();
}

}  // namespace
}  // namespace fleet::python

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fleetps_reference_client OUT_DIR (run by fleetps_job.py)\n");
    return 2;
  }
  const fleet::Status st = fleet::python::Run(argv[1]);
  if (!st.ok()) {
    std::fprintf(stderr, "fleetps_reference_client: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
