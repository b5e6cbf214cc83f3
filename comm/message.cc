#include "comm/message.h"

#include "absl/strings/str_cat.h"

namespace fleet {

size_t DataTypeSize(pb::DataType dtype) {
  switch (dtype) {
    case pb::DT_BYTES: return 1;
    case pb::DT_UINT64: return 8;
    case pb::DT_FLOAT: return 4;
    case pb::DT_INT64: return 8;
    case pb::DT_INT32: return 4;
    case pb::DT_DOUBLE: return 8;
    default: return 0;  // unknown tag from a peer: Validate() rejects it
  }
}

Status Message::Validate() const {
  if (header.frames_size() != static_cast<int>(frames.size())) {
    return Status::InvalidArgument(
        absl::StrCat("header declares ", header.frames_size(), " payload frames but ",
                     frames.size(), " arrived"),
        absl::StrCat("command ", header.command()));
  }
  for (int i = 0; i < header.frames_size(); ++i) {
    const pb::FrameInfo& info = header.frames(i);
    const size_t elem = DataTypeSize(info.dtype());
    if (elem == 0) {
      return Status::InvalidArgument(absl::StrCat("unknown data type tag ", info.dtype()),
                                     absl::StrCat("frame ", i));
    }
    if (info.count() > frames[i].size() / elem || info.count() * elem != frames[i].size()) {
      return Status::InvalidArgument(
          absl::StrCat("frame size disagrees with header: declared ", info.count(), " x ", elem,
                       " bytes, got ", frames[i].size(), " bytes"),
          absl::StrCat("frame ", i));
    }
  }
  return Status::OK();
}

Status Message::CheckFrame(int i, pb::DataType want) const {
  if (i < 0 || i >= header.frames_size() || i >= static_cast<int>(frames.size())) {
    return Status::InvalidArgument(
        absl::StrCat("missing payload frame ", i, " (message has ", frames.size(), ")"),
        absl::StrCat("command ", header.command()));
  }
  if (header.frames(i).dtype() != want) {
    return Status::InvalidArgument(
        absl::StrCat("payload frame ", i, " has type ", pb::DataType_Name(header.frames(i).dtype()),
                     ", expected ", pb::DataType_Name(want)),
        absl::StrCat("command ", header.command()));
  }
  return Status::OK();
}

void Message::set_status(const Status& s) {
  header.set_status_code(static_cast<int>(s.code()));
  header.set_status_message(s.message());
}

}  // namespace fleet
