#include "cc/kernels/sparse_accumulator_resource.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/sparse_accumulator.h"
#include "cc/lib/sparse_accumulator_deadline_timer.h"
#include "tensorflow/core/framework/bfloat16.h"
#include "tensorflow/core/framework/numeric_types.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

constexpr char kCancelledMessage[] = "TakeGrad operation was cancelled";

template <typename T>
class TypedRowStore : public RowStore {
 public:
  explicit TypedRowStore(int64_t row_width) : rows_(row_width) {}
  int64_t num_rows() const override { return rows_.num_rows(); }
  int64_t row_width() const override { return rows_.row_width(); }
  void Clear() override { rows_.Clear(); }
  void Add(const tf::Tensor& indices, const tf::Tensor& values, const ShardFn& shard) override {
    rows_.Add(indices.flat<int64_t>().data(), indices.NumElements(), values.flat<T>().data(), shard);
  }
  void Extract(bool mean, tf::Tensor* indices, tf::Tensor* values, const ShardFn& shard) const override {
    rows_.Extract(mean, indices->flat<int64_t>().data(), values->flat<T>().data(), shard);
  }

 private:
  SparseRowSum<T> rows_;
};

AccumulatorShape ToAccumulatorShape(const tf::PartialTensorShape& shape) {
  AccumulatorShape out;
  out.known_rank = !shape.unknown_rank();
  for (int i = 0; out.known_rank && i < shape.dims(); ++i) out.dims.push_back(shape.dim_size(i));
  return out;
}

std::vector<int64_t> Dims(const tf::Tensor& t) {
  std::vector<int64_t> dims;
  for (int i = 0; i < t.dims(); ++i) dims.push_back(t.dim_size(i));
  return dims;
}

// Keeps the accumulator alive for callbacks that may run after the take they guard has finished (a timer
// that was not cancelled in time, a cancellation callback that could not be deregistered).
class ResourceRef {
 public:
  explicit ResourceRef(tf::ResourceBase* resource) : resource_(resource) { resource_->Ref(); }
  ~ResourceRef() { resource_->Unref(); }
  ResourceRef(const ResourceRef&) = delete;
  ResourceRef& operator=(const ResourceRef&) = delete;

 private:
  tf::ResourceBase* resource_;
};

}  // namespace

SparseAccumulatorResource::SparseAccumulatorResource(tf::DataType dtype, const tf::PartialTensorShape& shape, bool mean)
    : dtype_(dtype), shape_(shape), checked_shape_(ToAccumulatorShape(shape)), mean_(mean) {}

SparseAccumulatorResource::~SparseAccumulatorResource() = default;

std::string SparseAccumulatorResource::DebugString() const {
  return absl::StrCat("SparseConditionalAccumulator(dtype=", tf::DataTypeString(dtype_),
                      ", shape=", shape_.DebugString(), ", reduction_type=", mean_ ? "MEAN" : "SUM", ")");
}

absl::Status SparseAccumulatorResource::CheckCompatible(tf::DataType dtype, const tf::PartialTensorShape& shape,
                                                        bool mean) const {
  if (dtype == dtype_ && shape.IsIdenticalTo(shape_) && mean == mean_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "Shared accumulator mismatch: the existing accumulator has dtype ", tf::DataTypeString(dtype_), ", shape ",
      shape_.DebugString(), " and reduction_type ", mean_ ? "MEAN" : "SUM", ", but this op asks for dtype ",
      tf::DataTypeString(dtype), ", shape ", shape.DebugString(), " and reduction_type ", mean ? "MEAN" : "SUM"));
}

int32_t SparseAccumulatorResource::NumAccumulated() const {
  tf::mutex_lock lock(mu_);
  return counter_;
}

void SparseAccumulatorResource::SetGlobalStep(int64_t new_global_step) {
  tf::mutex_lock lock(mu_);
  if (new_global_step < global_step_) {
    LOG(WARNING) << "Attempt to set current_global_step_ to smaller value: current_global_step_ = " << global_step_
                 << " >= " << new_global_step << " = new_global_step.";
  }
  // Unconditional, as in TensorFlow: held gradients stay, and waiting takes are unaffected (counter unchanged).
  global_step_ = new_global_step;
}

