#include "data/megatron_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "comm/byte_io.h"
#include "comm/file_system.h"

namespace fleet::data {

namespace {

constexpr size_t kMagicBytes = 9;

std::string IdxPath(const std::string& prefix) { return prefix + ".idx"; }
std::string BinPath(const std::string& prefix) { return prefix + ".bin"; }

// Megatron's element codes; only the integer types tokens come in.
Result<TokenDtype> DtypeOfCode(uint8_t code, const std::string& path) {
  switch (code) {
    case 4:
      return TokenDtype::kInt32;
    case 5:
      return TokenDtype::kInt64;
    case 8:
      return TokenDtype::kUint16;
    case 1:
    case 2:
    case 3:
      return Status::InvalidArgument(
          absl::StrCat("dtype code ", code,
                       " (8 or 16-bit integers): this reader takes Megatron's token types uint16 "
                       "(8), int32 (4) and int64 (5)"),
          path);
    default:
      return Status::Corruption(absl::StrCat("dtype code ", code, " is not an integer type"),
                                path);
  }
}

uint8_t CodeOfDtype(TokenDtype d) {
  switch (d) {
    case TokenDtype::kUint16:
      return 8;
    case TokenDtype::kInt32:
      return 4;
    case TokenDtype::kInt64:
      return 5;
    case TokenDtype::kUint32:
      break;
  }
  LOG(FATAL) << "no Megatron code for " << TokenDtypeName(d);
}

// numpy's random_interval: a uniform integer in [0, max] by masking 32-bit
// draws to max's bit width and rejecting those above max.
uint64_t RandomInterval(std::mt19937& rng, uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int shift : {1, 2, 4, 8, 16, 32}) mask |= mask >> shift;
  if (max <= 0xffffffffULL) {
    for (;;) {
      const uint64_t v = rng() & mask;
      if (v <= max) return v;
    }
  }
  for (;;) {
    const uint64_t hi = rng();
    const uint64_t v = ((hi << 32) | rng()) & mask;
    if (v <= max) return v;
  }
}

template <typename T>
void Shuffle(std::mt19937& rng, std::span<T> values) {
  for (size_t i = values.size(); i-- > 1;) {
    std::swap(values[i], values[RandomInterval(rng, i)]);
  }
}

}  // namespace

void NumpyShuffle(std::mt19937& rng, std::span<int32_t> values) { Shuffle(rng, values); }
void NumpyShuffle(std::mt19937& rng, std::span<int64_t> values) { Shuffle(rng, values); }

TokenDtype MegatronDtypeFor(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32;
}

// ---------------------------------------------------------------- indexed data

