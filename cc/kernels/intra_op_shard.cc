#include "cc/kernels/intra_op_shard.h"

#include <algorithm>
#include <type_traits>

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tf_embed_ops {
namespace {

using SchedulingParams = tensorflow::thread::ThreadPool::SchedulingParams;

// Whether the installed TensorFlow's SchedulingParams has the static Fixed(): TensorFlow 2.16 to 2.19 have only the
// three-argument constructor, which the releases that added Fixed() deprecate. Detected from the header itself, so
// no TensorFlow version number has to be right.
template <typename P, typename = void>
struct HasFixed : std::false_type {};
template <typename P>
struct HasFixed<P, std::void_t<decltype(P::Fixed(int64_t{1}))>> : std::true_type {};

template <typename P>
P FixedBlocksOf(int64_t block_size) {
  if constexpr (HasFixed<P>::value) {
    return P::Fixed(block_size);
  } else {
    return P(tensorflow::thread::ThreadPool::SchedulingStrategy::kFixedBlockSize, {}, block_size);
  }
}

SchedulingParams FixedBlocks(int64_t block_size) { return FixedBlocksOf<SchedulingParams>(block_size); }

tensorflow::thread::ThreadPool* PoolOf(tensorflow::OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->workers;
}

// Callers hand over units of equal cost (or ranges pre-balanced by work), so one block per thread is balanced.
// A block must be worth a wake-up: on a 2-vCPU VM, splitting ~260k cycles of work made it slower, ~4M cycles
// twice as fast.
int64_t BlocksOf(const tensorflow::thread::ThreadPool* pool, int64_t total, int64_t cost_per_unit) {
  constexpr int64_t kMinBlockCost = 1000000;
  return std::min<int64_t>(pool->NumThreads(), total * cost_per_unit / kMinBlockCost);
}

}  // namespace

int64_t IntraOpBlocks(tensorflow::OpKernelContext* ctx, int64_t total, int64_t cost_per_unit) {
  return total <= 0 ? 0 : std::max<int64_t>(1, BlocksOf(PoolOf(ctx), total, cost_per_unit));
}

ShardFn IntraOpShardFn(tensorflow::OpKernelContext* ctx) {
  tensorflow::thread::ThreadPool* pool = PoolOf(ctx);
  return [pool](int64_t total, int64_t cost_per_unit, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    // With fixed blocks the calling thread runs the first block itself instead of sleeping until the pool is
    // done (the adaptive split gives every block to the pool once there are more blocks than threads), and each
    // call wakes as few threads as possible.
    const int64_t blocks = BlocksOf(pool, total, cost_per_unit);
    if (blocks <= 1) {
      fn(0, total);
      return;
    }
    pool->ParallelFor(total, FixedBlocks((total + blocks - 1) / blocks), fn);
  };
}

}  // namespace tf_embed_ops
