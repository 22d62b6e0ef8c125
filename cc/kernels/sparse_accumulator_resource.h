// The sparse conditional accumulator as a TensorFlow resource: state, locking, and the queue of waiting takes.
//
// Semantics are TensorFlow's (docs/sparse_accumulator.md, "Semantics"; it lists where ours differ).  One mutex
// guards the state; the row arithmetic is cc/lib/sparse_accumulator.h.  A take that cannot complete is queued
// (FIFO, head-of-line blocking) without holding a thread; it completes from whichever thread makes it ready
// (an apply, another take, a cancellation) and is removed by cancellation or its timeout.  Completing a take
// swaps the held rows out under the lock and writes the outputs after releasing it, so applies for the next
// round are not blocked by the copy.
#ifndef TF_EMBED_OPS_CC_KERNELS_SPARSE_ACCUMULATOR_RESOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_SPARSE_ACCUMULATOR_RESOURCE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "cc/kernels/intra_op_shard.h"
#include "cc/lib/sparse_accumulator.h"
#include "cc/lib/sparse_accumulator_validation.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/partial_tensor_shape.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tf_embed_ops {

// The typed row store behind the resource (one implementation per dtype, in the .cc).  `shard` runs the row
// arithmetic (see cc/lib/sparse_accumulator.h); null runs it on the calling thread.
class RowStore {
 public:
  virtual ~RowStore() = default;
  virtual int64_t num_rows() const = 0;
  virtual int64_t row_width() const = 0;
  // Empties the store, keeping its memory for the next round.
  virtual void Clear() = 0;
  // `values` has the store's dtype and num_indices * row_width elements.
  virtual void Add(const tensorflow::Tensor& indices, const tensorflow::Tensor& values, const ShardFn& shard) = 0;
  // Writes the sorted rows into pre-allocated `indices` [num_rows] and `values` [num_rows, ...].
  virtual void Extract(bool mean, tensorflow::Tensor* indices, tensorflow::Tensor* values,
                       const ShardFn& shard) const = 0;
};

class SparseAccumulatorResource : public tensorflow::ResourceBase {
 public:
  SparseAccumulatorResource(tensorflow::DataType dtype, const tensorflow::PartialTensorShape& shape, bool mean);
  ~SparseAccumulatorResource() override;

  tensorflow::DataType dtype() const { return dtype_; }
  std::string DebugString() const override;

  // InvalidArgument unless a creator asking for (dtype, shape, reduction) may share this accumulator.
  absl::Status CheckCompatible(tensorflow::DataType dtype, const tensorflow::PartialTensorShape& shape,
                               bool mean) const;

  int32_t NumAccumulated() const;
  void SetGlobalStep(int64_t new_global_step);

  // Validates the gradient (always, even when stale), then adds it unless local_step < global step.
  // `gradient_shape` is null when the shape is unknown.  A rejected gradient changes nothing.  `shard` runs
  // the row arithmetic (under the lock: rows are independent, so the intra-op threads split one gradient).
  absl::Status ApplyGradient(int64_t local_step, const tensorflow::Tensor& indices, const tensorflow::Tensor& values,
                             const tensorflow::Tensor* gradient_shape, const ShardFn& shard);

  // Queues a take of at least `num_required` (> 0) gradients; `timeout_seconds` < 0 waits forever.  Sets the
  // three outputs of `ctx` (or its status) and calls `done` exactly once.
  void TakeGradient(tensorflow::OpKernelContext* ctx, int32_t num_required, double timeout_seconds,
                    std::function<void()> done);

 private:
  struct Attempt {
    uint64_t id;
    int32_t num_required;
    tensorflow::OpKernelContext* ctx;
    std::function<void()> done;
    tensorflow::CancellationManager* cm;  // null when the step has none (some eager calls)
    tensorflow::CancellationToken token;
    uint64_t timer_id;  // 0 when no timeout
  };

  // A take that is ready: its outputs are allocated, the rows to write are swapped out of the accumulator.
  struct Completion {
    Attempt attempt;
    std::unique_ptr<RowStore> rows;  // null when the take failed (ctx status set)
    tensorflow::Tensor* indices = nullptr;
    tensorflow::Tensor* values = nullptr;
  };

  // Completes ready takes from the head of the queue, then finishes them without the lock.
  void Flush();
  bool CompleteHeadLocked(std::vector<Completion>* ready) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Completion* completion) const;
  // Removes a waiting attempt (cancellation or timeout); a no-op when it already completed.
  void Abort(uint64_t attempt_id, const absl::Status& status, bool from_cancellation);
  std::unique_ptr<RowStore> NewRowStore(int64_t row_width) const;

  const tensorflow::DataType dtype_;
  const tensorflow::PartialTensorShape shape_;
  const AccumulatorShape checked_shape_;
  const bool mean_;

  mutable tensorflow::mutex mu_;
  int32_t counter_ TF_GUARDED_BY(mu_) = 0;
  int64_t global_step_ TF_GUARDED_BY(mu_) = 0;
  // Shape of the held values (rank and dims 1.. fixed by the first gradient of a round); valid when counter_ > 0.
  std::vector<int64_t> held_values_dims_ TF_GUARDED_BY(mu_);
  std::unique_ptr<RowStore> rows_ TF_GUARDED_BY(mu_);
  // The store of the last completed take, emptied: the next round reuses its memory (no page faults, no
  // table growth) when its row width matches.  Holds what one round needed, as TensorFlow's held tensor does.
  std::unique_ptr<RowStore> spare_rows_ TF_GUARDED_BY(mu_);
  std::list<Attempt> attempts_ TF_GUARDED_BY(mu_);
  uint64_t next_attempt_id_ TF_GUARDED_BY(mu_) = 1;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_SPARSE_ACCUMULATOR_RESOURCE_H_
