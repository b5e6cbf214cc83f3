#include "data/ctr_reader.h"

#include <glog/logging.h>

#include <charconv>
#include <cmath>

namespace fleet::data {
namespace {

uint64_t Fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

// Quotes at most 32 bytes of a field for an error message.
std::string Quote(std::string_view field) {
  constexpr size_t kMax = 32;
  std::string s = "'";
  s.append(field.substr(0, kMax));
  if (field.size() > kMax) s.append("...");
  s.append("'");
  return s;
}

Status BadField(const char* kind, int index, std::string_view field, const char* expected) {
  return Status::InvalidArgument(std::string(kind) + std::to_string(index) + " " + Quote(field) +
                                 " is not " + expected);
}

}  // namespace

uint64_t CriteoKey(int slot, uint64_t value) {
  const uint64_t seed = Fmix64(0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(slot + 1));
  return Fmix64(value ^ seed);
}

Status ParseCriteoLine(std::string_view line, CtrSample* out, uint64_t field_buckets) {
  std::array<std::string_view, kCriteoFields> f;
  size_t n = 0;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    const std::string_view field =
        line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start);
    if (n < f.size()) f[n] = field;
    ++n;
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  if (line.empty()) return Status::InvalidArgument("empty line");
  if (n != static_cast<size_t>(kCriteoFields)) {
    return Status::InvalidArgument("expected " + std::to_string(kCriteoFields) +
                                   " tab-separated fields, found " + std::to_string(n));
  }
  if (f[0] == "0") {
    out->label = 0;
  } else if (f[0] == "1") {
    out->label = 1;
  } else {
    return Status::InvalidArgument("label " + Quote(f[0]) + " is not 0 or 1");
  }
  for (int i = 0; i < kCriteoDense; ++i) {
    const std::string_view s = f[1 + i];
    int64_t x = 0;
    if (!s.empty()) {
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
      if (ec != std::errc() || end != s.data() + s.size()) {
        return BadField("integer feature I", i + 1, s, "a 64-bit decimal integer");
      }
    }
    out->dense[i] = x > 0 ? static_cast<float>(std::log1p(static_cast<double>(x))) : 0.0f;
  }
  for (int slot = 0; slot < kCriteoSlots; ++slot) {
    const std::string_view s = f[1 + kCriteoDense + slot];
    if (s.empty()) {
      out->keys[slot] =
          field_buckets == 0 ? CriteoMissingKey(slot) : FieldTableKey(slot, field_buckets);
      continue;
    }
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
    if (ec != std::errc() || end != s.data() + s.size()) {
      return BadField("categorical feature C", slot + 1, s, "hex of at most 16 digits");
    }
    out->keys[slot] =
        field_buckets == 0 ? CriteoKey(slot, v) : FieldTableKey(slot, Fmix64(v) % field_buckets);
  }
  return Status::OK();
}

void CtrBatch::Clear() {
  labels.clear();
  dense.clear();
  for (SlotKeys& s : slots) {
    s.keys.clear();
    s.offsets.assign(1, 0);
  }
}

void CtrBatch::Append(const CtrSample& sample) {
  labels.push_back(sample.label);
  dense.insert(dense.end(), sample.dense.begin(), sample.dense.end());
  for (int slot = 0; slot < kCriteoSlots; ++slot) {
    SlotKeys& s = slots[slot];
    s.keys.push_back(sample.keys[slot]);
    s.offsets.push_back(static_cast<uint32_t>(s.keys.size()));
  }
}

CtrReader::CtrReader(std::unique_ptr<ShardedLineReader> lines, const CtrReaderOptions& options)
    : options_(options), lines_(std::move(lines)) {}

Result<std::unique_ptr<CtrReader>> CtrReader::Open(std::vector<std::string> files,
                                                   const CtrReaderOptions& options) {
  if (options.batch_size < 1) {
    return Status::InvalidArgument("batch_size must be >= 1, got " +
                                   std::to_string(options.batch_size));
  }
  if (options.field_buckets > kMaxFieldBuckets) {
    return Status::InvalidArgument("field_buckets must be <= " + std::to_string(kMaxFieldBuckets) +
                                   ", got " + std::to_string(options.field_buckets));
  }
  FLEET_ASSIGN_OR_RETURN(
      auto lines, ShardedLineReader::Create(std::move(files), options.rank, options.world_size));
  return std::unique_ptr<CtrReader>(new CtrReader(std::move(lines), options));
}

void CtrReader::Rewind() {
  lines_->Rewind();
  epoch_lines_ = 0;
  epoch_malformed_ = 0;
}

void CtrReader::NoteMalformed(const LineRef& line, const Status& why) {
  ++stats_.malformed;
  ++epoch_malformed_;
  if (stats_.malformed <= options_.max_logged_errors) {
    LOG(WARNING) << "skipping malformed line " << *line.file << ":" << line.line_number << ": "
                 << why.message()
                 << (stats_.malformed == options_.max_logged_errors
                         ? " (further malformed lines are counted, not logged)"
                         : "");
  }
}

Result<size_t> CtrReader::Next(CtrBatch* batch) {
  batch->Clear();
  CtrSample sample;
  LineRef line;
  while (batch->size() < static_cast<size_t>(options_.batch_size)) {
    FLEET_ASSIGN_OR_RETURN(const bool got, lines_->Next(&line));
    if (!got) {
      if (batch->size() == 0 && epoch_malformed_ > 0) {
        // One summary per epoch; cleared so a repeated call does not repeat it.
        LOG(WARNING) << "epoch done on worker " << options_.rank << ": skipped " << epoch_malformed_
                     << " malformed of " << epoch_lines_ << " lines";
        epoch_malformed_ = 0;
      }
      break;
    }
    ++stats_.lines;
    ++epoch_lines_;
    const Status st = ParseCriteoLine(line.text, &sample, options_.field_buckets);
    if (!st.ok()) {
      NoteMalformed(line, st);
      continue;
    }
    ++stats_.samples;
    batch->Append(sample);
  }
  return batch->size();
}

}  // namespace fleet::data
