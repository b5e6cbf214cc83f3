// fleetps._fleetps: the Python binding of a worker's public C++ API (the
// Job of python/job.h, its ps::PsClient and worker::Communicator). The
// Python package (python/fleetps/) re-exports it and adds init() and the
// PyTorch layer.
//
// Rules every binding here follows (CONTRIBUTING.md, "The Python module"):
// * Arrays: keys are read as uint64 and values as float32, C-contiguous;
//   an array already of that kind is used in place (no copy), any other is
//   converted (numpy's casting, one copy). Results are new arrays the C++
//   side writes into, or the caller's `out=` array, which must be exactly
//   float32, C-contiguous, writable and of the right size (never a copy
//   that would leave the caller's array unwritten).
// * The GIL is released around every call that may wait on the network,
//   and only arrays the call keeps referenced are touched meanwhile.
// * A non-OK Status becomes an exception of the class of its code (Raise),
//   whose text is FleetPS's message (Status::ToString).
#include <glog/logging.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/progress_report.h"
#include "python/job.h"

namespace py = pybind11;

namespace fleet::python {
namespace {

using Millis = std::chrono::milliseconds;
using KeyArray = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using OutArray = py::array_t<float, py::array::c_style>;

// ---- Errors ---------------------------------------------------------------

// The exception classes, made once at import and kept for the process
// (a module's types are never unloaded).
std::map<StatusCode, py::handle>& ErrorClasses() {
  static auto* classes = new std::map<StatusCode, py::handle>();
  return *classes;
}

void MakeErrorClasses(py::module_& m) {
  auto make = [&](const char* name, py::handle base, const char* doc) {
    py::handle cls(PyErr_NewExceptionWithDoc((std::string("fleetps.") + name).c_str(), doc,
                                             base.ptr(), nullptr));
    if (!cls) throw py::error_already_set();
    m.attr(name) = cls;
    return cls;
  };
  py::handle error = make("Error", PyExc_RuntimeError,
                          "A FleetPS call failed; the text is FleetPS's message (code: reason).");
  auto sub = [&](const char* name, PyObject* builtin, const char* doc) {
    py::tuple bases = py::make_tuple(error, py::handle(builtin));
    return make(name, bases, doc);
  };
  auto& classes = ErrorClasses();
  classes[StatusCode::kInternal] = error;
  classes[StatusCode::kInvalidArgument] =
      sub("InvalidArgument", PyExc_ValueError, "Bad input: a value, size, config key or variable.");
  classes[StatusCode::kNotFound] =
      sub("NotFound", PyExc_LookupError, "A table, file or peer that does not exist.");
  classes[StatusCode::kTimeout] = sub("Timeout", PyExc_TimeoutError,
                                      "A wait passed its deadline (it names what it waited for).");
  classes[StatusCode::kUnavailable] =
      sub("Unavailable", PyExc_ConnectionError,
          "A server is down or unreachable, or the job was closed.");
  classes[StatusCode::kFailedPrecondition] =
      sub("FailedPrecondition", PyExc_RuntimeError, "The call is not allowed in this state.");
  classes[StatusCode::kCorruption] =
      sub("Corruption", PyExc_RuntimeError, "Stored or received bytes failed a check.");
  classes[StatusCode::kIOError] = sub("IOError", PyExc_OSError, "The OS refused a file operation.");
}

// REQUIRES: the GIL is held.
[[noreturn]] void Raise(const Status& status) {
  auto& classes = ErrorClasses();
  auto it = classes.find(status.code());
  py::handle cls = it != classes.end() ? it->second : classes.at(StatusCode::kInternal);
  PyErr_SetString(cls.ptr(), status.ToString().c_str());
  throw py::error_already_set();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T ValueOf(Result<T> result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

// Runs fn with the GIL released and raises its error with the GIL back.
void NoGil(const std::function<Status()>& fn) {
  Status status;
  {
    py::gil_scoped_release release;
    status = fn();
  }
  Check(status);
}

// ---- Arrays ---------------------------------------------------------------

std::span<const uint64_t> Span(const KeyArray& a) {
  return {a.data(), static_cast<size_t>(a.size())};
}
std::span<const float> Span(const FloatArray& a) {
  return {a.data(), static_cast<size_t>(a.size())};
}

// The caller's `out` (checked), or a new float32 array of `shape`.
OutArray OutputArray(const py::object& out, std::vector<py::ssize_t> shape) {
  size_t elements = 1;
  for (py::ssize_t d : shape) elements *= static_cast<size_t>(d);
  if (out.is_none()) return OutArray(shape);
  if (!OutArray::check_(out)) {
    Raise(Status::InvalidArgument("out= must be a C-contiguous float32 numpy array",
                                  py::str(py::type::of(out)).cast<std::string>()));
  }
  OutArray array = py::reinterpret_borrow<OutArray>(out);
  if (!array.writeable()) Raise(Status::InvalidArgument("out= is read-only"));
  if (static_cast<size_t>(array.size()) != elements) {
    Raise(Status::InvalidArgument(
        "out= has the wrong size",
        std::to_string(array.size()) + " floats, want " + std::to_string(elements)));
  }
  return array;
}

std::span<float> Span(OutArray& a) { return {a.mutable_data(), static_cast<size_t>(a.size())}; }

// ---- Futures --------------------------------------------------------------

// The outcome of an async call. Keeps the client and the array the call
// writes alive until the call completed: result() waits (GIL released) and
// returns the array (None for pushes) or raises; the destructor waits too,
// so an abandoned future never leaves a request writing into freed memory.
class Future {
 public:
  Future(std::shared_ptr<ps::PsClient> client, std::future<Status> future, py::object result)
      : client_(std::move(client)), future_(std::move(future)), result_(std::move(result)) {}
  ~Future() {
    if (!future_.valid()) return;
    py::gil_scoped_release release;
    if (Status st = client_->Wait(std::move(future_)); !st.ok()) {
      LOG(WARNING) << "fleetps: a future dropped without result() failed: " << st.ToString();
    }
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  py::object Result() {
    if (future_.valid()) {
      Status st;
      {
        py::gil_scoped_release release;
        st = client_->Wait(std::move(future_));
      }
      outcome_ = st;
    }
    Check(outcome_);
    return result_;
  }
  bool Done() const {
    return !future_.valid() || future_.wait_for(Millis(0)) == std::future_status::ready;
  }

 private:
  std::shared_ptr<ps::PsClient> client_;
  std::future<Status> future_;  // invalid once waited for
  Status outcome_;
  py::object result_;
};

// A communicator's push on its way (Communicator::StartPush): wait() once.
class PendingPush {
 public:
  PendingPush(std::shared_ptr<CommunicatorHandle> handle, worker::PendingPush pending)
      : handle_(std::move(handle)), pending_(std::move(pending)) {}
  ~PendingPush() {
    if (waited_) return;
    py::gil_scoped_release release;
    if (Status st = pending_.Wait(); !st.ok()) {
      LOG(WARNING) << "fleetps: a push dropped without wait() failed: " << st.ToString();
    }
  }
  PendingPush(const PendingPush&) = delete;
  PendingPush& operator=(const PendingPush&) = delete;

  void Wait() {
    if (waited_) Raise(Status::FailedPrecondition("PendingPush.wait() called twice"));
    waited_ = true;
    NoGil([&] { return pending_.Wait(); });
  }

 private:
  std::shared_ptr<CommunicatorHandle> handle_;  // keeps the client alive
  worker::PendingPush pending_;
  bool waited_ = false;
};

// ---- Job ------------------------------------------------------------------

std::shared_ptr<ps::PsClient> ClientOf(const Job& job) { return ValueOf(job.client()); }

const ps::TableConfig& TableOf(const Job& job, uint32_t table) {
  const ps::TableConfig* t = job.config().table(table);
  if (t == nullptr)
    Raise(Status::NotFound("no such table in the job config", std::to_string(table)));
  return *t;
}

// What a pull writes: the rows of `keys`, or the whole dense table; the
// caller's `out` when given (checked), else a new array.
OutArray SparseRows(const ps::PsClient& client, uint32_t table, const KeyArray& keys,
                    const py::object& out) {
  return OutputArray(out, {keys.size(), static_cast<py::ssize_t>(client.PullDim(table))});
}
OutArray DenseValues(const Job& job, uint32_t table, const py::object& out) {
  return OutputArray(out, {static_cast<py::ssize_t>(TableOf(job, table).dim)});
}

py::dict TableInfo(const Job& job, const ps::TableConfig& t) {
  static const char* kRules[] = {"sgd", "adagrad", "adam"};
  std::shared_ptr<ps::PsClient> client = ClientOf(job);
  py::dict d;
  d["id"] = t.id;
  d["kind"] = t.kind == ps::TableKind::kSparse ? "sparse" : "dense";
  d["dim"] = t.dim;
  d["accessor"] = t.accessor == ps::AccessorKind::kCtr ? "ctr" : "plain";
  d["pull_dim"] = client->PullDim(t.id);
  d["push_dim"] = client->PushDim(t.id);
  d["optimizer"] = kRules[static_cast<int>(t.optimizer.rule)];
  d["learning_rate"] = t.optimizer.learning_rate;
  d["initial_g2sum"] = t.optimizer.initial_g2sum;
  d["beta1"] = t.optimizer.beta1;
  d["beta2"] = t.optimizer.beta2;
  d["epsilon"] = t.optimizer.epsilon;
  d["l2_decay"] = t.optimizer.l2_decay;
  return d;
}

py::list StatsOf(const Job& job) {
  std::vector<pb::PsStatsReply> replies;
  std::shared_ptr<ps::PsClient> client = ClientOf(job);
  NoGil([&]() -> Status {
    FLEET_ASSIGN_OR_RETURN(replies, client->Stats());
    return Status::OK();
  });
  py::list out;
  for (const auto& r : replies) {
    py::list tables;
    for (const auto& t : r.tables()) {
      py::dict d;
      d["table_id"] = t.table_id();
      d["sparse"] = t.sparse();
      d["rows"] = t.rows();
      d["bytes"] = t.bytes();
      d["ext_rows"] = t.ext_rows();
      d["pending_keys"] = t.pending_keys();
      d["dropped_pushes"] = t.dropped_pushes();
      d["next_sync_step"] = t.next_sync_step();
      tables.append(d);
    }
    py::dict server;
    server["server_rank"] = r.server_rank();
    server["requests_served"] = r.requests_served();
    server["requests_rejected"] = r.requests_rejected();
    server["tables"] = tables;
    out.append(server);
  }
  return out;
}

// CTR accessor counts: none, or one show and one click per key.
struct Counts {
  std::optional<FloatArray> shows, clicks;
};

ps::PushOptions PushOptionsFor(int64_t step, const Counts& counts = {}) {
  ps::PushOptions o;
  o.step = step;
  if (counts.shows) o.shows = Span(*counts.shows);
  if (counts.clicks) o.clicks = Span(*counts.clicks);
  return o;
}

void BindJob(py::module_& m) {
  py::class_<Job, std::shared_ptr<Job>>(m, "Job", R"doc(
A worker's place in a parameter-server job: made by fleetps.init(), never
directly. Tables are named by their id in the job config. Every method is
thread-safe; the blocking ones release the GIL while they wait (each wait
is bounded by the job's Distributed.timeout_ms).)doc")
      .def_static(
          "_join",
          [](std::map<std::string, std::string> env, int64_t timeout_ms) {
            JobOptions o{.env = std::move(env), .timeout = Millis(timeout_ms)};
            std::shared_ptr<Job> job;
            NoGil([&]() -> Status {
              FLEET_ASSIGN_OR_RETURN(job, Job::Join(std::move(o)));
              return Status::OK();
            });
            return job;
          },
          py::arg("env"), py::arg("timeout_ms") = 0)
      .def_property_readonly("rank", [](const Job& j) { return j.spec().rank; })
      .def_property_readonly("world_size", [](const Job& j) { return j.spec().world_size; })
      .def_property_readonly("job_id", [](const Job& j) { return j.spec().job_id; })
      .def_property_readonly("servers", &Job::servers)
      .def_property_readonly("num_servers", [](const Job& j) { return j.servers().size(); })
      .def_property_readonly(
          "mode",
          [](const Job& j) { return std::string(ps::SyncModeName(j.config().distributed.mode)); })
      .def_property_readonly("timeout_ms",
                             [](const Job& j) { return j.config().distributed.timeout.count(); })
      .def_property_readonly("tables",
                             [](const Job& j) {
                               py::list out;
                               for (const auto& t : j.config().tables) out.append(TableInfo(j, t));
                               return out;
                             })
      .def(
          "table", [](const Job& j, uint32_t table) { return TableInfo(j, TableOf(j, table)); },
          py::arg("table"),
          "The config of one table: id, kind, dim, pull_dim, push_dim, optimizer and its settings.")
      // ---- sparse
      .def(
          "pull_sparse",
          [](const Job& j, uint32_t table, const KeyArray& keys, const py::object& out) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            OutArray values = SparseRows(*client, table, keys, out);
            NoGil([&] { return client->PullSparse(table, Span(keys), Span(values)); });
            return values;
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          "Rows of `keys` (any order, duplicates fine): float32 [len(keys), pull_dim].")
      .def(
          "pull_sparse_async",
          [](const Job& j, uint32_t table, const KeyArray& keys, const py::object& out) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            OutArray values = SparseRows(*client, table, keys, out);
            std::future<Status> f = client->PullSparseAsync(table, Span(keys), Span(values));
            return std::make_unique<Future>(client, std::move(f), values);
          },
          py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
          "pull_sparse as a Future; result() returns the rows. The array is written until then.")
      .def(
          "push_sparse",
          [](const Job& j, uint32_t table, const KeyArray& keys, const FloatArray& grads,
             int64_t step, std::optional<FloatArray> shows, std::optional<FloatArray> clicks) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            const Counts counts{std::move(shows), std::move(clicks)};
            NoGil([&] {
              return client->PushSparseGrad(table, Span(keys), Span(grads),
                                            PushOptionsFor(step, counts));
            });
          },
          py::arg("table"), py::arg("keys"), py::arg("grads"), py::arg("step") = -1,
          py::arg("shows") = py::none(), py::arg("clicks") = py::none(),
          "Gradients [len(keys), push_dim] for `keys` (duplicates are summed). Sync mode needs "
          "`step` (a communicator counts steps for you); CTR accessor tables take a show and a "
          "click count per key (default 1 and 0).")
      .def(
          "push_sparse_async",
          [](const Job& j, uint32_t table, const KeyArray& keys, const FloatArray& grads,
             int64_t step, std::optional<FloatArray> shows, std::optional<FloatArray> clicks) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            const Counts counts{std::move(shows), std::move(clicks)};
            std::future<Status> f = client->PushSparseGradAsync(table, Span(keys), Span(grads),
                                                                PushOptionsFor(step, counts));
            return std::make_unique<Future>(client, std::move(f), py::none());
          },
          py::arg("table"), py::arg("keys"), py::arg("grads"), py::arg("step") = -1,
          py::arg("shows") = py::none(), py::arg("clicks") = py::none(),
          "push_sparse as a Future (keys and grads are read before it returns).")
      // ---- dense
      .def(
          "pull_dense",
          [](const Job& j, uint32_t table, const py::object& out) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            OutArray values = DenseValues(j, table, out);
            NoGil([&] { return client->PullDense(table, Span(values)); });
            return values;
          },
          py::arg("table"), py::arg("out") = py::none(), "The whole dense table: float32 [dim].")
      .def(
          "pull_dense_async",
          [](const Job& j, uint32_t table, const py::object& out) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            OutArray values = DenseValues(j, table, out);
            std::future<Status> f = client->PullDenseAsync(table, Span(values));
            return std::make_unique<Future>(client, std::move(f), values);
          },
          py::arg("table"), py::arg("out") = py::none(), "pull_dense as a Future.")
      .def(
          "push_dense",
          [](const Job& j, uint32_t table, const FloatArray& grads, int64_t step) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            NoGil([&] { return client->PushDenseGrad(table, Span(grads), PushOptionsFor(step)); });
          },
          py::arg("table"), py::arg("grads"), py::arg("step") = -1,
          "A gradient of the whole dense table (float32 [dim]).")
      .def(
          "push_dense_async",
          [](const Job& j, uint32_t table, const FloatArray& grads, int64_t step) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            // A copy the transport owns: the caller may reuse `grads` at once.
            SArray<float> copy(grads.data(), static_cast<size_t>(grads.size()));
            std::future<Status> f = client->ZPushDenseGrad(table, copy, PushOptionsFor(step));
            return std::make_unique<Future>(client, std::move(f), py::none());
          },
          py::arg("table"), py::arg("grads"), py::arg("step") = -1,
          "push_dense as a Future (grads are copied before it returns).")
      .def(
          "init_dense",
          [](const Job& j, uint32_t table, const FloatArray& values) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            NoGil([&] { return client->InitDense(table, Span(values)); });
          },
          py::arg("table"), py::arg("values"),
          "Sets a dense table's values (one worker does it, then a barrier).")
      // ---- control
      .def(
          "barrier",
          [](const Job& j, const std::string& name, int size, int64_t timeout_ms) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            ps::BarrierOptions o{.timeout = Millis(timeout_ms), .size = size};
            NoGil([&] { return client->Barrier(name, o); });
          },
          py::arg("name") = "fleetps", py::arg("size") = 0, py::arg("timeout_ms") = 0,
          "Blocks until `size` workers (default all) reached the barrier `name`.")
      .def(
          "save",
          [](const Job& j, const std::string& dir, bool delta) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            NoGil([&] { return client->Save(dir, delta); });
          },
          py::arg("dir"), py::arg("delta") = false,
          "Every server saves its part of every table into `dir` (under the job's save dirs).")
      .def(
          "load",
          [](const Job& j, const std::string& dir) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            NoGil([&] { return client->Load(dir); });
          },
          py::arg("dir"), "Every server loads its part of `dir` (any server count saved it).")
      .def("stats", &StatsOf, "One dict per server: requests and, per table, rows and bytes.")
      .def(
          "shrink",
          [](const Job& j, int table) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            uint64_t rows = 0;
            NoGil([&]() -> Status {
              FLEET_ASSIGN_OR_RETURN(rows, client->Shrink(table));
              return Status::OK();
            });
            return rows;
          },
          py::arg("table") = -1, "Deletes stale rows (CTR accessor); returns how many.")
      .def(
          "stop_servers",
          [](const Job& j) {
            std::shared_ptr<ps::PsClient> client = ClientOf(j);
            NoGil([&] { return client->StopServers(); });
          },
          "Asks every server to stop (a job started by hand; fleetrun stops its own).")
      .def(
          "progress",
          [](const Job& j, int64_t total_steps, int64_t steps_per_epoch, int64_t samples_per_step,
             double every_s) {
            ProgressReporterOptions o =
                ProgressOptionsFor(j.spec(), "worker " + std::to_string(j.spec().rank), total_steps,
                                   steps_per_epoch, samples_per_step);
            o.interval = Millis(static_cast<int64_t>(std::max(0.0, every_s) * 1000));
            return std::make_unique<ProgressReporter>(std::move(o));
          },
          py::arg("total_steps"), py::arg("steps_per_epoch"), py::arg("samples_per_step"),
          py::arg("every_s") = 10.0,
          "A Progress: call step(steps_done) after each step. Every every_s it logs ps_worker's "
          "progress line and reports to fleetrun (its metrics and final throughput).")
      .def(
          "communicator",
          [](Job& j, std::optional<uint32_t> sparse_table, std::optional<uint32_t> dense_table,
             int batch_size) {
            worker::CommunicatorOptions o;
            o.sparse_table = sparse_table;
            o.dense_table = dense_table;
            o.batch_size = batch_size;
            return ValueOf(j.NewCommunicator(o));
          },
          py::arg("sparse_table") = py::none(), py::arg("dense_table") = py::none(),
          py::arg("batch_size") = 1,
          "A communicator of the job's mode over at most one sparse and one dense table.")
      .def(
          "close",
          [](Job& j) {
            py::gil_scoped_release release;
            j.Close();
          },
          "Ends the communicators (an async one sends its queue) and the client. Idempotent.");
}

