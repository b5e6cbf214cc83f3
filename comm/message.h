// Message: a protobuf header plus raw payload frames. Frames share memory
// with their producers (SArray), so building a message from existing arrays
// and sending it copies no payload bytes.
#pragma once

#include <string>
#include <vector>

#include "comm/proto/message.pb.h"
#include "comm/sarray.h"
#include "comm/status.h"

namespace fleet {

size_t DataTypeSize(pb::DataType dtype);

template <typename T> constexpr pb::DataType DataTypeOf();
template <> constexpr pb::DataType DataTypeOf<char>() { return pb::DT_BYTES; }
template <> constexpr pb::DataType DataTypeOf<uint64_t>() { return pb::DT_UINT64; }
template <> constexpr pb::DataType DataTypeOf<float>() { return pb::DT_FLOAT; }
template <> constexpr pb::DataType DataTypeOf<int64_t>() { return pb::DT_INT64; }
template <> constexpr pb::DataType DataTypeOf<int32_t>() { return pb::DT_INT32; }
template <> constexpr pb::DataType DataTypeOf<double>() { return pb::DT_DOUBLE; }

struct Message {
  pb::Header header;
  std::vector<Bytes> frames;  // frames[i] is described by header.frames(i)

  // Appends a frame that shares `data`'s memory and records its type/count.
  template <typename T>
  void AddFrame(const SArray<T>& data) {
    auto* info = header.add_frames();
    info->set_dtype(DataTypeOf<T>());
    info->set_count(data.size());
    frames.push_back(Bytes::Reinterpret(data));
  }

  // Returns frame i as T[], checking that it exists and that its declared
  // type and byte size agree with the header. Misaligned received bytes are
  // copied into aligned memory: ZeroMQ hands over a frame that arrived inside
  // its 8 KiB receive batch in place, at whatever offset it landed, so most
  // frames up to a few KiB are copied once here; larger ones get a buffer of
  // their own and are used where they are.
  template <typename T>
  Result<SArray<T>> Frame(int i) const {
    FLEET_RETURN_IF_ERROR(CheckFrame(i, DataTypeOf<T>()));
    const Bytes& b = frames[i];
    if (reinterpret_cast<uintptr_t>(b.data()) % alignof(T) != 0) {
      SArray<T> copy = SArray<T>::Uninitialized(b.size() / sizeof(T));
      std::memcpy(copy.data(), b.data(), b.size());
      return copy;
    }
    return SArray<T>::Reinterpret(b);
  }

  // Checks every frame against the header: count of frames, and each frame's
  // byte size == count * size(dtype). Used on every received message.
  Status Validate() const;

  // Status carried by a response header.
  Status status() const { return Status::FromWire(header.status_code(), header.status_message()); }
  void set_status(const Status& s);

 private:
  Status CheckFrame(int i, pb::DataType want) const;
};

}  // namespace fleet