Result<std::shared_ptr<const MegatronIndexedData>> MegatronIndexedData::Open(
    const std::string& prefix) {
  const std::string idx_path = IdxPath(prefix);
  FLEET_ASSIGN_OR_RETURN(std::string idx, DefaultFileSystem()->ReadFile(idx_path));
  ByteReader in(idx);
  std::string_view magic;
  uint64_t version = 0, count = 0, doc_count = 0;
  uint8_t code = 0;
  if (!in.GetBytes(kMagicBytes, &magic) || magic != std::string_view(kMegatronIndexMagic, 9)) {
    return Status::Corruption("no MMIDIDX header: not a Megatron MMapIndexedDataset index",
                              idx_path);
  }
  if (!in.Get(&version) || version != kMegatronIndexVersion) {
    return Status::Corruption(absl::StrCat("index version ", version, ", expected 1"), idx_path);
  }
  if (!in.Get(&code)) return Status::Corruption("truncated before the dtype code", idx_path);
  FLEET_ASSIGN_OR_RETURN(TokenDtype dtype, DtypeOfCode(code, idx_path));
  if (!in.Get(&count) || !in.Get(&doc_count)) {
    return Status::Corruption("truncated before the sequence and document counts", idx_path);
  }
  // The arrays' bytes must be there before anything is allocated for them.
  const uint64_t need = count * 12 + doc_count * 8;
  if (count > in.remaining() / 12 || doc_count > in.remaining() / 8 || need > in.remaining()) {
    return Status::Corruption(absl::StrCat("declares ", count, " sequences and ", doc_count,
                                           " document entries but holds ", in.remaining(),
                                           " bytes after its header"),
                              idx_path);
  }
  std::shared_ptr<MegatronIndexedData> d(new MegatronIndexedData());
  d->prefix_ = prefix;
  d->sizes_.resize(count);
  d->starts_.resize(count);
  d->doc_idx_.resize(doc_count);
  for (uint64_t i = 0; i < count; ++i) {
    int32_t size = 0;
    in.Get(&size);
    if (size < 0) {
      return Status::Corruption(absl::StrCat("sequence ", i, " has size ", size), idx_path);
    }
    d->sizes_[i] = size;
  }
  const std::string bin_path = BinPath(prefix);
  FLEET_ASSIGN_OR_RETURN(TokenArray tokens, OpenRawTokens(bin_path, dtype));
  const int64_t item = static_cast<int64_t>(TokenDtypeSize(dtype));
  for (uint64_t i = 0; i < count; ++i) {
    int64_t pointer = 0;
    in.Get(&pointer);
    if (pointer < 0 || pointer % item != 0 || pointer / item > tokens.size() ||
        d->sizes_[i] > tokens.size() - pointer / item) {
      return Status::Corruption(absl::StrCat("sequence ", i, " at byte ", pointer, " with ",
                                             d->sizes_[i], " tokens lies outside ", bin_path,
                                             " (", tokens.size(), " tokens)"),
                                idx_path);
    }
    d->starts_[i] = pointer / item;
  }
  for (uint64_t i = 0; i < doc_count; ++i) {
    in.Get(&d->doc_idx_[i]);
    const int64_t prev = i == 0 ? 0 : d->doc_idx_[i - 1];
    if (d->doc_idx_[i] < prev || d->doc_idx_[i] > static_cast<int64_t>(count) ||
        (i == 0 && d->doc_idx_[0] != 0)) {
      return Status::Corruption(
          absl::StrCat("document index entry ", i, " is ", d->doc_idx_[i],
                       "; entries must rise from 0 to the sequence count ", count),
          idx_path);
    }
  }
  if (in.remaining() != 0) {
    return Status::Corruption(absl::StrCat(in.remaining(), " bytes after the document index"),
                              idx_path);
  }
  d->tokens_.emplace(std::move(tokens));
  return std::shared_ptr<const MegatronIndexedData>(std::move(d));
}

Status MegatronIndexedData::Read(int64_t seq, int64_t offset, int64_t n, int64_t vocab_size,
                                 int32_t* out) const {
  CHECK(seq >= 0 && seq < num_sequences() && offset >= 0 && n >= 0 && offset + n <= sizes_[seq])
      << seq << " " << offset << "+" << n;
  tokens_->CopyTo(starts_[seq] + offset, n, out);
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] < 0 || out[i] >= vocab_size) {
      return Status::InvalidArgument(
          absl::StrCat("token id ", tokens_->Get(starts_[seq] + offset + i), " (sequence ", seq,
                       ", token ", offset + i, ") is outside the vocabulary [0, ", vocab_size,
                       ") (Model.vocab_size or the data is wrong)"),
          BinPath(prefix_));
    }
  }
  return Status::OK();
}

