// Checkpoints of local training: parameters + optimizer state + step, so a
// resumed run continues with exactly the same numbers.
//
// File format (host byte order, little-endian on every supported machine):
//   magic      8 bytes  "FLTCKPT\0"
//   version    u32      kCheckpointVersion
//   optimizer  u32 length + bytes ("sgd", "adam")
//   step       i64
//   tensors    u32 count, then per tensor: u32 length + name bytes,
//              u32 ndim, i64 dims[ndim]           (the arena's table)
//   floats     u64 arena size
//   states     u32 number of optimizer state buffers
//   data       f32 params[floats], then f32 state[states][floats]
//   crc32      u32 (comm/checksum.h's Crc32) of every byte before it
//
// Files go through a FileSystem (comm/file_system.h; the real one unless a
// test passes another, e.g. FaultInjectionFileSystem to fail a write or run
// out of space), written by its AtomicFileWriter.
#pragma once

#include <cstdint>
#include <string>

#include "comm/file_system.h"
#include "comm/status.h"
#include "trainer/optimizer.h"
#include "trainer/param_arena.h"

namespace fleet::trainer {

inline constexpr uint32_t kCheckpointVersion = 1;

// Writes `path` atomically: the bytes go to "<path>.tmp", which is synced and
// then renamed over `path`, and the directory is synced, so a crash leaves
// either the old file or the new one. IOError (naming the file and the OS
// reason) on any failure, after which the temporary file is removed and
// `path` is untouched (a failed directory sync alone comes after the
// rename: the new file is in place but may not survive a crash). Blocks for
// the disk writes. `fs` is not owned.
Status SaveCheckpoint(const std::string& path, const ParamArena& arena, const Optimizer& optimizer,
                      FileSystem* fs = DefaultFileSystem());

// Reads `path` into the arena's params, the optimizer's state and step.
// Returns NotFound / IOError for a missing or unreadable file; Corruption for
// a bad magic, unknown version, truncation or checksum mismatch;
// FailedPrecondition when the file's tensor table or optimizer differs from
// the model's (the message names the first differing tensor, with both
// shapes, or the optimizers). On any error the arena and optimizer are
// unchanged. Blocks for the read.
Status LoadCheckpoint(const std::string& path, ParamArena* arena, Optimizer* optimizer,
                      FileSystem* fs = DefaultFileSystem());

// Reads only the parameters of `path` into the arena's params, whatever
// optimizer wrote it and however many state buffers it has (for inference,
// e.g. gpt_generate). The same checks and Status codes as LoadCheckpoint
// (magic, version, checksum, tensor table equal to the arena's), without the
// optimizer's; on any error the arena is unchanged. The optimizer state and
// step in the file are skipped. Blocks for the read.
Status LoadCheckpointParams(const std::string& path, ParamArena* arena,
                            FileSystem* fs = DefaultFileSystem());

}  // namespace fleet::trainer
