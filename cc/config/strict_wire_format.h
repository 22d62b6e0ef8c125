// The wire-format rules both protobuf runtimes agree on, checked before the C++ parser runs.
//
// The C++ parser is lenient where Python's (upb) is strict: it truncates a field tag written with more than 32
// bits to its low 32 bits (so crafted bytes can even land on another, known field), and accepts tag varints
// longer than five bytes.  tf_embed_ops.config.load and the kernels' config attr must accept exactly the same
// bytes, so such input is refused here, with the byte offset, before ParseFromString sees it.
#ifndef TF_EMBED_OPS_CC_CONFIG_STRICT_WIRE_FORMAT_H_
#define TF_EMBED_OPS_CC_CONFIG_STRICT_WIRE_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"

namespace tf_embed_ops {

// Walks `bytes` as a message of type `descriptor` (and every known sub-message field, and unknown groups,
// recursively): every tag is a varint of at most 5 bytes with a value < 2^32, a field number > 0 and a wire
// type in {0, 1, 2, 3, 5} (4 only closing an open group); every varint value is at most 10 bytes; lengths
// stay inside the buffer; nesting is at most 100 deep.  InvalidArgument says which rule broke at which byte
// offset (the caller adds what the bytes were meant to be).
absl::Status CheckStrictWireFormat(const std::string& bytes, const google::protobuf::Descriptor* descriptor);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_CONFIG_STRICT_WIRE_FORMAT_H_
