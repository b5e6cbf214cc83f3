// The one checksum of FleetPS's own files: CRC-32 as zlib computes it (the
// polynomial of gzip and PNG). PS checkpoints (shard files and manifests),
// the push log, the PS recovery steps file, trainer checkpoints and sharded
// optimizer state all store it, so their on-disk bytes depend on this exact
// function. (TensorBoard event files use TFRecord's masked CRC-32C instead,
// data/tensorboard, because TensorBoard reads them.)
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fleet {

// CRC-32 of `n` bytes continuing from `crc`, the CRC-32 of the bytes before
// them (0 to start), so a file written in pieces gets the checksum of the
// whole: Crc32Extend(Crc32(a), b, n) == Crc32(a + b).
uint32_t Crc32Extend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32(std::string_view bytes) { return Crc32Extend(0, bytes.data(), bytes.size()); }

}  // namespace fleet
