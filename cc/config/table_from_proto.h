// One TableDescriptor -> TableSpec, with every per-table rule checked (docs/config.md; the cross-table and
// cross-feature rules live in config_parser.cc).
#ifndef TF_EMBED_OPS_CC_CONFIG_TABLE_FROM_PROTO_H_
#define TF_EMBED_OPS_CC_CONFIG_TABLE_FROM_PROTO_H_

#include "absl/status/status.h"
#include "cc/lib/embedding_config.h"
#include "tensorflow/core/protobuf/tpu/tpu_embedding_configuration.pb.h"

namespace tf_embed_ops {

// Errors name the table and its table_id, the proto field and the offending value (InvalidArgument), or the
// unsupported algorithm (Unimplemented).  `out` is written only on success.
absl::Status TableFromProto(const tensorflow::tpu::TPUEmbeddingConfiguration::TableDescriptor& table, int table_id,
                            TableSpec* out);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_CONFIG_TABLE_FROM_PROTO_H_
