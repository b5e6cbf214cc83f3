#include "collective/sharded_adamw.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "comm/byte_io.h"
#include "comm/checksum.h"
#include "comm/file_system.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/backend_factory.h"

namespace fleet::trainer::collective {
namespace {

constexpr std::string_view kStateMagic = "FLTADAMW";
constexpr uint32_t kStateVersion = 1;

// A state file's header: the arena ranges it holds, in file order.
struct StateHeader {
  uint64_t arena_size = 0;
  int64_t step = 0;
  double loss_scale = 1.0;  // float16's dynamic loss scale and its clean run
  int64_t loss_scale_clean_steps = 0;
  std::vector<std::pair<uint64_t, uint64_t>> pieces;  // [begin, end)
  uint64_t data_offset = 0;                           // bytes before the first piece's data
};

// A state file's header: the magic, the header fields, the piece table and
// the CRC-32 of all of them. `file` is the whole file.
Result<StateHeader> ParseStateHeader(std::string_view file, const std::string& path) {
  const auto truncated = [&](const char* what) {
    return Status::Corruption(absl::StrCat("optimizer state file is truncated in its ", what), path);
  };
  ByteReader r(file);
  std::string_view magic;
  uint32_t version = 0, pieces = 0, crc = 0;
  StateHeader h;
  if (!r.GetBytes(kStateMagic.size(), &magic)) return truncated("magic");
  if (magic != kStateMagic) return Status::Corruption("not an optimizer state file (bad magic)", path);
  if (!r.Get(&version)) return truncated("header");
  if (version != kStateVersion) {
    return Status::Corruption(absl::StrCat("unknown optimizer state version ", version), path);
  }
  if (!r.Get(&h.arena_size) || !r.Get(&h.step) || !r.Get(&h.loss_scale) ||
      !r.Get(&h.loss_scale_clean_steps) || !r.Get(&pieces)) {
    return truncated("header");
  }
  if (pieces > (1u << 24)) {
    return Status::Corruption(absl::StrCat("implausible piece count ", pieces), path);
  }
  if (pieces > r.remaining() / (2 * sizeof(uint64_t))) return truncated("piece table");
  h.pieces.resize(pieces);
  for (auto& [begin, end] : h.pieces) {
    if (!r.Get(&begin) || !r.Get(&end)) return truncated("piece table");
  }
  const size_t header_end = r.position();
  if (!r.Get(&crc)) return truncated("header checksum");
  if (crc != Crc32(file.substr(0, header_end))) {
    return Status::Corruption("optimizer state header checksum mismatch", path);
  }
  for (const auto& [begin, end] : h.pieces) {
    if (begin > end || end > h.arena_size) {
      return Status::Corruption(
          absl::StrCat("piece [", begin, ", ", end, ") outside the arena of ", h.arena_size), path);
    }
  }
  h.data_offset = r.position();
  return h;
}

}  // namespace

// What the params file records as the optimizer: its name and the step.
// The moments live in the state files.
class ShardedAdamWUpdater::ParamsFileOptimizer final : public Optimizer {
 public:
  explicit ParamsFileOptimizer(ParamArena* arena) : Optimizer(arena) {}
  std::string_view name() const override { return "adamw"; }
  void Step() override { ++step_; }
  float learning_rate() const override { return 0.0f; }
  void set_learning_rate(float) override {}
};

Result<std::unique_ptr<ShardedAdamWUpdater>> ShardedAdamWUpdater::Create(
    const DataParallelGroups& groups, ParamArena* arena, GptKernels* kernels,
    const AdamWConfig& config, float lr, const ShardedAdamWOptions& options,
    const std::string& name) {
  CHECK(arena != nullptr && kernels != nullptr);
  const ShardingOptions& sharding = options.sharding;
  const int world = groups.world ? groups.world->size() : 1;
  // Degree 1: plain data parallel over the world; the world's size: the
  // world is the sharding group; between: the caller's sharding and
  // data-parallel groups.
  const int shard_size = groups.shard ? groups.shard->size() : world;
  if (sharding.degree < 1 || world % sharding.degree != 0 ||
      (sharding.degree > 1 && shard_size != sharding.degree) ||
      (sharding.degree > 1 && sharding.degree < world &&
       (groups.replica == nullptr || groups.replica->size() != world / sharding.degree))) {
    return Status::InvalidArgument(
        absl::StrCat("sharding degree must divide the number of ranks (", world,
                     ") and match the sharding group (", shard_size,
                     " ranks) and data-parallel group given (",
                     groups.replica ? groups.replica->size() : 0, " ranks)"),
        absl::StrCat(sharding.degree));
  }
  if (sharding.degree > 1 && (sharding.stage < 1 || sharding.stage > 3)) {
    return Status::InvalidArgument("sharding stage must be 1, 2 or 3",
                                   absl::StrCat(sharding.stage));
  }
  const bool stage3 = sharding.degree > 1 && sharding.stage == 3;
  if (stage3 && options.param_units.empty()) {
    return Status::InvalidArgument(
        "sharding stage 3 needs the model's parameter units (ShardedAdamWOptions::param_units)");
  }
  std::optional<DynamicLossScaler> scaler;
  if (options.loss_scaler) {
    FLEET_ASSIGN_OR_RETURN(DynamicLossScaler created,
                           DynamicLossScaler::Create(*options.loss_scaler));
    scaler = created;
  }
  DataParallelOptions dp_options = options.data_parallel;
  dp_options.shard_gradients = sharding.degree > 1;
  dp_options.release_reduced_gradients = sharding.degree > 1 && sharding.stage >= 2;
  dp_options.shard_params = stage3;
  if (stage3) dp_options.units = options.param_units;
  const DataParallelGroups dp_groups =
      sharding.degree > 1 ? groups : DataParallelGroups{groups.world, nullptr, nullptr};
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<DataParallel> dp,
                         DataParallel::Create(dp_groups, arena, dp_options));
  GptCompute host;
  if (options.tensor_parallel != nullptr &&
      options.tensor_parallel->local_size[options.tensor_parallel->rank] != arena->size()) {
    return Status::InvalidArgument("the tensor-parallel split does not describe this arena");
  }
  if (options.offload) {
    if (options.offload_threads < 1) {
      return Status::InvalidArgument("offload needs at least 1 optimizer thread",
                                     absl::StrCat(options.offload_threads));
    }
    FLEET_ASSIGN_OR_RETURN(host,
                           CreateGptCompute("cpu", Precision::kFp32, options.offload_threads));
  }
  return std::unique_ptr<ShardedAdamWUpdater>(
      new ShardedAdamWUpdater(arena, kernels, config, lr, sharding, std::move(dp),
                              std::move(scaler), name, options.tensor_parallel, std::move(host),
                              options.file_system != nullptr ? options.file_system : DefaultFileSystem()));
}

