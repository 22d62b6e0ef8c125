// The ShardFn (cc/lib/shard.h) every kernel hands to cc/lib: TensorFlow's intra-op pool, one block per thread.
#ifndef TF_EMBED_OPS_CC_KERNELS_INTRA_OP_SHARD_H_
#define TF_EMBED_OPS_CC_KERNELS_INTRA_OP_SHARD_H_

#include "cc/lib/shard.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_embed_ops {

// Work worth less than kMinBlockCost cycles per block runs on the calling thread alone.
ShardFn IntraOpShardFn(tensorflow::OpKernelContext* ctx);

// How many blocks IntraOpShardFn(ctx) cuts `total` units of `cost_per_unit` cycles into (1: the calling thread
// runs them all).
int64_t IntraOpBlocks(tensorflow::OpKernelContext* ctx, int64_t total, int64_t cost_per_unit);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_INTRA_OP_SHARD_H_
