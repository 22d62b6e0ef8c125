// The sharding callback the TensorFlow-free loops take.  The kernels pass one over TensorFlow's intra-op pool
// (cc/kernels/intra_op_shard.h); tests and benchmarks may pass their own.
#ifndef TF_EMBED_OPS_CC_LIB_SHARD_H_
#define TF_EMBED_OPS_CC_LIB_SHARD_H_

#include <cstdint>
#include <functional>

namespace tf_embed_ops {

// Runs fn(begin, end) over disjoint ranges covering [0, total), possibly in parallel, and returns when all are
// done; cost_per_unit is in CPU cycles per unit.  (cc/lib/sparse_accumulator.h also takes a null one: serial.)
using ShardFn =
    std::function<void(int64_t total, int64_t cost_per_unit, const std::function<void(int64_t, int64_t)>& fn)>;

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_SHARD_H_