ShardedAdamWUpdater::ShardedAdamWUpdater(ParamArena* arena, GptKernels* kernels,
                                         const AdamWConfig& config, float lr,
                                         const ShardingOptions& sharding,
                                         std::unique_ptr<DataParallel> dp,
                                         std::optional<DynamicLossScaler> scaler,
                                         const std::string& name, const ParamSplit* split,
                                         GptCompute host, FileSystem* fs)
    : arena_(arena),
      kernels_(kernels),
      rule_(arena->table(), config),
      sharding_(sharding),
      dp_(std::move(dp)),
      name_(name),
      split_(split),
      fs_(fs),
      host_(std::move(host)),
      state_floats_(dp_->sharded() ? dp_->shard_floats() : arena->size()),
      m_(state_backend()->AllocateFloats(state_floats_)),
      v_(state_backend()->AllocateFloats(state_floats_)),
      master_(offloaded() ? state_backend()->AllocateFloats(state_floats_) : nullptr),
      host_grads_(offloaded() ? state_backend()->AllocateFloats(state_floats_) : nullptr),
      params_file_(std::make_unique<ParamsFileOptimizer>(arena)),
      updates_on_reduction_(offloaded() && dp_->world_size() > 1 &&
                            rule_.config().clip_norm == 0.0f && !scaler.has_value()),
      lr_(lr),
      scaler_(std::move(scaler)) {
  if (offloaded()) dp_->set_on_bucket_reduced([this](size_t b) { OnBucketReduced(b); });
}

