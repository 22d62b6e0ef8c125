#include "cc/config/strict_wire_format.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {
namespace {

constexpr int kMaxDepth = 100;  // both runtimes' default recursion limit

class Walker {
 public:
  explicit Walker(const std::string& bytes) : data_(bytes.data()) {}

  // Fields from `pos` up to `end`; `group` > 0: inside an unknown group of that field number, which must close
  // before `end`.
  absl::Status Message(size_t end, const google::protobuf::Descriptor* descriptor, uint32_t group, int depth) {
    if (depth > kMaxDepth) return Error("message nesting deeper than 100 levels");
    while (pos_ < end) {
      const size_t tag_at = pos_;
      uint64_t tag = 0;
      if (auto s = Varint(end, /*max_bytes=*/5, &tag); !s.ok()) return s;
      if (tag > 0xFFFFFFFFu) return Error(absl::StrCat("field tag at byte ", tag_at, " does not fit in 32 bits"));
      const uint32_t number = static_cast<uint32_t>(tag >> 3);
      const int wire_type = static_cast<int>(tag & 7);
      if (number == 0) return Error(absl::StrCat("field number 0 at byte ", tag_at));
      switch (wire_type) {
        case 0: {
          uint64_t unused;
          if (auto s = Varint(end, 10, &unused); !s.ok()) return s;
          break;
        }
        case 1:
          if (auto s = Skip(end, 8); !s.ok()) return s;
          break;
        case 5:
          if (auto s = Skip(end, 4); !s.ok()) return s;
          break;
        case 2: {
          uint64_t length = 0;
          if (auto s = Varint(end, 10, &length); !s.ok()) return s;
          if (length > end - pos_) {
            return Error(absl::StrCat("length ", length, " at byte ", tag_at, " runs past the end of its message"));
          }
          const google::protobuf::FieldDescriptor* field =
              descriptor == nullptr ? nullptr : descriptor->FindFieldByNumber(static_cast<int>(number));
          if (field != nullptr && field->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
            if (auto s = Message(pos_ + length, field->message_type(), 0, depth + 1); !s.ok()) return s;
          } else {
            pos_ += length;
          }
          break;
        }
        case 3:
          // A group: its fields are parsed (to find its end) even when unknown.
          if (auto s = Message(end, nullptr, number, depth + 1); !s.ok()) return s;
          break;
        case 4:
          if (group != number) {
            return Error(absl::StrCat("end-group tag for field ", number, " at byte ", tag_at, " closes no group"));
          }
          return absl::OkStatus();
        default:
          return Error(absl::StrCat("invalid wire type ", wire_type, " at byte ", tag_at));
      }
    }
    if (group != 0) return Error(absl::StrCat("group of field ", group, " is not closed"));
    return absl::OkStatus();
  }

 private:
  absl::Status Varint(size_t end, int max_bytes, uint64_t* value) {
    const size_t at = pos_;
    uint64_t result = 0;
    for (int i = 0; i < max_bytes; ++i) {
      if (pos_ >= end) return Error(absl::StrCat("truncated varint at byte ", at));
      const uint8_t byte = static_cast<uint8_t>(data_[pos_++]);
      if (i < 10) result |= static_cast<uint64_t>(byte & 0x7F) << (7 * i);
      if ((byte & 0x80) == 0) {
        *value = result;
        return absl::OkStatus();
      }
    }
    return Error(absl::StrCat("varint at byte ", at, " is longer than ", max_bytes, " bytes"));
  }

  absl::Status Skip(size_t end, size_t n) {
    if (end - pos_ < n) return Error(absl::StrCat("truncated fixed-width field at byte ", pos_));
    pos_ += n;
    return absl::OkStatus();
  }

  static absl::Status Error(const std::string& what) { return absl::InvalidArgumentError(what); }

  const char* data_;
  size_t pos_ = 0;
};

}  // namespace

absl::Status CheckStrictWireFormat(const std::string& bytes, const google::protobuf::Descriptor* descriptor) {
  Walker walker(bytes);
  return walker.Message(bytes.size(), descriptor, 0, 0);
}

}  // namespace tf_embed_ops
