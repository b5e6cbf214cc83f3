#include "trainer/safetensors.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "comm/file_system.h"

namespace fleet::trainer {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

// The reference implementation refuses headers over 100 MB; so do we, before
// allocating one.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct DtypeInfo {
  SafetensorsDtype dtype;
  std::string_view name;
  size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kF64, "F64", 8}, {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF16, "F16", 2}, {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI64, "I64", 8}, {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kI16, "I16", 2}, {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kU8, "U8", 1},   {SafetensorsDtype::kBool, "BOOL", 1},
};

const DtypeInfo& Info(SafetensorsDtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  LOG(FATAL) << "unknown SafetensorsDtype " << static_cast<int>(dtype);
  return kDtypes[0];
}

Status Bad(const std::string& path, std::string_view what) {
  return Status::Corruption("not a valid safetensors file: " + std::string(what), path);
}

// One header entry into `t`; `data_bytes` bounds its range.
Status ParseEntry(const std::string& path, const std::string& name, const nlohmann::json& entry,
                  uint64_t data_begin, uint64_t data_bytes, SafetensorsTensor* t) {
  const std::string which = absl::StrCat("tensor '", name, "': ");
  if (!entry.is_object()) return Bad(path, which + "header entry is not an object");
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || shape == entry.end() || offsets == entry.end()) {
    return Bad(path, which + "needs dtype, shape and data_offsets");
  }
  if (!dtype->is_string()) return Bad(path, which + "dtype is not a string");
  const std::string dtype_name = dtype->get<std::string>();
  const DtypeInfo* info = nullptr;
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == dtype_name) info = &d;
  }
  if (info == nullptr) return Bad(path, which + "unknown dtype \"" + dtype_name + "\"");
  t->name = name;
  t->dtype = info->dtype;
  if (!shape->is_array()) return Bad(path, which + "shape is not an array");
  // Element count with overflow checks: a hostile shape must not wrap into
  // a size that matches its range.
  uint64_t elements = 1;
  for (const nlohmann::json& d : *shape) {
    if (!d.is_number_unsigned())
      return Bad(path, which + "a dimension is not a non-negative integer");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (dim != 0 && elements > std::numeric_limits<uint64_t>::max() / dim)) {
      return Bad(path, which + "shape is too large");
    }
    elements *= dim;
    t->shape.push_back(static_cast<int64_t>(dim));
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return Bad(path, which + "data_offsets is not [begin, end]");
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (begin > end || end > data_bytes) {
    return Bad(path,
               absl::StrCat(which, "data_offsets [", begin, ", ", end, "] outside the file's ",
                            data_bytes, " data bytes (truncated file?)"));
  }
  if (elements > std::numeric_limits<uint64_t>::max() / info->bytes ||
      elements * info->bytes != end - begin) {
    return Bad(path, absl::StrCat(which, "shape holds ", elements, " ", dtype_name,
                                  " elements but data_offsets span ", end - begin, " bytes"));
  }
  t->file_offset = data_begin + begin;
  t->bytes = end - begin;
  return Status::OK();
}

template <typename T>
T LoadLE(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

std::string_view SafetensorsDtypeName(SafetensorsDtype dtype) { return Info(dtype).name; }
size_t SafetensorsDtypeBytes(SafetensorsDtype dtype) { return Info(dtype).bytes; }

Result<SafetensorsDtype> ParseFloatDtype(std::string_view name) {
  if (name == "F32" || name == "float32" || name == "fp32") return SafetensorsDtype::kF32;
  if (name == "F16" || name == "float16" || name == "fp16") return SafetensorsDtype::kF16;
  if (name == "BF16" || name == "bfloat16" || name == "bf16") return SafetensorsDtype::kBF16;
  return Status::InvalidArgument("unknown float dtype \"" + std::string(name) +
                                 "\": use float32, float16 or bfloat16");
}

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- float conversions -----------------------------------------------------

uint16_t FloatToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // stay a quiet NaN
  u += 0x7fff + ((u >> 16) & 1);                                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToFp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000) return sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00);  // NaN / inf
  if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds to beyond 65504: inf
  const int exp = static_cast<int>(abs >> 23) - 127;
  if (exp < -25) return sign;  // below half the smallest subnormal 2^-24

  uint32_t mant = (abs & 0x7fffff) | 0x800000;  // with the implicit 1
  int shift;
  uint16_t biased;
  if (exp < -14) {     // subnormal half: value = mant * 2^(exp - 23), unit 2^-24
    shift = -exp - 1;  // 23 - (exp + 24), up to 24 (exp -25 rounds to 0 or 2^-24)
    biased = 0;
  } else {
    shift = 13;
    biased = static_cast<uint16_t>((exp + 15) << 10);
    mant &= 0x7fffff;
  }
  const uint32_t half_bit = 1u << (shift - 1);
  const uint32_t rest = mant & ((1u << shift) - 1);
  uint32_t m = mant >> shift;
  if (rest > half_bit || (rest == half_bit && (m & 1))) ++m;  // carry into the exponent is right
  return static_cast<uint16_t>(sign | (biased + m));
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000 | (mant << 13));
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

// ---- reading ----------------------------------------------------------------

