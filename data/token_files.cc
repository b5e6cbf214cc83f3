#include "data/token_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "comm/file_system.h"

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and read in place");

namespace fleet::data {

std::string_view TokenDtypeName(TokenDtype t) {
  switch (t) {
    case TokenDtype::kUint16:
      return "<u2";
    case TokenDtype::kInt32:
      return "<i4";
    case TokenDtype::kUint32:
      return "<u4";
    case TokenDtype::kInt64:
      return "<i8";
  }
  return "?";
}

size_t TokenDtypeSize(TokenDtype t) {
  switch (t) {
    case TokenDtype::kUint16:
      return 2;
    case TokenDtype::kInt32:
    case TokenDtype::kUint32:
      return 4;
    case TokenDtype::kInt64:
      return 8;
  }
  return 0;
}

namespace {

std::string ErrnoText() { return std::strerror(errno); }

// NumPy spells 2-byte unsigned little-endian "<u2"; "|u2" never occurs for
// multi-byte types, "=u2" means native (little here).
std::optional<TokenDtype> DtypeOf(std::string_view descr) {
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '=')) return std::nullopt;
  const std::string_view t = descr.substr(1);
  if (t == "u2") return TokenDtype::kUint16;
  if (t == "i4") return TokenDtype::kInt32;
  if (t == "u4") return TokenDtype::kUint32;
  if (t == "i8") return TokenDtype::kInt64;
  return std::nullopt;
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

int64_t LoadToken(const char* base, TokenDtype dtype, int64_t i) {
  switch (dtype) {
    case TokenDtype::kUint16:
      return Load<uint16_t>(base + 2 * i);
    case TokenDtype::kInt32:
      return Load<int32_t>(base + 4 * i);
    case TokenDtype::kUint32:
      return Load<uint32_t>(base + 4 * i);
    case TokenDtype::kInt64:
      return Load<int64_t>(base + 8 * i);
  }
  return -1;
}

// Appends `s` repeated to a string; used for header padding.
void Pad(std::string* s, size_t n, char c) { s->append(n, c); }

}  // namespace

// A whole file mapped read-only; an empty file maps to no memory.
class MappedFile {
 public:
  static Result<std::shared_ptr<const MappedFile>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return Status::NotFound("no such file", path);
      return Status::IOError("cannot open (" + ErrnoText() + ")", path);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::IOError("not a readable regular file", path);
    }
    const size_t size = static_cast<size_t>(st.st_size);
    void* data = nullptr;
    if (size > 0) {
      data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) {
        const std::string err = ErrnoText();
        ::close(fd);
        return Status::IOError("cannot mmap (" + err + ")", path);
      }
    }
    ::close(fd);  // the mapping stays valid without the descriptor
    return std::shared_ptr<const MappedFile>(
        new MappedFile(path, static_cast<const char*>(data), size));
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view bytes() const { return {data_, size_}; }

 private:
  MappedFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  const std::string path_;
  const char* const data_;
  const size_t size_;
};

const std::string& TokenArray::path() const { return file_->path(); }

int64_t TokenArray::Get(int64_t i) const {
  DCHECK(i >= 0 && i < size_);
  return LoadToken(file_->data() + offset_, dtype_, i);
}

void TokenArray::CopyTo(int64_t begin, int64_t n, int32_t* out) const {
  CHECK(begin >= 0 && n >= 0 && begin + n <= size_) << begin << "+" << n << " of " << size_;
  const char* base = file_->data() + offset_;
  if (dtype_ == TokenDtype::kUint16) {
    for (int64_t i = 0; i < n; ++i) out[i] = Load<uint16_t>(base + 2 * (begin + i));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = LoadToken(base, dtype_, begin + i);
    out[i] = (v < 0 || v > std::numeric_limits<int32_t>::max()) ? -1 : static_cast<int32_t>(v);
  }
}

Result<TokenArray> OpenRawTokens(const std::string& path, TokenDtype dtype) {
  FLEET_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  const size_t item = TokenDtypeSize(dtype);
  if (file->size() % item != 0) {
    return Status::Corruption(absl::StrCat(file->size(), " bytes is not a whole number of ",
                                           std::string(TokenDtypeName(dtype)), " tokens"),
                              path);
  }
  const int64_t n = static_cast<int64_t>(file->size() / item);
  return TokenArray(std::move(file), 0, n, dtype);
}