void ShardedAdamWUpdater::OnBucketReduced(size_t b) {
  // The bucket's reduced gradients go to the host as soon as they are
  // final, on the thread that reduced them, while backward goes on.
  const GradPiece piece = dp_->ReducedPiece(b);
  arena_->backend()->CopyToHost(host_grads_.get() + piece.offset,
                                dp_->reduced_grads() + piece.offset, piece.size() * sizeof(float));
  if (!updates_on_reduction_) return;
  // Buckets are reduced one at a time, so this is the last one when every
  // other one's update has run.
  if (updated_this_step_ + 1 == dp_->buckets().size()) {
    updates_before_last_reduction_ = updated_this_step_;
  }
  // Nothing reads this piece's parameters again before Step (see the top of
  // the header), so it is updated now, with the mean gradient and no clip.
  UpdateOffloadedPiece(piece, step() + 1, dp_->reduced_grads_scale());
  ++updated_this_step_;
}

void ShardedAdamWUpdater::UpdateOffloadedPiece(const GradPiece& piece, int64_t t,
                                               float grad_scale) {
  float* master = master_.get() + piece.offset;
  rule_.Update(host_.kernels.get(), master, host_grads_.get() + piece.offset,
               m_.get() + piece.offset, v_.get() + piece.offset, piece.begin, piece.end, t, lr_,
               grad_scale);
  arena_->backend()->CopyFromHost(DeviceParams(piece), master, piece.size() * sizeof(float));
}

ShardedAdamWUpdater::~ShardedAdamWUpdater() = default;

int64_t ShardedAdamWUpdater::step() const { return params_file_->step(); }

GradReadyFn ShardedAdamWUpdater::grad_ready(bool last_micro_batch) {
  return last_micro_batch ? dp_->grad_ready() : GradReadyFn();
}

void ShardedAdamWUpdater::BeginStep(float lr) {
  dp_->ZeroGrad();
  lr_ = lr;
  updated_this_step_ = 0;
  updates_before_last_reduction_ = 0;
}

Status ShardedAdamWUpdater::Step() {
  // Also waits for the updates running on reduction (they are part of each
  // bucket's reduction task).
  FLEET_RETURN_IF_ERROR(dp_->FinishGradients());
  if (updates_on_reduction_) {
    CHECK_EQ(updated_this_step_, dp_->buckets().size())
        << "a bucket's reduction finished without its update";
    return FinishStep();
  }
  const float* grads = dp_->reduced_grads();
  // What turns the reduced gradients into the mean gradient of the step.
  float scale = dp_->reduced_grads_scale();
  float clip = 1.0f;
  if (rule_.config().clip_norm > 0.0f || scaler_) {
    double squares = 0.0;
    if (split_ == nullptr) {
      for (const GradPiece& piece : dp_->pieces()) {
        squares += kernels_->SumOfSquares(grads + piece.offset, piece.size());
      }
    } else {
      // Each part's own tensors; the replicated ones once, in their owner.
      for (const StateRun& run : StateRuns(/*to_save=*/true)) {
        squares += kernels_->SumOfSquares(grads + run.offset, run.end - run.begin);
      }
    }
    if (sharded()) {
      float sum = static_cast<float>(squares);
      FLEET_RETURN_IF_ERROR(dp_->SumOverShards(std::span<float>(&sum, 1)));
      squares = sum;
    }
    if (split_ != nullptr) {
      float sum = static_cast<float>(squares);
      FLEET_RETURN_IF_ERROR(SumOverModelParallel(&sum));
      squares = sum;
    }
    squares *= double{scale} * scale;
    if (scaler_) {
      // Every rank sees the same sum, so every rank skips alike.
      const LossScaleDecision decision = scaler_->Update(squares);
      if (!decision.apply) {
        ++skipped_steps_;
        LOG(WARNING) << "float16 gradients overflowed at step " << step() + 1
                     << ": step skipped, loss scale now " << scaler_->scale();
        params_file_->Step();
        return Status::OK();
      }
      scale *= decision.inv_scale;
      squares = decision.grad_sum_of_squares;
    }
    if (rule_.config().clip_norm > 0.0f) {
      last_grad_norm_ = std::sqrt(squares);
      clip = ClipFactor(last_grad_norm_, rule_.config().clip_norm);
    }
  }
  const int64_t t = step() + 1;
  for (const GradPiece& piece : dp_->pieces()) {
    if (!offloaded()) {
      rule_.Update(kernels_, DeviceParams(piece), grads + piece.offset, m_.get() + piece.offset,
                   v_.get() + piece.offset, piece.begin, piece.end, t, lr_, scale * clip);
      continue;
    }
    // The gradients reached the host as their buckets were reduced (one
    // process: now).
    if (dp_->world_size() == 1) {
      arena_->backend()->CopyToHost(host_grads_.get() + piece.offset, grads + piece.offset,
                                    piece.size() * sizeof(float));
    }
    UpdateOffloadedPiece(piece, t, scale * clip);
  }
  return FinishStep();
}

