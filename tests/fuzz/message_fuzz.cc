// The wire message: a protobuf Header and raw payload frames, decoded as the
// Van does (comm/van.cc Deliver): parse the header, attach the frames,
// Validate, then read every frame as its declared type as handlers do.
// Input: u8 flags, then u16-length-prefixed fields: the header, then one per
// frame. Bit 0 of flags places the frames at odd addresses (ZeroMQ hands
// over frames at any offset).
#include <memory>

#include "comm/message.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using fleet::Bytes;
using fleet::Message;

template <typename T>
void ReadFrame(const Message& m, int i) {
  auto frame = m.Frame<T>(i);
  if (!frame.ok()) return;
  volatile T sink{};
  for (const T& v : frame.value()) sink = v;
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fleet::fuzz::ByteReader in(data, size);
  const bool odd = in.U8() & 1;
  const std::string header = in.Field();
  Message m;
  if (!m.header.ParseFromArray(header.data(), static_cast<int>(header.size()))) return 0;
  while (!in.done()) {
    const std::string f = in.Field();
    auto owner = std::shared_ptr<char[]>(new char[f.size() + 1]);
    std::memcpy(owner.get() + odd, f.data(), f.size());
    m.frames.push_back(Bytes(owner.get() + odd, f.size(), owner));
  }
  (void)m.status();
  if (!m.Validate().ok()) return 0;
  for (int i = 0; i < m.header.frames_size(); ++i) {
    switch (m.header.frames(i).dtype()) {
      case fleet::pb::DT_BYTES: ReadFrame<char>(m, i); break;
      case fleet::pb::DT_UINT64: ReadFrame<uint64_t>(m, i); ReadFrame<float>(m, i); break;
      case fleet::pb::DT_FLOAT: ReadFrame<float>(m, i); break;
      case fleet::pb::DT_INT64: ReadFrame<int64_t>(m, i); break;
      case fleet::pb::DT_INT32: ReadFrame<int32_t>(m, i); break;
      case fleet::pb::DT_DOUBLE: ReadFrame<double>(m, i); break;
      default: break;
    }
  }
  ReadFrame<float>(m, m.header.frames_size());  // a frame that is not there
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  for (int odd = 0; odd < 2; ++odd) {
    Message m;
    m.header.set_command(2);
    m.header.set_table_id(1);
    m.header.set_request_id(77);
    m.header.set_sender("worker:0");
    m.header.set_deadline_ms(1000);
    m.AddFrame(fleet::SArray<uint64_t>(std::vector<uint64_t>{1, 2, 3}));
    m.AddFrame(fleet::SArray<float>(std::vector<float>{0.5f, -1.0f, 2.0f, 4.0f, 8.0f, 16.0f}));
    m.AddFrame(fleet::SArray<char>(std::vector<char>{'a', 'b'}));
    m.set_status(fleet::Status::InvalidArgument("bad", "here"));
    std::string s(1, static_cast<char>(odd));
    fleet::fuzz::PutField(&s, m.header.SerializeAsString());
    for (const Bytes& f : m.frames) fleet::fuzz::PutField(&s, std::string_view(f.data(), f.size()));
    seeds->push_back(s);
  }
}