// ---- Communicator ---------------------------------------------------------

// The request of a pull or push, its spans over the arrays that the caller
// keeps alive for the call.
struct PushArrays {
  std::optional<KeyArray> keys;
  std::optional<FloatArray> grads, dense_grads;
  Counts counts;

  worker::PushRequest Request() const {
    if (keys.has_value() != grads.has_value()) {
      Raise(Status::InvalidArgument("keys and grads go together"));
    }
    worker::PushRequest r;
    if (keys) r.sparse_keys = Span(*keys);
    if (grads) r.sparse_grads = Span(*grads);
    if (dense_grads) r.dense_grads = Span(*dense_grads);
    if (counts.shows) r.sparse_shows = Span(*counts.shows);
    if (counts.clicks) r.sparse_clicks = Span(*counts.clicks);
    return r;
  }
};

PushArrays PushArgs(std::optional<KeyArray> keys, std::optional<FloatArray> grads,
                    std::optional<FloatArray> dense_grads, std::optional<FloatArray> shows,
                    std::optional<FloatArray> clicks) {
  return {std::move(keys),
          std::move(grads),
          std::move(dense_grads),
          {std::move(shows), std::move(clicks)}};
}

void BindProgress(py::module_& m) {
  py::class_<ProgressReporter>(m, "Progress", "A worker's progress as fleetrun shows it.")
      .def(
          "step",
          [](ProgressReporter& p, int64_t steps_done) {
            py::gil_scoped_release release;  // a report is one KV store request
            p.Step(steps_done);
          },
          py::arg("steps_done"), "After a step: the number of the job's steps done so far.");
}

