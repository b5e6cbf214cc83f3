#include "comm/gloo_collective.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "comm/bind_address.h"
#include "comm/gloo_store.h"

namespace fleet {
namespace {

// Gloo reports every transport failure as IoException; only the text tells
// a timeout ("Timed out waiting ...", "Read timeout ...") from a lost peer.
Status ClassifyIoError(const std::string& what) {
  std::string lower = absl::AsciiStrToLower(what);
  if (absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout")) {
    return Status::Timeout(what);
  }
  return Status::Unavailable(what);
}

// Runs fn and turns whatever Gloo throws into a Status.
template <typename Fn>
Status CatchGloo(Fn&& fn) {
  try {
    fn();
    return Status::OK();
  } catch (const StoreException& e) {
    return e.status();
  } catch (const gloo::IoException& e) {
    return ClassifyIoError(e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return Status::Internal("gloo check failed", e.what());
  } catch (const std::exception& e) {
    return Status::Internal("gloo error", e.what());
  }
}

std::string RankText(const GlooCollectiveOptions& o) {
  return absl::StrCat("rank ", o.rank, " of ", o.size, " in group '", o.group, "'");
}

// Marks this rank arrived under `prefix` and waits, up to options.timeout,
// until every rank of the group did. Gloo's own waits name one store key at a
// time; this one names every rank that is missing.
Status WaitForAllRanks(KvStoreClient& kv, const std::string& prefix,
                       const GlooCollectiveOptions& options) {
  auto arrived = [&](int r) { return absl::StrCat(prefix, "/arrived/", r); };
  FLEET_RETURN_IF_ERROR(kv.Set(arrived(options.rank), "1").WithContext(
      absl::StrCat("gloo rendezvous of ", RankText(options), ": marking this rank arrived")));
  std::vector<std::string> keys;
  for (int r = 0; r < options.size; ++r) keys.push_back(arrived(r));
  Status st = kv.Wait(keys, options.timeout);
  if (st.ok() || !st.IsTimeout()) {
    return st.WithContext(absl::StrCat("gloo rendezvous of ", RankText(options)));
  }
  std::vector<int> missing;
  for (int r = 0; r < options.size; ++r) {
    if (!kv.Get(arrived(r)).ok()) missing.push_back(r);
  }
  return Status::Timeout(
      absl::StrCat("gloo rendezvous of ", RankText(options), ": ranks ",
                   absl::StrJoin(missing, ", "), " never arrived (no ", prefix,
                   "/arrived/<rank> in the KV store) within ", options.timeout.count(),
                   " ms; a restarted rank waits for peers of its own restart generation ",
                   options.generation));
}

}  // namespace

Result<std::unique_ptr<GlooCollective>> GlooCollective::Create(KvStoreClient& kv,
                                                              const GlooCollectiveOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("gloo collective: need 0 <= rank < size",
                                   absl::StrCat("rank ", options.rank, ", size ", options.size));
  }
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("gloo collective: timeout must be positive",
                                   absl::StrCat(options.timeout.count(), " ms"));
  }
  if (options.group.empty()) return Status::InvalidArgument("gloo collective: empty group name");
  if (options.generation < 0) {
    return Status::InvalidArgument("gloo collective: generation must be >= 0",
                                   absl::StrCat(options.generation));
  }
  if (options.iface.empty() && options.hostname.empty()) {
    return Status::InvalidArgument("gloo collective: set a hostname or an interface to bind");
  }

  // Gloo gets a numeric address this machine can bind: libgloo crashes on a
  // name that does not resolve instead of throwing.
  Result<std::string> address =
      options.iface.empty() ? ResolveBindAddress(options.hostname, "gloo collective hostname")
                            : InterfaceAddress(options.iface, "gloo collective interface");
  if (!address.ok()) return address.status();
  gloo::transport::tcp::attr attr;
  attr.hostname = *address;
  std::shared_ptr<gloo::transport::Device> device;
  Status st = CatchGloo([&] { device = gloo::transport::tcp::CreateDevice(attr); });
  if (!st.ok()) {
    return Status::InvalidArgument("gloo collective: cannot bind a TCP device",
                                   absl::StrCat("address ", *address, ": ", st.message()));
  }