Status WriteMegatronIndexed(const std::string& prefix, std::span<const int32_t> tokens,
                            std::span<const int64_t> doc_lens, int64_t vocab_size) {
  const TokenDtype dtype = MegatronDtypeFor(vocab_size);
  int64_t total = 0;
  for (int64_t len : doc_lens) {
    if (len < 0 || len > std::numeric_limits<int32_t>::max()) {
      return Status::InvalidArgument(absl::StrCat("a document of ", len, " tokens"), prefix);
    }
    total += len;
  }
  if (total != static_cast<int64_t>(tokens.size())) {
    return Status::InvalidArgument(absl::StrCat("document lengths add up to ", total, " for ",
                                                tokens.size(), " tokens"),
                                   prefix);
  }
  const size_t item = TokenDtypeSize(dtype);
  std::string bin;
  bin.reserve(tokens.size() * item);
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab_size) {
      return Status::InvalidArgument(
          absl::StrCat("token ", t, " outside the vocabulary [0, ", vocab_size, ")"), prefix);
    }
    if (dtype == TokenDtype::kUint16) {
      const uint16_t v = static_cast<uint16_t>(t);
      bin.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      bin.append(reinterpret_cast<const char*>(&t), 4);
    }
  }
  std::string idx_bytes;
  ByteWriter idx(&idx_bytes);
  idx.PutBytes(std::string_view(kMegatronIndexMagic, kMagicBytes));
  idx.Put(kMegatronIndexVersion);
  idx.Put(CodeOfDtype(dtype));
  idx.Put(static_cast<uint64_t>(doc_lens.size()));
  idx.Put(static_cast<uint64_t>(doc_lens.size() + 1));
  for (int64_t len : doc_lens) idx.Put(static_cast<int32_t>(len));
  int64_t pointer = 0;
  for (int64_t len : doc_lens) {
    idx.Put(pointer);
    pointer += len * static_cast<int64_t>(item);
  }
  for (uint64_t i = 0; i <= doc_lens.size(); ++i) idx.Put(static_cast<int64_t>(i));
  // The data before its index: a reader finding the index finds its data.
  FLEET_RETURN_IF_ERROR(WriteFileAtomically(BinPath(prefix), bin));
  return WriteFileAtomically(IdxPath(prefix), idx_bytes);
}

// ---------------------------------------------------------------- samples

Result<std::unique_ptr<MegatronGptSamples>> MegatronGptSamples::Open(
    std::shared_ptr<const MegatronIndexedData> data, const MegatronSamplesOptions& o) {
  CHECK(data != nullptr);
  if (o.seq_len < 1) return Status::InvalidArgument("must be >= 1", "seq_len");
  if (o.vocab_size < 1) return Status::InvalidArgument("must be >= 1", "vocab_size");
  if (o.part < 0 || o.part > 2) return Status::InvalidArgument("must be 0, 1 or 2", "part");
  if (o.num_samples < 1) return Status::InvalidArgument("must be >= 1", "num_samples");
  double sum = 0;
  for (double w : o.split) {
    if (!(w >= 0) || !std::isfinite(w)) {
      return Status::InvalidArgument("weights must be finite and >= 0", "split");
    }
    sum += w;
  }
  if (o.split.empty() || o.split.size() > 3 || sum <= 0) {
    return Status::InvalidArgument("needs 1 to 3 weights, not all 0", "split");
  }
  static const char* kParts[] = {"train", "valid", "test"};
  const auto bounds = SplitBoundaries(o.split, data->num_sequences());
  const int64_t first = bounds[o.part], end = bounds[o.part + 1];
  int64_t tokens_per_epoch = 0;
  for (int64_t d = first; d < end; ++d) tokens_per_epoch += data->size(d);
  // A sample needs seq_len + 1 tokens; consecutive ones share one.
  if (end <= first || tokens_per_epoch <= o.seq_len) {
    return Status::InvalidArgument(
        absl::StrCat("the ", kParts[o.part], " part (documents [", first, ", ", end, ") of ",
                     data->num_sequences(), ") has ", tokens_per_epoch,
                     " tokens; one sample of seq_len ", o.seq_len, " needs ", o.seq_len + 1,
                     " (more data, a shorter sequence or another split)"),
        data->prefix());
  }
  std::unique_ptr<MegatronGptSamples> s(new MegatronGptSamples(std::move(data), o));
  // _num_epochs: enough epochs for num_samples samples.
  int64_t epochs = 0, total = 0;
  do {
    ++epochs;
    total += tokens_per_epoch;
  } while ((total - 1) / o.seq_len < o.num_samples);
  s->epochs_ = epochs;
  const int64_t docs = end - first;
  if (epochs * docs > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(
        absl::StrCat(epochs, " epochs of ", docs, " documents exceed the int32 doc index"),
        "num_samples");
  }
  // _build_doc_idx: the part's documents `epochs` times, shuffled as one.
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  s->doc_idx_.resize(epochs * docs);
  for (int64_t i = 0; i < epochs * docs; ++i) {
    s->doc_idx_[i] = static_cast<int32_t>(first + i % docs);
  }
  NumpyShuffle(rng, std::span<int32_t>(s->doc_idx_));
  // build_sample_idx: where each sample starts (doc index position, offset).
  const int64_t samples = (epochs * tokens_per_epoch - 1) / o.seq_len;
  std::vector<int64_t>& si = s->sample_idx_;
  si.resize(2 * (samples + 1));
  int64_t doc_pos = 0, offset = 0;
  si[0] = si[1] = 0;
  for (int64_t i = 1; i <= samples; ++i) {
    int64_t remaining = o.seq_len + 1;
    while (remaining != 0) {
      const int64_t doc_length = s->data_->size(s->doc_idx_[doc_pos]) - offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        // The sample ends inside this document; the next starts on its last token.
        offset += remaining + doc_length - 1;
        remaining = 0;
      } else {
        ++doc_pos;
        offset = 0;
      }
    }
    si[2 * i] = doc_pos;
    si[2 * i + 1] = offset;
  }
  // _build_shuffle_idx: every sample of those epochs, shuffled.
  s->shuffle_idx_.resize(samples);
  for (int64_t i = 0; i < samples; ++i) s->shuffle_idx_[i] = i;
  NumpyShuffle(rng, std::span<int64_t>(s->shuffle_idx_));
  return s;
}