Status ShardedAdamWUpdater::FinishStep() {
  FLEET_RETURN_IF_ERROR(dp_->GatherParams());
  params_file_->Step();
  if (dp_->measures_resident()) {
    measured_between_steps_ = std::max(measured_between_steps_, dp_->ResidentBytesNow());
  }
  return Status::OK();
}

float* ShardedAdamWUpdater::DeviceParams(const GradPiece& piece) const {
  // Stage 3 keeps its pieces of the parameters beside the gradients'.
  return dp_->shards_params() ? dp_->shard_params() + piece.offset
                              : arena_->params().data() + piece.begin;
}

void ShardedAdamWUpdater::InitMaster() {
  if (!offloaded()) return;
  for (const GradPiece& piece : dp_->pieces()) {
    arena_->backend()->CopyToHost(master_.get() + piece.offset, DeviceParams(piece),
                                  piece.size() * sizeof(float));
  }
}

std::string ShardedAdamWUpdater::StateFileName(int64_t step, int rank, int files) const {
  return absl::StrCat(name_, ".adamw.s", step, ".", rank, "-of-", files);
}

int ShardedAdamWUpdater::state_file() const {
  return (split_ ? split_->rank : 0) * dp_->shard_size() + dp_->shard_rank();
}

size_t ShardedAdamWUpdater::CheckpointFloats() const {
  return split_ ? split_->whole_size : arena_->size();
}

std::vector<ShardedAdamWUpdater::StateRun> ShardedAdamWUpdater::StateRuns(bool to_save) const {
  std::vector<StateRun> runs;
  for (const GradPiece& piece : dp_->pieces()) {
    if (split_ == nullptr) {
      runs.push_back({piece.begin, piece.end, piece.offset});
      continue;
    }
    // The segments overlapping the piece (both in arena order).
    const std::vector<ArenaSegment>& segments = split_->mine();
    auto it = std::upper_bound(
        segments.begin(), segments.end(), piece.begin,
        [](size_t at, const ArenaSegment& seg) { return at < seg.local + seg.size; });
    for (; it != segments.end() && it->local < piece.end; ++it) {
      if (to_save && it->replicated) continue;  // another part owns it
      const size_t lo = std::max(piece.begin, it->local);
      const size_t hi = std::min(piece.end, it->local + it->size);
      if (lo >= hi) continue;
      runs.push_back({it->whole + (lo - it->local), it->whole + (hi - it->local),
                      piece.offset + (lo - piece.begin)});
    }
  }
  return runs;
}

Status ShardedAdamWUpdater::SumOverModelParallel(float* value) {
  if (split_ == nullptr || split_->group == nullptr) return Status::OK();
  Backend* backend = arena_->backend();
  std::shared_ptr<float> buffer = backend->AllocateFloats(1);
  backend->CopyFromHost(buffer.get(), value, sizeof(float));
  FLEET_RETURN_IF_ERROR(
      split_->group->AllReduce(buffer.get(), 1, ReduceOp::kSum)
          .WithContext("summing the gradient norm over the tensor-parallel group"));
  backend->CopyToHost(value, buffer.get(), sizeof(float));
  return Status::OK();
}

