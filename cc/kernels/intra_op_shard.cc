#include "cc/kernels/intra_op_shard.h"

#include <algorithm>

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow/core/public/version.h"

namespace tf_embed_ops {
namespace {

using SchedulingParams = tensorflow::thread::ThreadPool::SchedulingParams;

SchedulingParams FixedBlocks(int64_t block_size) {
#if TF_MAJOR_VERSION == 2 && TF_MINOR_VERSION < 17
  // TensorFlow 2.16 has only the three-argument constructor (2.17 added Fixed() and deprecated it).
  return SchedulingParams(tensorflow::thread::ThreadPool::SchedulingStrategy::kFixedBlockSize, {}, block_size);
#else
  return SchedulingParams::Fixed(block_size);
#endif
}

}  // namespace

ShardFn IntraOpShardFn(tensorflow::OpKernelContext* ctx) {
  tensorflow::thread::ThreadPool* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t total, int64_t cost_per_unit, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    // Callers hand over units of equal cost (or ranges pre-balanced by work), so one block per thread is
    // balanced.  With fixed blocks the calling thread runs the first block itself instead of sleeping until the
    // pool is done (the adaptive split gives every block to the pool once there are more blocks than threads),
    // and each call wakes as few threads as possible.  A block must be worth a wake-up: on a 2-vCPU VM,
    // splitting ~260k cycles of work made it slower, ~4M cycles twice as fast.
    constexpr int64_t kMinBlockCost = 1000000;
    const int64_t blocks = std::min<int64_t>(pool->NumThreads(), total * cost_per_unit / kMinBlockCost);
    if (blocks <= 1) {
      fn(0, total);
      return;
    }
    pool->ParallelFor(total, FixedBlocks((total + blocks - 1) / blocks), fn);
  };
}

}  // namespace tf_embed_ops