// ---------------------------------------------------------------- .npy

namespace {

// A strict reader of the Python dict literal in a .npy header:
// {'descr': '<u2', 'fortran_order': False, 'shape': (10,), }
class DictParser {
 public:
  explicit DictParser(std::string_view s) : s_(s) {}

  bool Parse(NpyHeader* h) {
    bool descr = false, order = false, shape = false;
    if (!Eat('{')) return false;
    while (true) {
      Skip();
      if (Eat('}')) break;
      std::string key;
      if (!String(&key) || !Eat(':')) return false;
      if (key == "descr") {
        if (!String(&h->descr)) return false;
        descr = true;
      } else if (key == "fortran_order") {
        if (!Bool(&h->fortran_order)) return false;
        order = true;
      } else if (key == "shape") {
        if (!Tuple(&h->shape)) return false;
        shape = true;
      } else {
        return false;
      }
      Skip();
      if (Eat('}')) break;
      if (!Eat(',')) return false;
    }
    Skip();
    return descr && order && shape && pos_ == s_.size();
  }

 private:
  void Skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool String(std::string* out) {
    Skip();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return false;
    const char quote = s_[pos_++];
    const size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) return false;
    *out = std::string(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return true;
  }
  bool Bool(bool* out) {
    Skip();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const std::string_view w(word);
      if (s_.substr(pos_, w.size()) == w) {
        pos_ += w.size();
        *out = value;
        return true;
      }
    }
    return false;
  }
  bool Int(int64_t* out) {
    Skip();
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return false;
      v = v * 10 + (s_[pos_++] - '0');
    }
    // Python 2 era files may write 10L.
    if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;
    *out = v;
    return pos_ > start;
  }
  bool Tuple(std::vector<int64_t>* out) {
    out->clear();
    if (!Eat('(')) return false;
    while (true) {
      if (Eat(')')) return true;
      int64_t v;
      if (!Int(&v)) return false;
      out->push_back(v);
      if (Eat(')')) return true;
      if (!Eat(',')) return false;
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

Result<NpyHeader> ParseNpyHeader(std::string_view bytes, const std::string& name) {
  static constexpr std::string_view kMagic("\x93NUMPY", 6);
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return Status::Corruption("not a .npy file (bad magic)", name);
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = Load<uint16_t>(bytes.data() + 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Status::Corruption("truncated .npy header", name);
    header_len = Load<uint32_t>(bytes.data() + 8);
    prefix = 12;
  } else {
    return Status::Corruption(absl::StrCat(".npy version ", major, " is unknown"), name);
  }
  if (bytes.size() < prefix + header_len) {
    return Status::Corruption(absl::StrCat("truncated .npy header (needs ", prefix + header_len,
                                           " bytes, file has ", bytes.size(), ")"),
                              name);
  }
  NpyHeader h;
  DictParser parser(bytes.substr(prefix, header_len));
  if (!parser.Parse(&h)) {
    return Status::Corruption(absl::StrCat("cannot parse .npy header '",
                                           std::string(bytes.substr(prefix, header_len)), "'"),
                              name);
  }
  for (int64_t d : h.shape) {
    if (d < 0) return Status::Corruption("negative dimension in .npy shape", name);
  }
  h.data_offset = prefix + header_len;
  return h;
}

namespace {

// Checks a parsed header describes a 1-D integer array and that `size`
// bytes hold it whole; returns its dtype.
Result<TokenDtype> CheckVector(const NpyHeader& h, size_t size, const std::string& name) {
  const auto dtype = DtypeOf(h.descr);
  if (!dtype) {
    return Status::InvalidArgument(
        absl::StrCat("dtype '", h.descr, "' is not a little-endian u2, i4, u4 or i8 integer"),
        name);
  }
  if (h.shape.size() != 1) {
    return Status::InvalidArgument(
        absl::StrCat("must be a 1-D array, has ", h.shape.size(), " dimensions"), name);
  }
  const size_t need = h.data_offset + static_cast<size_t>(h.shape[0]) * TokenDtypeSize(*dtype);
  if (size != need) {
    return Status::Corruption(absl::StrCat("header says ", h.shape[0], " x ", h.descr, " (", need,
                                           " bytes), file has ", size, " bytes"),
                              name);
  }
  return *dtype;
}

}  // namespace

Result<TokenArray> OpenNpyTokens(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  FLEET_ASSIGN_OR_RETURN(NpyHeader h, ParseNpyHeader(file->bytes(), path));
  FLEET_ASSIGN_OR_RETURN(TokenDtype dtype, CheckVector(h, file->size(), path));
  return TokenArray(std::move(file), h.data_offset, h.shape[0], dtype);
}

Result<std::string> EncodeNpy(std::span<const int64_t> values, TokenDtype dtype) {
  std::string dict = absl::StrCat("{'descr': '", std::string(TokenDtypeName(dtype)),
                                  "', 'fortran_order': False, 'shape': (", values.size(), ",), }");
  // Version 1.0: 10 bytes of magic, version and length, then the dict padded
  // with spaces and ended by '\n' so the data starts at a multiple of 64.
  const size_t total = (10 + dict.size() + 1 + 63) / 64 * 64;
  Pad(&dict, total - 10 - dict.size() - 1, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(dict.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  out += dict;
  const size_t width = TokenDtypeSize(dtype);
  out.reserve(out.size() + values.size() * width);
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    bool fits = true;
    switch (dtype) {
      case TokenDtype::kUint16:
        fits = v >= 0 && v <= 0xffff;
        break;
      case TokenDtype::kInt32:
        fits = v >= INT32_MIN && v <= INT32_MAX;
        break;
      case TokenDtype::kUint32:
        fits = v >= 0 && v <= UINT32_MAX;
        break;
      case TokenDtype::kInt64:
        break;
    }
    if (!fits) {
      return Status::InvalidArgument(absl::StrCat("value ", v, " at index ", i, " does not fit ",
                                                  std::string(TokenDtypeName(dtype))));
    }
    out.append(reinterpret_cast<const char*>(&v), width);  // little-endian: low bytes first
  }
  return out;
}

// ---------------------------------------------------------------- .npz

namespace {

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

}  // namespace

Result<std::vector<int64_t>> ReadNpzIntArray(const std::string& npz_path,
                                             const std::string& member) {
  int err = 0;
  std::unique_ptr<zip_t, ZipCloser> zip(zip_open(npz_path.c_str(), ZIP_RDONLY, &err));
  if (!zip) {
    if (err == ZIP_ER_NOENT) return Status::NotFound("no such file", npz_path);
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    const std::string text = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    if (err == ZIP_ER_OPEN || err == ZIP_ER_READ) {
      return Status::IOError("cannot read (" + text + ")", npz_path);
    }
    return Status::Corruption("not a readable .npz zip (" + text + ")", npz_path);
  }
  const std::string name = member + ".npy";
  const zip_int64_t index = zip_name_locate(zip.get(), name.c_str(), 0);
  if (index < 0) return Status::NotFound("no member '" + name + "' in", npz_path);
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(zip.get(), index, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE)) {
    return Status::Corruption("cannot stat member '" + name + "'", npz_path);
  }
  const std::string where = npz_path + ":" + name;
  // Bounds what a damaged size field can make us allocate.
  if (st.size > (uint64_t{1} << 36)) return Status::Corruption("member too large", where);
  std::unique_ptr<zip_file_t, ZipFileCloser> f(zip_fopen_index(zip.get(), index, 0));
  if (!f) {
    return Status::Corruption(absl::StrCat("cannot open member (", zip_strerror(zip.get()), ")"),
                              where);
  }
  std::string bytes(st.size, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const zip_int64_t n = zip_fread(f.get(), bytes.data() + got, bytes.size() - got);
    if (n < 0) {
      return Status::Corruption(
          absl::StrCat("cannot read member (", zip_file_strerror(f.get()), ")"), where);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != bytes.size()) {
    return Status::Corruption(
        absl::StrCat("member ends after ", got, " of ", bytes.size(), " bytes"), where);
  }
  FLEET_ASSIGN_OR_RETURN(NpyHeader h, ParseNpyHeader(bytes, where));
  FLEET_ASSIGN_OR_RETURN(TokenDtype dtype, CheckVector(h, bytes.size(), where));
  std::vector<int64_t> out(h.shape[0]);
  for (int64_t i = 0; i < h.shape[0]; ++i) {
    out[i] = LoadToken(bytes.data() + h.data_offset, dtype, i);
  }
  return out;
}

namespace {

// The bytes of a zip archive (stored, not compressed, as numpy.savez does)
// holding `members` (name, content).
Result<std::string> BuildZip(const std::vector<std::pair<std::string, std::string>>& members,
                             const std::string& name) {
  zip_error_t ze;
  zip_error_init(&ze);
  zip_source_t* src = zip_source_buffer_create(nullptr, 0, 0, &ze);
  if (src == nullptr) return Status::Internal("libzip cannot make a buffer", name);
  zip_t* za = zip_open_from_source(src, ZIP_TRUNCATE, &ze);
  if (za == nullptr) {
    zip_source_free(src);
    return Status::Internal("libzip cannot open a buffer", name);
  }
  zip_source_keep(src);  // read back after zip_close
  for (const auto& [member, content] : members) {
    zip_source_t* s = zip_source_buffer(za, content.data(), content.size(), 0);
    if (s == nullptr || zip_file_add(za, member.c_str(), s, ZIP_FL_ENC_UTF_8) < 0) {
      if (s != nullptr) zip_source_free(s);
      const std::string text = zip_strerror(za);
      zip_discard(za);
      zip_source_free(src);
      return Status::Internal("libzip cannot add " + member + " (" + text + ")", name);
    }
    zip_set_file_compression(za, zip_name_locate(za, member.c_str(), 0), ZIP_CM_STORE, 0);
  }
  if (zip_close(za) != 0) {
    const std::string text = zip_strerror(za);
    zip_discard(za);
    zip_source_free(src);
    return Status::Internal("libzip cannot finish the archive (" + text + ")", name);
  }
  std::string out;
  if (zip_source_open(src) != 0) {
    zip_source_free(src);
    return Status::Internal("libzip cannot reopen the archive", name);
  }
  char buf[1 << 16];
  zip_int64_t n;
  while ((n = zip_source_read(src, buf, sizeof(buf))) > 0) out.append(buf, n);
  zip_source_close(src);
  zip_source_free(src);
  if (n < 0) return Status::Internal("libzip cannot read the archive back", name);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- FleetX

Result<FleetXData> OpenFleetXData(const std::string& prefix) {
  const std::string ids_path = prefix + "_ids.npy";
  const std::string idx_path = prefix + "_idx.npz";
  FLEET_ASSIGN_OR_RETURN(TokenArray ids, OpenNpyTokens(ids_path));
  FLEET_ASSIGN_OR_RETURN(std::vector<int64_t> lens, ReadNpzIntArray(idx_path, "lens"));
  int64_t sum = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    if (lens[i] < 0) {
      return Status::Corruption(absl::StrCat("lens[", i, "] is negative (", lens[i], ")"),
                                idx_path);
    }
    sum += lens[i];
  }
  if (sum != ids.size()) {
    return Status::Corruption(
        absl::StrCat("lens sum to ", sum, " tokens but ", ids_path, " holds ", ids.size()),
        idx_path);
  }
  auto docs = ReadNpzIntArray(idx_path, "docs");
  if (docs.ok()) {
    const std::vector<int64_t>& d = *docs;
    bool good = !d.empty() && d.front() == 0 && d.back() == static_cast<int64_t>(lens.size());
    for (size_t i = 1; good && i < d.size(); ++i) good = d[i] >= d[i - 1];
    if (!good) {
      return Status::Corruption(
          absl::StrCat("docs must rise from 0 to the ", lens.size(), " entries of lens"), idx_path);
    }
  } else if (!docs.status().IsNotFound()) {
    return docs.status();
  }
  return FleetXData{prefix, std::move(ids), std::move(lens)};
}

namespace {

Status CheckTokenRange(std::span<const int32_t> tokens, int64_t limit, const std::string& path) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= limit) {
      return Status::InvalidArgument(
          absl::StrCat("token ", tokens[i], " at index ", i, " is outside [0, ", limit, ")"), path);
    }
  }
  return Status::OK();
}

}  // namespace

Status WriteFleetXData(const std::string& prefix, std::span<const int32_t> tokens,
                       std::span<const int64_t> doc_lens, int64_t vocab_size) {
  const std::string ids_path = prefix + "_ids.npy";
  const std::string idx_path = prefix + "_idx.npz";
  FLEET_RETURN_IF_ERROR(CheckTokenRange(tokens, vocab_size, ids_path));
  int64_t sum = 0;
  for (int64_t n : doc_lens) sum += n;
  if (sum != static_cast<int64_t>(tokens.size())) {
    return Status::InvalidArgument(
        absl::StrCat("document lengths sum to ", sum, ", not the ", tokens.size(), " tokens"),
        idx_path);
  }
  const TokenDtype dtype = vocab_size <= 65535 ? TokenDtype::kUint16 : TokenDtype::kInt32;
  const std::vector<int64_t> wide(tokens.begin(), tokens.end());
  FLEET_ASSIGN_OR_RETURN(std::string ids, EncodeNpy(wide, dtype));
  std::vector<int64_t> docs(doc_lens.size() + 1);
  for (size_t i = 0; i < docs.size(); ++i) docs[i] = static_cast<int64_t>(i);
  FLEET_ASSIGN_OR_RETURN(std::string lens_npy, EncodeNpy(doc_lens, TokenDtype::kInt32));
  FLEET_ASSIGN_OR_RETURN(std::string docs_npy, EncodeNpy(docs, TokenDtype::kInt64));
  FLEET_ASSIGN_OR_RETURN(std::string zip,
                         BuildZip({{"lens.npy", lens_npy}, {"docs.npy", docs_npy}}, idx_path));
  // The index goes last: a reader that finds it finds the ids complete.
  FLEET_RETURN_IF_ERROR(WriteFileAtomically(ids_path, ids));
  return WriteFileAtomically(idx_path, zip);
}

// ---------------------------------------------------------------- llm.c

Result<TokenArray> OpenLlmcShard(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  if (file->size() < kLlmcHeaderBytes) {
    return Status::Corruption(
        absl::StrCat("truncated: ", file->size(), " bytes, shorter than the 1024-byte header"),
        path);
  }
  const int32_t magic = Load<int32_t>(file->data());
  const int32_t version = Load<int32_t>(file->data() + 4);
  const int32_t count = Load<int32_t>(file->data() + 8);
  if (magic != kLlmcMagic) {
    return Status::Corruption(
        absl::StrCat("bad magic ", magic, " (an llm.c token shard starts with ", kLlmcMagic, ")"),
        path);
  }
  if (version != kLlmcVersion) {
    return Status::InvalidArgument(
        absl::StrCat("version ", version, " is not 1 (uint16 GPT-2 tokens); other versions hold ",
                     "other token types"),
        path);
  }
  if (count < 0) return Status::Corruption(absl::StrCat("negative token count ", count), path);
  const size_t need = kLlmcHeaderBytes + 2 * static_cast<size_t>(count);
  if (file->size() != need) {
    return Status::Corruption(
        absl::StrCat(file->size() < need ? "truncated: " : "trailing bytes: ", "header says ",
                     count, " tokens (", need, " bytes), file has ", file->size()),
        path);
  }
  return TokenArray(std::move(file), kLlmcHeaderBytes, count, TokenDtype::kUint16);
}

Status WriteLlmcShard(const std::string& path, std::span<const int32_t> tokens) {
  FLEET_RETURN_IF_ERROR(CheckTokenRange(tokens, 65536, path));
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Status::InvalidArgument("more tokens than an llm.c header can count", path);
  }
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  bytes.reserve(bytes.size() + 2 * tokens.size());
  for (int32_t t : tokens) {
    const uint16_t v = static_cast<uint16_t>(t);
    bytes.append(reinterpret_cast<const char*>(&v), 2);
  }
  return WriteFileAtomically(path, bytes);
}

}  // namespace fleet::data