Status ShardedAdamWUpdater::SaveParams(const std::filesystem::path& path) {
  if (split_ == nullptr) {
    return dp_->rank() == 0 ? SaveCheckpoint(path.string(), *arena_, *params_file_, fs_) : Status::OK();
  }
  // The first data-parallel rank of every part gathers the whole model over
  // the model-parallel group; part 0 writes it.
  if (dp_->rank() != 0) return Status::OK();
  std::vector<float> whole;
  FLEET_RETURN_IF_ERROR(
      GatherWholeParams(*split_, arena_->params().data(), arena_->backend(), &whole));
  if (split_->rank != 0) return Status::OK();
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<Backend> cpu, CreateBackend(Device{}, nullptr));
  FLEET_ASSIGN_OR_RETURN(ParamArena host, ParamArena::Create(split_->whole_table, cpu.get()));
  FLEET_RETURN_IF_ERROR(host.ParamsFromHost(whole));
  return SaveCheckpoint(path.string(), host, *params_file_, fs_);
}

Status ShardedAdamWUpdater::LoadParams(const std::filesystem::path& path) {
  if (split_ == nullptr) return LoadCheckpoint(path.string(), arena_, params_file_.get(), fs_);
  // Every rank reads the whole model and keeps its part.
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<Backend> cpu, CreateBackend(Device{}, nullptr));
  FLEET_ASSIGN_OR_RETURN(ParamArena host, ParamArena::Create(split_->whole_table, cpu.get()));
  FLEET_RETURN_IF_ERROR(LoadCheckpoint(path.string(), &host, params_file_.get(), fs_));
  std::vector<float> part(arena_->size());
  TakePart(*split_, std::span<const float>(host.params().data(), host.size()), part);
  return arena_->ParamsFromHost(part);
}

bool ShardedAdamWUpdater::HasCheckpoint(const std::filesystem::path& dir) const {
  if (dir.empty()) return false;
  Result<std::vector<std::string>> names = fs_->ListDir(dir.string());
  return names.ok() && std::find(names->begin(), names->end(), name_ + ".ckpt") != names->end();
}

Status ShardedAdamWUpdater::SaveState(const std::filesystem::path& dir) const {
  const std::filesystem::path path = dir / StateFileName(step(), state_file(), state_files());
  const std::vector<StateRun> runs = StateRuns(/*to_save=*/true);
  std::string header(kStateMagic);
  ByteWriter w(&header);
  w.Put<uint32_t>(kStateVersion);
  w.Put<uint64_t>(CheckpointFloats());
  w.Put<int64_t>(step());
  w.Put<double>(scaler_ ? double{scaler_->scale()} : 1.0);
  w.Put<int64_t>(scaler_ ? scaler_->clean_steps() : int64_t{0});
  w.Put<uint32_t>(static_cast<uint32_t>(runs.size()));
  for (const StateRun& run : runs) {
    w.Put<uint64_t>(run.begin);
    w.Put<uint64_t>(run.end);
  }
  w.Put<uint32_t>(Crc32(header));
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out,
                         AtomicFileWriter::Create(path.string(), fs_));
  FLEET_RETURN_IF_ERROR(out->Append(header));
  Backend* backend = state_backend();
  // Host state is written in place; a device's is copied out a piece at a
  // time.
  const bool on_host = backend->device().is_cpu();
  std::vector<float> host;
  for (const StateRun& run : runs) {
    // m then v of the run, then the checksum of both.
    uint32_t crc = 0;
    for (const float* state : {m_.get(), v_.get()}) {
      const float* src = state + run.offset;
      const size_t floats = run.end - run.begin;
      if (!on_host) {
        host.resize(floats);
        backend->CopyToHost(host.data(), src, floats * sizeof(float));
        src = host.data();
      }
      const std::string_view bytes(reinterpret_cast<const char*>(src), floats * sizeof(float));
      crc = Crc32Extend(crc, bytes.data(), bytes.size());
      FLEET_RETURN_IF_ERROR(out->Append(bytes));
    }
    std::string tail;
    ByteWriter(&tail).Put<uint32_t>(crc);
    FLEET_RETURN_IF_ERROR(out->Append(tail));
  }
  return out->Commit();
}