Status MegatronGptSamples::ReadRange(int64_t id, int64_t skip, int64_t n, int32_t* out) const {
  if (id < 0 || id >= num_samples()) {
    return Status::InvalidArgument(
        absl::StrCat("sample ", id, " is outside the ", num_samples(), " samples"),
        data_->prefix());
  }
  const int64_t k = shuffle_idx_[id];
  int64_t pos = sample_idx_[2 * k], offset = sample_idx_[2 * k + 1];
  const int64_t last_pos = sample_idx_[2 * k + 2], last_offset = sample_idx_[2 * k + 3];
  // The sample runs from (pos, offset) through (last_pos, last_offset)
  // inclusive; tokens [skip, skip + n) of it are wanted.
  int64_t at = 0;
  for (; pos <= last_pos && n > 0; ++pos, offset = 0) {
    const int64_t seq = doc_idx_[pos];
    const int64_t stop = pos == last_pos ? last_offset + 1 : data_->size(seq);
    const int64_t len = stop - offset;
    if (at + len > skip) {
      const int64_t from = std::max<int64_t>(skip - at, 0), take = std::min(len - from, n);
      FLEET_RETURN_IF_ERROR(data_->Read(seq, offset + from, take, options_.vocab_size, out));
      out += take;
      n -= take;
      skip += take;
    }
    at += len;
  }
  CHECK_EQ(n, 0) << "sample " << id << " is shorter than its seq_len + 1 tokens";
  return Status::OK();
}

Status MegatronGptSamples::ReadSample(int64_t id, int32_t* out) const {
  return ReadRange(id, 0, options_.seq_len + 1, out);
}

Status MegatronGptSamples::ReadInputsAndTargets(std::span<const int64_t> ids, int32_t* tokens,
                                                int32_t* targets) const {
  const int64_t T = options_.seq_len;
  for (size_t i = 0; i < ids.size(); ++i) {
    FLEET_RETURN_IF_ERROR(ReadRange(ids[i], 0, T, tokens + i * T));
    FLEET_RETURN_IF_ERROR(ReadRange(ids[i], 1, T, targets + i * T));
  }
  return Status::OK();
}

}  // namespace fleet::data
