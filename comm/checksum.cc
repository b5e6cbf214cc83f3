#include "comm/checksum.h"

#include <zlib.h>

#include <algorithm>

namespace fleet {

uint32_t Crc32Extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {  // zlib takes uInt lengths: feed large blocks in parts
    const uInt part = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    c = crc32(c, p, part);
    p += part;
    n -= part;
  }
  return static_cast<uint32_t>(c);
}

}  // namespace fleet