Status ShardedAdamWUpdater::Save(const std::filesystem::path& dir) {
  // State files first, every rank its own; the params file, which names
  // their step, last: until it is renamed the previous checkpoint stands.
  Status state = writes_state() ? SaveState(dir) : Status::OK();
  FLEET_RETURN_IF_ERROR(AgreeOnSuccess(*this, state, "saving the optimizer state"));
  // Stage 3: rank 0 writes from a whole arena, which every rank helps gather.
  FLEET_RETURN_IF_ERROR(dp_->GatherAllParams());
  Status params = SaveParams(dir / (name_ + ".ckpt"));
  dp_->ReleaseAllParams();
  FLEET_RETURN_IF_ERROR(AgreeOnSuccess(*this, params, "saving the parameters"));
  if (writes_state()) RemoveOldState(dir);
  return Status::OK();
}

void ShardedAdamWUpdater::RemoveOldState(const std::filesystem::path& dir) const {
  const std::string current = StateFileName(step(), state_file(), state_files());
  const std::string prefix = name_ + ".adamw.s";
  const std::string mine = absl::StrCat(".", state_file(), "-of-");
  Result<std::vector<std::string>> names = fs_->ListDir(dir.string());
  if (!names.ok()) return;  // old files stay; the next save tries again
  for (const std::string& file : *names) {
    // Only files this rank wrote under this degree's naming: the other
    // ranks remove their own.
    if (file != current && file.starts_with(prefix) && file.find(mine) != std::string::npos) {
      (void)fs_->Remove((dir / file).string());
    }
  }
}

Status ShardedAdamWUpdater::LoadState(const std::filesystem::path& dir, int64_t step) {
  // Which degree saved it: the count in "<name>.adamw.s<step>.0-of-<D>".
  const std::string first = absl::StrCat(name_, ".adamw.s", step, ".0-of-");
  int files = 0;
  Result<std::vector<std::string>> names = fs_->ListDir(dir.string());
  if (!names.ok()) {
    return Status::IOError("cannot list the checkpoint directory: " + names.status().message(),
                           dir.string());
  }
  for (const std::string& file : *names) {
    if (file.starts_with(first) && absl::SimpleAtoi(file.substr(first.size()), &files)) break;
  }
  if (files < 1) {
    return Status::NotFound(absl::StrCat("no optimizer state of step ", step,
                                         " beside the parameters (", first, "N missing)"),
                            dir.string());
  }
  std::vector<float> m(state_floats_), v(state_floats_);
  const std::vector<StateRun> runs = StateRuns(/*to_save=*/false);
  std::vector<size_t> filled(runs.size(), 0);
  for (int r = 0; r < files; ++r) {
    const std::string path = (dir / StateFileName(step, r, files)).string();
    Result<std::string> read = fs_->ReadFile(path);
    if (!read.ok()) {
      if (read.status().IsNotFound()) return Status::NotFound("cannot open optimizer state file", path);
      return read.status();
    }
    const std::string_view file = *read;
    FLEET_ASSIGN_OR_RETURN(StateHeader h, ParseStateHeader(file, path));
    if (h.arena_size != CheckpointFloats() || h.step != step) {
      return Status::FailedPrecondition(
          absl::StrCat("optimizer state of ", h.arena_size, " parameters at step ", h.step,
                       ", but the model has ", CheckpointFloats(), " and the checkpoint step ",
                       step),
          path);
    }
    if (scaler_ && r == 0) {
      // A checkpoint of a float32 or bfloat16 run (scale 1) starts float16's
      // scaling afresh.
      if (h.loss_scale != 1.0 || h.loss_scale_clean_steps != 0) {
        FLEET_RETURN_IF_ERROR(scaler_->Restore(h.loss_scale, h.loss_scale_clean_steps)
                                  .WithContext(absl::StrCat("loss scale in ", path)));
      }
    }
    uint64_t at = h.data_offset;
    for (const auto& [begin, end] : h.pieces) {
      const size_t len = end - begin;
      const uint64_t bytes = 2 * len * sizeof(float) + sizeof(uint32_t);
      bool needed = false;
      for (const StateRun& mine : runs) {
        needed |= std::max<size_t>(mine.begin, begin) < std::min<size_t>(mine.end, end);
      }
      if (needed) {
        ByteReader piece(file.substr(std::min<uint64_t>(at, file.size())));
        std::string_view block;
        uint32_t crc = 0;
        if (!piece.GetBytes(2 * len * sizeof(float), &block)) {
          return Status::Corruption("optimizer state file is truncated in its data", path);
        }
        if (!piece.Get(&crc)) {
          return Status::Corruption("optimizer state file is truncated in its data checksum", path);
        }
        if (crc != Crc32(block)) {
          return Status::Corruption(
              absl::StrCat("checksum mismatch in the moments of [", begin, ", ", end, ")"), path);
        }
        // The block is m then v of [begin, end).
        const char* block_m = block.data();
        const char* block_v = block.data() + len * sizeof(float);
        for (size_t p = 0; p < runs.size(); ++p) {
          const StateRun& mine = runs[p];
          const size_t lo = std::max<size_t>(mine.begin, begin);
          const size_t hi = std::min<size_t>(mine.end, end);
          if (lo >= hi) continue;
          const size_t bytes_in = (hi - lo) * sizeof(float);
          std::memcpy(m.data() + mine.offset + (lo - mine.begin), block_m + (lo - begin) * sizeof(float), bytes_in);
          std::memcpy(v.data() + mine.offset + (lo - mine.begin), block_v + (lo - begin) * sizeof(float), bytes_in);
          filled[p] += hi - lo;
        }
      }
      at += bytes;
    }
  }
  for (size_t p = 0; p < filled.size(); ++p) {
    if (filled[p] != runs[p].end - runs[p].begin) {
      return Status::Corruption(
          absl::StrCat("the state files of step ", step, " do not cover parameters [",
                       runs[p].begin, ", ", runs[p].end, ")"),
          dir.string());
    }
  }
  Backend* backend = state_backend();
  backend->CopyFromHost(m_.get(), m.data(), m.size() * sizeof(float));
  backend->CopyFromHost(v_.get(), v.data(), v.size() * sizeof(float));
  return Status::OK();
}

