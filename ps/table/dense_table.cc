#include "ps/table/dense_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "comm/byte_io.h"
#include "ps/table/initializer.h"

namespace fleet::ps {
namespace {

// Dense file layout (little-endian), version 1:
//   char[8] "FPSDENSE", u32 version, u32 table_id, u64 dim, u64 begin, u64 end,
//   u32 per_element_slots, u32 row_scalars,
//   f32[end - begin] values, per_element_slots x f32[end - begin], f32[row_scalars].
constexpr std::string_view kDenseMagic = "FPSDENSE";
constexpr uint32_t kDenseFormatVersion = 1;

}  // namespace

Result<std::unique_ptr<DenseTable>> DenseTable::Create(const TableConfig& config, DenseRange range) {
  FLEET_RETURN_IF_ERROR(ValidateTableConfig(config));
  if (config.kind != TableKind::kDense)
    return Status::InvalidArgument("DenseTable needs a dense table config", absl::StrCat("table ", config.id));
  if (range.begin > range.end || range.end > config.dim)
    return Status::InvalidArgument("dense range outside the table",
                                   absl::StrCat("table ", config.id, " [", range.begin, ", ", range.end,
                                                ") of ", config.dim));
  return std::unique_ptr<DenseTable>(new DenseTable(config, range));
}

DenseTable::DenseTable(const TableConfig& config, DenseRange range)
    : config_(config), range_(range), rule_(MakeOptimizerRule(config.optimizer)) {
  values_.resize(range_.size());
  Initializer(config_.initializer).FillDense(range_.begin, values_);
  state_.resize(rule_->state_size(range_.size()));
  rule_->InitState(range_.size(), state_);
}

Status DenseTable::CheckSize(size_t n, const char* what) const {
  if (n == range_.size()) return Status::OK();
  return Status::InvalidArgument(absl::StrCat("table ", config_.id, ": ", what, " has ", n,
                                              " floats, this server holds ", range_.size(), " ([",
                                              range_.begin, ", ", range_.end, "))"));
}

Status DenseTable::Pull(std::span<float> out) const {
  FLEET_RETURN_IF_ERROR(CheckSize(out.size(), "pull buffer"));
  std::lock_guard<std::mutex> l(mu_);
  std::copy(values_.begin(), values_.end(), out.begin());
  return Status::OK();
}

Status DenseTable::PushGrad(std::span<const float> grad) {
  FLEET_RETURN_IF_ERROR(CheckSize(grad.size(), "gradient"));
  std::lock_guard<std::mutex> l(mu_);
  rule_->Update(values_, state_, grad);
  return Status::OK();
}

Status DenseTable::PushDelta(std::span<const float> delta) {
  FLEET_RETURN_IF_ERROR(CheckSize(delta.size(), "delta"));
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < values_.size(); ++i) values_[i] += delta[i];
  return Status::OK();
}

Status DenseTable::Assign(std::span<const float> values) {
  FLEET_RETURN_IF_ERROR(CheckSize(values.size(), "values"));
  std::lock_guard<std::mutex> l(mu_);
  std::copy(values.begin(), values.end(), values_.begin());
  return Status::OK();
}

uint64_t DenseTable::memory_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return (values_.size() + state_.size()) * sizeof(float);
}

std::string DenseTable::Serialize() const {
  std::string out;
  ByteWriter w(&out);
  std::lock_guard<std::mutex> l(mu_);
  w.PutBytes(kDenseMagic);
  w.Put<uint32_t>(kDenseFormatVersion);
  w.Put<uint32_t>(config_.id);
  w.Put<uint64_t>(config_.dim);
  w.Put<uint64_t>(range_.begin);
  w.Put<uint64_t>(range_.end);
  w.Put<uint32_t>(static_cast<uint32_t>(rule_->per_element_slots()));
  w.Put<uint32_t>(static_cast<uint32_t>(rule_->row_scalars()));
  w.PutFloats(values_);
  w.PutFloats(state_);
  return out;
}

Status DenseTable::ApplyFile(std::string_view image, std::string_view file, uint64_t* covered) {
  ByteReader r(image);
  auto bad = [&](const std::string& what) {
    return Status::Corruption(absl::StrCat(what, " at byte ", r.position()), file);
  };
  std::string_view magic;
  uint32_t version, table_id, slots, scalars;
  uint64_t dim, begin, end;
  if (!r.GetBytes(kDenseMagic.size(), &magic) || magic != kDenseMagic) return bad("not a dense file (bad magic)");
  if (!r.Get(&version) || !r.Get(&table_id) || !r.Get(&dim) || !r.Get(&begin) || !r.Get(&end) || !r.Get(&slots) ||
      !r.Get(&scalars))
    return bad("truncated dense header");
  if (version != kDenseFormatVersion) return bad(absl::StrCat("unsupported dense format version ", version));
  if (table_id != config_.id) return bad(absl::StrCat("dense file of table ", table_id, ", expected ", config_.id));
  if (dim != config_.dim) return bad(absl::StrCat("dense file of dim ", dim, ", table has ", config_.dim));
  if (begin > end || end > dim) return bad(absl::StrCat("bad range [", begin, ", ", end, ")"));
  if (slots != static_cast<uint32_t>(rule_->per_element_slots()) ||
      scalars != static_cast<uint32_t>(rule_->row_scalars()))
    return bad("optimizer state layout differs from the table's");
  const uint64_t n = end - begin;
  if (r.remaining() != (n * (1 + slots) + scalars) * sizeof(float))
    return bad(absl::StrCat("size ", image.size(), " does not match range and state"));
  // Elements of the file that fall in our range: [lo, hi).
  const uint64_t lo = std::max(begin, range_.begin), hi = std::min(end, range_.end);
  std::lock_guard<std::mutex> l(mu_);
  const size_t body = r.position();
  auto floats_at = [&](size_t float_index) {
    return reinterpret_cast<const char*>(image.data()) + body + float_index * sizeof(float);
  };
  const uint64_t mine = range_.size();
  if (lo < hi) {
    const size_t count = hi - lo;
    // Slot 0 is the values, slots 1..k the per-element state.
    for (uint32_t s = 0; s <= slots; ++s) {
      float* dst = s == 0 ? values_.data() : state_.data() + (s - 1) * mine;
      std::memcpy(dst + (lo - range_.begin), floats_at(s * n + (lo - begin)), count * sizeof(float));
    }
    *covered = count;
  } else {
    *covered = 0;
  }
  // Row scalars (Adam's step powers) are the same on every server in
  // lockstep training; take them from any file.
  if (scalars > 0 && (lo < hi || mine == 0))
    std::memcpy(state_.data() + slots * mine, floats_at((1 + slots) * n), scalars * sizeof(float));
  return Status::OK();
}

std::unique_ptr<DenseTable> DenseTable::NewEmptyLike() const {
  return std::unique_ptr<DenseTable>(new DenseTable(config_, range_));
}

void DenseTable::SwapValues(DenseTable& staging) {
  std::scoped_lock l(mu_, staging.mu_);
  values_.swap(staging.values_);
  state_.swap(staging.state_);
}

}  // namespace fleet::ps