std::unique_ptr<RowStore> SparseAccumulatorResource::NewRowStore(int64_t row_width) const {
  switch (dtype_) {
    case tf::DT_HALF:
      return std::make_unique<TypedRowStore<Eigen::half>>(row_width);
    case tf::DT_BFLOAT16:
      return std::make_unique<TypedRowStore<tf::bfloat16>>(row_width);
    case tf::DT_FLOAT:
      return std::make_unique<TypedRowStore<float>>(row_width);
    case tf::DT_DOUBLE:
      return std::make_unique<TypedRowStore<double>>(row_width);
    default:
      // The ops' dtype attr admits only the four types above; the creating kernel checked it.
      LOG(FATAL) << "unsupported accumulator dtype " << tf::DataTypeString(dtype_);
  }
  return nullptr;
}

absl::Status SparseAccumulatorResource::ApplyGradient(int64_t local_step, const tf::Tensor& indices,
                                                      const tf::Tensor& values, const tf::Tensor* gradient_shape,
                                                      const ShardFn& shard) {
  SparseGradientView view;
  view.indices_dims = Dims(indices);
  view.indices = indices.dims() == 1 ? indices.flat<int64_t>().data() : nullptr;
  view.values_dims = Dims(values);
  view.has_known_shape = gradient_shape != nullptr;
  if (gradient_shape != nullptr) {
    view.gradient_shape = gradient_shape->flat<int64_t>().data();
    view.gradient_shape_size = gradient_shape->NumElements();
  }
  {
    tf::mutex_lock lock(mu_);
    // Validation first, stale or not (TensorFlow skips it for stale gradients; see docs).
    const std::string error = ValidateSparseGradient(checked_shape_, view, counter_ > 0 ? &held_values_dims_ : nullptr);
    if (!error.empty()) return absl::InvalidArgumentError(error);
    if (local_step < global_step_) {
      VLOG(1) << "Dropping stale gradient: local_step " << local_step << " < global_step " << global_step_;
      return absl::OkStatus();
    }
    if (counter_ == 0) {
      held_values_dims_ = view.values_dims;
      int64_t row_width = 1;
      for (size_t i = 1; i < held_values_dims_.size(); ++i) row_width *= held_values_dims_[i];
      if (spare_rows_ != nullptr && spare_rows_->row_width() == row_width) {
        rows_ = std::move(spare_rows_);
      } else {
        spare_rows_.reset();
        rows_ = NewRowStore(row_width);
      }
    }
    rows_->Add(indices, values, shard);
    ++counter_;
  }
  Flush();
  return absl::OkStatus();
}

void SparseAccumulatorResource::TakeGradient(tf::OpKernelContext* ctx, int32_t num_required, double timeout_seconds,
                                             std::function<void()> done) {
  tf::CancellationManager* cm = ctx->cancellation_manager();
  auto keep_alive = std::make_shared<ResourceRef>(this);
  uint64_t id;
  bool already_cancelled = false;
  {
    tf::mutex_lock lock(mu_);
    id = next_attempt_id_++;
    tf::CancellationToken token = tf::CancellationManager::kInvalidToken;
    if (cm != nullptr) {
      token = cm->get_cancellation_token();
      already_cancelled = !cm->RegisterCallback(
          token, [this, id, keep_alive] { Abort(id, absl::CancelledError(kCancelledMessage), true); });
    }
    if (!already_cancelled) attempts_.push_back(Attempt{id, num_required, ctx, std::move(done), cm, token, 0});
  }
  if (already_cancelled) {
    // Outside the lock: `done` may run the rest of the step inline.
    ctx->SetStatus(absl::CancelledError(kCancelledMessage));
    done();
    return;
  }
  Flush();
  if (timeout_seconds < 0) return;
  // Armed only if the take is still waiting after the flush, so a zero timeout never beats held gradients.
  tf::mutex_lock lock(mu_);
  for (auto it = attempts_.rbegin(); it != attempts_.rend(); ++it) {
    if (it->id != id) continue;
    const auto deadline = DeadlineTimer::Clock::now() + std::chrono::duration_cast<DeadlineTimer::Clock::duration>(
                                                            std::chrono::duration<double>(timeout_seconds));
    const int32_t required = it->num_required;
    it->timer_id = DeadlineTimer::Global().Schedule(deadline, [this, id, keep_alive, timeout_seconds, required] {
      int32_t arrived;
      {
        tf::mutex_lock arrived_lock(mu_);
        arrived = counter_;
      }
      // Say what was missing: a take that times out with nothing accumulated usually means no producer
      // reached this accumulator (or every gradient was stale), not that the producers were slow.
      Abort(id,
            absl::DeadlineExceededError(
                absl::StrCat("TakeGrad operation timed out after ", timeout_seconds, " seconds: ", arrived, " of the ",
                             required, " gradients it waits for arrived",
                             arrived == 0 ? " (no gradient arrived: none was applied, or all were stale)" : "",
                             "; the accumulator state is unchanged")),
            false);
    });
    break;
  }
}