Status ShardedAdamWUpdater::Resume(const std::filesystem::path& dir) {
  // Whether there is a checkpoint is rank 0's view, shared, so that every
  // rank takes the same branch.
  float found = dp_->rank() == 0 && HasCheckpoint(dir) ? 1.0f : 0.0f;
  FLEET_RETURN_IF_ERROR(dp_->SumOverRanks(std::span<float>(&found, 1)));
  if (found == 0) {
    // A fresh run: every rank starts from rank 0's parameters.
    FLEET_RETURN_IF_ERROR(dp_->SyncFromRoot(nullptr));
    dp_->KeepOnlyShards();
    InitMaster();
    return Status::OK();
  }
  const std::string params_path = (dir / (name_ + ".ckpt")).string();
  Status load = LoadParams(params_path);
  if (load.ok()) load = LoadState(dir, params_file_->step());
  FLEET_RETURN_IF_ERROR(AgreeOnSuccess(*this, load, "loading the checkpoint"));
  dp_->KeepOnlyShards();
  InitMaster();
  LOG(INFO) << "resumed from " << params_path << " at step " << step();
  return Status::OK();
}

UpdaterMemory ShardedAdamWUpdater::memory() const {
  const size_t full = arena_->size() * sizeof(float);
  const size_t shard = dp_->shard_floats() * sizeof(float);
  UpdaterMemory memory;
  // Stage 2 on the CPU discards the full gradients after each reduction;
  // elsewhere they stay allocated beside the shard.
  const bool discarded = sharded() && sharding_.stage >= 2 && arena_->backend()->device().is_cpu();
  memory.gradient_bytes = discarded ? shard : full + shard;
  // Offloaded moments are on the host, with the master weights and gradients.
  memory.optimizer_bytes = offloaded() ? 0 : 2 * state_floats_ * sizeof(float);
  memory.host_bytes = offloaded() ? 4 * state_floats_ * sizeof(float) : 0;
  memory.param_bytes = dp_->shards_params() ? shard : full;
  if (dp_->measures_resident()) {
    memory.measured_peak_bytes = dp_->resident_high_water() + memory.optimizer_bytes;
    memory.measured_between_steps_bytes = measured_between_steps_ + memory.optimizer_bytes;
  }
  return memory;
}

}  // namespace fleet::trainer::collective
