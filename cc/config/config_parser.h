// The one parser and validator of TPUEmbeddingConfiguration (rules: docs/config.md).  Used by every kernel that
// takes a `config` attr and, through the pybind11 module, by tf_embed_ops.config.load: the same rules and the
// same messages everywhere.
#ifndef TF_EMBED_OPS_CC_CONFIG_CONFIG_PARSER_H_
#define TF_EMBED_OPS_CC_CONFIG_CONFIG_PARSER_H_

#include <string>

#include "absl/status/status.h"
#include "cc/lib/embedding_config.h"
#include "tensorflow/core/protobuf/tpu/tpu_embedding_configuration.pb.h"

namespace tf_embed_ops {

// Parses a serialized TPUEmbeddingConfiguration and validates it (every rule is listed in docs/config.md).
// `out` is written only on success.  Errors are InvalidArgument (malformed or
// contradictory config; the message names the table/feature, the field and the value) or Unimplemented (a
// valid optimizer this library does not run yet).
absl::Status ParseEmbeddingConfig(const std::string& serialized, EmbeddingConfig* out);

// Only the wire-format step of ParseEmbeddingConfig (InvalidArgument on corrupt or truncated bytes, and on bytes
// Python's protobuf would refuse although C++'s accepts them: cc/config/strict_wire_format.h); for callers
// that need the message itself too, e.g. the Python view.
absl::Status ParseEmbeddingConfigProto(const std::string& serialized,
                                       tensorflow::tpu::TPUEmbeddingConfiguration* proto);

// Validation of an already-parsed message.
absl::Status EmbeddingConfigFromProto(const tensorflow::tpu::TPUEmbeddingConfiguration& proto, EmbeddingConfig* out);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_CONFIG_CONFIG_PARSER_H_