void BindCommunicator(py::module_& m) {
  py::class_<Future>(m, "Future", "The outcome of an async call: result() waits and returns it.")
      .def("result", &Future::Result, "Waits (GIL released); the pulled array, or None; raises.")
      .def("done", &Future::Done, "Whether result() would return at once.");

  py::class_<PendingPush>(m, "PendingPush", "A push on its way: wait() once.")
      .def("wait", &PendingPush::Wait, "Waits until the servers took it (sync: applied).");

  py::class_<CommunicatorHandle, std::shared_ptr<CommunicatorHandle>>(m, "Communicator", R"doc(
How a worker pulls parameters and hands back gradients in the job's
Distributed.mode (worker/communicator.h): sync pushes wait for every worker's
push of the step; async queues them and sends merged batches in the
background; geo trains a local copy and exchanges deltas every k_steps.
Calls are serialised (one at a time per communicator).)doc")
      .def(
          "pull",
          [](CommunicatorHandle& h, std::optional<KeyArray> keys, const py::object& dense_out) {
            const worker::CommunicatorOptions& o = h.options();
            worker::PullRequest r;
            py::object rows = py::none();
            std::optional<OutArray> sparse, dense;
            if (keys) {
              if (!o.sparse_table)
                Raise(
                    Status::InvalidArgument("keys given to a communicator without a sparse table"));
              const auto dim = static_cast<py::ssize_t>(h.client().PullDim(*o.sparse_table));
              sparse = OutputArray(py::none(), {keys->size(), dim});
              r.sparse_keys = Span(*keys);
              r.sparse_values = Span(*sparse);
              rows = *sparse;
            }
            if (!dense_out.is_none()) {
              if (!o.dense_table)
                Raise(Status::InvalidArgument(
                    "dense_out given to a communicator without a dense table"));
              const ps::TableConfig* t = h.client().job().table(*o.dense_table);
              dense = OutputArray(dense_out, {static_cast<py::ssize_t>(t->dim)});
              r.dense_values = Span(*dense);
            }
            NoGil([&] { return h.Run([&](worker::Communicator& c) { return c.Pull(r); }); });
            return rows;
          },
          py::arg("keys") = py::none(), py::arg("dense_out") = py::none(),
          "Rows of `keys` [len(keys), pull_dim] (None without keys); fills dense_out with the "
          "dense table when given.")
      .def(
          "push",
          [](CommunicatorHandle& h, std::optional<KeyArray> keys, std::optional<FloatArray> grads,
             std::optional<FloatArray> dense_grads, std::optional<FloatArray> shows,
             std::optional<FloatArray> clicks) {
            const PushArrays args = PushArgs(keys, grads, dense_grads, shows, clicks);
            const worker::PushRequest r = args.Request();
            NoGil([&] { return h.Run([&](worker::Communicator& c) { return c.Push(r); }); });
          },
          py::arg("keys") = py::none(), py::arg("grads") = py::none(),
          py::arg("dense_grads") = py::none(), py::arg("shows") = py::none(),
          py::arg("clicks") = py::none(),
          "One step's gradients, already scaled by gradient_scale(). Sync: every worker pushes "
          "once per step, empty when it had no batch.")
      .def(
          "start_push",
          [](const std::shared_ptr<CommunicatorHandle>& h, std::optional<KeyArray> keys,
             std::optional<FloatArray> grads, std::optional<FloatArray> dense_grads,
             std::optional<FloatArray> shows, std::optional<FloatArray> clicks) {
            const PushArrays args = PushArgs(keys, grads, dense_grads, shows, clicks);
            const worker::PushRequest r = args.Request();
            worker::PendingPush pending;
            NoGil([&] {
              return h->Run([&](worker::Communicator& c) {
                pending = c.StartPush(r);
                return Status::OK();
              });
            });
            return std::make_unique<PendingPush>(h, std::move(pending));
          },
          py::arg("keys") = py::none(), py::arg("grads") = py::none(),
          py::arg("dense_grads") = py::none(), py::arg("shows") = py::none(),
          py::arg("clicks") = py::none(),
          "push() without waiting where the mode would (sync): wait() on the result.")
      .def(
          "flush",
          [](CommunicatorHandle& h) {
            NoGil([&] { return h.Run([](worker::Communicator& c) { return c.Flush(); }); });
          },
          "Returns once everything pushed reached the servers (before evaluating or saving).")
      .def(
          "gradient_scale",
          [](CommunicatorHandle& h, size_t batch_samples) {
            double scale = 0;
            Check(h.Run([&](worker::Communicator& c) {
              scale = c.GradientScale(batch_samples);
              return Status::OK();
            }));
            return scale;
          },
          py::arg("batch_samples"),
          "What to multiply the gradients of a batch-mean loss by before push().")
      .def_property_readonly("name", [](CommunicatorHandle& h) {
        std::string name;
        Check(h.Run([&](worker::Communicator& c) {
          name = c.name();
          return Status::OK();
        }));
        return name;
      });
}

}  // namespace
}  // namespace fleet::python

PYBIND11_MODULE(_fleetps, m) {
  using namespace fleet::python;
  m.doc() = "FleetPS's worker API (the fleetps package re-exports it; see python/README.md).";
  // FleetPS logs through glog to stderr (a fleetrun worker's log file);
  // torch may have set glog up already in this process.
  if (!google::IsGoogleLoggingInitialized()) {
    google::InitGoogleLogging("fleetps");
    FLAGS_logtostderr = true;
  }
  MakeErrorClasses(m);
  BindJob(m);
  BindCommunicator(m);
  BindProgress(m);
}