  const std::string prefix = absl::StrCat("gloo/", options.group, "/gen", options.generation);
  FLEET_RETURN_IF_ERROR(WaitForAllRanks(kv, prefix, options));
  auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
  context->setTimeout(options.timeout);
  GlooStore store(kv, prefix, options.timeout);
  st = CatchGloo([&] { context->connectFullMesh(store, device); });
  if (!st.ok()) {
    return st.WithContext(absl::StrCat("gloo rendezvous of ", RankText(options), " at ", prefix,
                                       ", timeout ", options.timeout.count(), " ms"));
  }
  return std::unique_ptr<GlooCollective>(new GlooCollective(options, std::move(context)));
}

GlooCollective::GlooCollective(GlooCollectiveOptions options, std::shared_ptr<gloo::Context> context)
    : options_(std::move(options)), context_(std::move(context)) {}

GlooCollective::~GlooCollective() = default;

template <typename Fn>
Status GlooCollective::Run(const char* op, size_t count, Fn&& fn) {
  if (!broken_.ok()) {
    return Status::FailedPrecondition(
        absl::StrCat("gloo ", op, ": group unusable after an earlier failure"), broken_.ToString());
  }
  Status st = CatchGloo(std::forward<Fn>(fn));
  if (st.ok()) return st;
  broken_ = st.WithContext(
      absl::StrCat("gloo ", op, " of ", count, " floats, ", RankText(options_), ", timeout ",
                   options_.timeout.count(), " ms"));
  return broken_;
}

Status GlooCollective::AllReduce(float* data, size_t count, ReduceOp op) {
  if (count == 0) return Run("allreduce", count, [] {});
  Status st = Run("allreduce", count, [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    // Mean is a sum scaled afterwards; Gloo has no mean.
    using ReduceFn = void (*)(void*, const void*, const void*, size_t);
    ReduceFn sum = &gloo::sum<float>;
    ReduceFn max = &gloo::max<float>;
    opts.setReduceFunction(op == ReduceOp::kMax ? max : sum);
    opts.setTag(NextTag());
    opts.setTimeout(options_.timeout);
    gloo::allreduce(opts);
  });
  if (st.ok() && op == ReduceOp::kMean) {
    const float scale = 1.0f / static_cast<float>(options_.size);
    std::for_each(data, data + count, [scale](float& v) { v *= scale; });
  }
  return st;
}

Status GlooCollective::Broadcast(float* data, size_t count, int root) {
  if (root < 0 || root >= options_.size) {
    return Status::InvalidArgument("gloo broadcast: root out of range",
                                   absl::StrCat("root ", root, ", size ", options_.size));
  }
  return Run("broadcast", count, [&] {
    if (count == 0) return;
    // The root's output buffer doubles as its input.
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, count);
    opts.setRoot(root);
    opts.setTag(NextTag());
    opts.setTimeout(options_.timeout);
    gloo::broadcast(opts);
  });
}

Status GlooCollective::AllGather(const float* in, float* out, size_t count) {
  return Run("allgather", count, [&] {
    if (count == 0) return;
    gloo::AllgatherOptions opts(context_);
    // In place (the input is this rank's slot of the output, as sharded
    // training passes it): give Gloo a copy, since it copies the input into
    // that slot with memcpy, which must not overlap.
    std::vector<float> own;
    if (in == out + static_cast<size_t>(options_.rank) * count) {
      own.assign(in, in + count);
      in = own.data();
    }
    // Gloo's input is non-const by type only; it is never written.
    opts.setInput(const_cast<float*>(in), count);
    opts.setOutput(out, count * options_.size);
    opts.setTag(NextTag());
    opts.setTimeout(options_.timeout);
    gloo::allgather(opts);
  });
}

Status GlooCollective::ReduceScatter(const float* in, float* out, size_t count) {
  const size_t total = count * options_.size;
  if (count > static_cast<size_t>(INT_MAX) / options_.size) {
    return Status::InvalidArgument("gloo reducescatter: element count exceeds INT_MAX",
                                   absl::StrCat(count, " x ", options_.size, " ranks"));
  }
  return Run("reducescatter", count, [&] {
    if (count == 0) return;
    // The halving-doubling algorithm works in place over all size*count
    // elements and leaves this rank's block at the front.
    std::vector<float> scratch(in, in + total);
    std::vector<int> block_sizes(options_.size, static_cast<int>(count));
    gloo::ReduceScatterHalvingDoubling<float> algorithm(context_, {scratch.data()},
                                                        static_cast<int>(total), block_sizes);
    algorithm.run();
    std::copy(scratch.begin(), scratch.begin() + count, out);
  });
}

Status GlooCollective::Barrier() {
  return Run("barrier", 0, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    opts.setTimeout(options_.timeout);
    gloo::barrier(opts);
  });
}

}  // namespace fleet