void SparseAccumulatorResource::Abort(uint64_t attempt_id, const absl::Status& status, bool from_cancellation) {
  Attempt attempt;
  {
    tf::mutex_lock lock(mu_);
    auto it = attempts_.begin();
    while (it != attempts_.end() && it->id != attempt_id) ++it;
    if (it == attempts_.end()) return;  // completed (or aborted) already
    attempt = std::move(*it);
    attempts_.erase(it);
  }
  // Non-blocking deregistration: DeregisterCallback would wait for a cancellation in progress, which may be
  // the very callback running this.  A callback that still runs later finds no attempt and keeps us alive.
  if (!from_cancellation && attempt.cm != nullptr) attempt.cm->TryDeregisterCallback(attempt.token);
  if (attempt.timer_id != 0) DeadlineTimer::Global().Cancel(attempt.timer_id);
  attempt.ctx->SetStatus(status);
  attempt.done();
  // The aborted take may have been the head blocking others.
  Flush();
}

bool SparseAccumulatorResource::CompleteHeadLocked(std::vector<Completion>* ready) {
  if (attempts_.empty() || counter_ < attempts_.front().num_required) return false;
  Completion completion;
  completion.attempt = std::move(attempts_.front());
  attempts_.pop_front();
  tf::OpKernelContext* ctx = completion.attempt.ctx;
  const int64_t nnz = rows_->num_rows();
  tf::TensorShape values_shape;
  absl::Status status = values_shape.AddDimWithStatus(nnz);
  for (size_t i = 1; status.ok() && i < held_values_dims_.size(); ++i) {
    status = values_shape.AddDimWithStatus(held_values_dims_[i]);
  }
  const std::vector<int64_t> dense_shape = TakeOutputShape(checked_shape_, held_values_dims_);
  tf::Tensor* shape_out = nullptr;
  if (status.ok()) status = ctx->allocate_output(0, tf::TensorShape({nnz}), &completion.indices);
  if (status.ok()) status = ctx->allocate_output(1, values_shape, &completion.values);
  if (status.ok()) {
    status = ctx->allocate_output(2, tf::TensorShape({static_cast<int64_t>(dense_shape.size())}), &shape_out);
  }
  if (!status.ok()) {
    // Unlike TensorFlow (which has already advanced the step and divided the rows by then), a failed
    // allocation fails only this take and leaves the accumulator untouched.
    ctx->SetStatus(status);
    ready->push_back(std::move(completion));
    return true;
  }
  std::copy(dense_shape.begin(), dense_shape.end(), shape_out->flat<int64_t>().data());
  completion.rows = std::move(rows_);
  ++global_step_;
  counter_ = 0;
  held_values_dims_.clear();
  ready->push_back(std::move(completion));
  return true;
}

void SparseAccumulatorResource::Flush() {
  std::vector<Completion> ready;
  {
    tf::mutex_lock lock(mu_);
    while (CompleteHeadLocked(&ready)) {
    }
  }
  for (Completion& completion : ready) {
    Attempt& attempt = completion.attempt;
    if (attempt.cm != nullptr) attempt.cm->TryDeregisterCallback(attempt.token);
    if (attempt.timer_id != 0) DeadlineTimer::Global().Cancel(attempt.timer_id);
    if (completion.rows != nullptr) {
      completion.rows->Extract(mean_, completion.indices, completion.values, IntraOpShardFn(attempt.ctx));
      // Emptied outside the lock, then kept for the next round (unless a spare is already there).
      completion.rows->Clear();
      tf::mutex_lock lock(mu_);
      if (spare_rows_ == nullptr) spare_rows_ = std::move(completion.rows);
    }
    completion.rows.reset();
    attempt.done();
  }
}

}  // namespace tf_embed_ops