Result<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::NotFound("no such file", path);
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) return Status::IOError("cannot read the size: " + ec.message(), path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError("cannot open", path);
  char size_bytes[8];
  if (file_size < 8 || !in.read(size_bytes, 8)) {
    return Bad(path, absl::StrCat("the file has ", file_size,
                                  " bytes, fewer than the 8 of the header length"));
  }
  const uint64_t header_bytes = LoadLE<uint64_t>(size_bytes);
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_size - 8) {
    return Bad(path, absl::StrCat("header length ", header_bytes, " exceeds the file's ",
                                  file_size - 8, " remaining bytes (or the 100 MiB limit)"));
  }
  std::string header(header_bytes, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_bytes))) {
    return Status::IOError("cannot read the header", path);
  }
  nlohmann::json doc = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Bad(path, "the header is not JSON");
  if (!doc.is_object()) return Bad(path, "the header is not a JSON object");

  std::unique_ptr<SafetensorsReader> reader(new SafetensorsReader());
  reader->path_ = path;
  const uint64_t data_begin = 8 + header_bytes;
  const uint64_t data_bytes = file_size - data_begin;
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Bad(path, "__metadata__ is not an object");
      continue;
    }
    SafetensorsTensor t;
    FLEET_RETURN_IF_ERROR(ParseEntry(path, name, entry, data_begin, data_bytes, &t));
    reader->tensors_.push_back(std::move(t));
  }
  std::vector<SafetensorsTensor>& ts = reader->tensors_;
  std::sort(ts.begin(), ts.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.file_offset != b.file_offset ? a.file_offset < b.file_offset : a.bytes < b.bytes;
  });
  for (size_t i = 1; i < ts.size(); ++i) {
    if (ts[i].file_offset < ts[i - 1].file_offset + ts[i - 1].bytes) {
      return Bad(path, absl::StrCat("tensors '", ts[i - 1].name, "' and '", ts[i].name,
                                    "' overlap in the data"));
    }
  }
  return reader;
}

const SafetensorsTensor* SafetensorsReader::Find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<std::string> SafetensorsReader::ReadBytes(const SafetensorsTensor& t) const {
  std::ifstream in(path_, std::ios::binary);
  std::string bytes(t.bytes, '\0');
  if (!in || !in.seekg(static_cast<std::streamoff>(t.file_offset)) ||
      !in.read(bytes.data(), static_cast<std::streamsize>(t.bytes))) {
    return Status::IOError(
        absl::StrCat("cannot read tensor '", t.name, "' (", t.bytes, " bytes at offset ",
                     t.file_offset, "); did the file change?"),
        path_);
  }
  return bytes;
}

Status SafetensorsReader::ReadFloats(const SafetensorsTensor& t, std::span<float> out) const {
  CHECK_EQ(out.size(), static_cast<size_t>(t.num_elements())) << t.name;
  if (t.dtype != SafetensorsDtype::kF32 && t.dtype != SafetensorsDtype::kF16 &&
      t.dtype != SafetensorsDtype::kBF16) {
    return Status::InvalidArgument(
        absl::StrCat("tensor '", t.name, "' is ", std::string(SafetensorsDtypeName(t.dtype)),
                     "; only F32, F16 and BF16 weights can be read"),
        path_);
  }
  FLEET_ASSIGN_OR_RETURN(std::string bytes, ReadBytes(t));
  const char* p = bytes.data();
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case SafetensorsDtype::kF32:
        out[i] = LoadLE<float>(p + 4 * i);
        break;
      case SafetensorsDtype::kF16:
        out[i] = Fp16ToFloat(LoadLE<uint16_t>(p + 2 * i));
        break;
      default:
        out[i] = Bf16ToFloat(LoadLE<uint16_t>(p + 2 * i));
        break;
    }
  }
  return Status::OK();
}

// ---- writing ----------------------------------------------------------------

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                        SafetensorsDtype dtype,
                        const std::vector<std::pair<std::string, std::string>>& metadata) {
  CHECK(dtype == SafetensorsDtype::kF32 || dtype == SafetensorsDtype::kF16 ||
        dtype == SafetensorsDtype::kBF16);
  const size_t width = SafetensorsDtypeBytes(dtype);
  // nlohmann's ordered_json keeps the entries in data order, as the
  // reference writer does (readers must not rely on it).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    CHECK_EQ(static_cast<size_t>(n), e.values.size()) << e.name;
    CHECK(!header.contains(e.name)) << "duplicate tensor " << e.name;
    header[e.name] = {{"dtype", std::string(SafetensorsDtypeName(dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + n * width}}};
    offset += n * width;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file,
                         AtomicFileWriter::Create(path));
  const uint64_t header_bytes = text.size();
  std::string chunk(8, '\0');
  std::memcpy(chunk.data(), &header_bytes, 8);
  FLEET_RETURN_IF_ERROR(file->Append(chunk));
  FLEET_RETURN_IF_ERROR(file->Append(text));
  for (const SafetensorsEntry& e : entries) {
    chunk.resize(e.values.size() * width);
    char* p = chunk.data();
    for (size_t i = 0; i < e.values.size(); ++i) {
      const float v = e.values[i];
      if (dtype == SafetensorsDtype::kF32) {
        std::memcpy(p + 4 * i, &v, 4);
      } else {
        const uint16_t h = dtype == SafetensorsDtype::kF16 ? FloatToFp16(v) : FloatToBf16(v);
        std::memcpy(p + 2 * i, &h, 2);
      }
    }
    FLEET_RETURN_IF_ERROR(file->Append(chunk));
  }
  return file->Commit();
}

}  // namespace fleet::trainer
