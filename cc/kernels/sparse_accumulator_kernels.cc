// Kernels of the sparse conditional accumulator ops (cc/ops/sparse_accumulator_ops.cc).  Thin: resolve the
// handle, check the inputs that TensorFlow's kernels check too late (dtype, scalars: they crash or keep their
// side effect there), then call the resource.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "cc/kernels/sparse_accumulator_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/mutex.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

absl::Status ReadCreationAttrs(tf::OpKernelConstruction* ctx, tf::DataType* dtype, tf::PartialTensorShape* shape,
                               bool* mean) {
  std::string reduction_type;
  TF_RETURN_IF_ERROR(ctx->GetAttr("dtype", dtype));
  TF_RETURN_IF_ERROR(ctx->GetAttr("shape", shape));
  TF_RETURN_IF_ERROR(ctx->GetAttr("reduction_type", &reduction_type));
  *mean = reduction_type == "MEAN";
  return absl::OkStatus();
}

absl::Status CheckScalar(const tf::Tensor& t, const char* name) {
  if (tf::TensorShapeUtils::IsScalar(t.shape())) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("Argument ", name, " must be scalar, but had bad shape ", t.shape().DebugString()));
}

absl::Status CheckDtype(const SparseAccumulatorResource& acc, tf::DataType requested, const char* input) {
  if (requested == acc.dtype()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("The accumulator holds ", tf::DataTypeString(acc.dtype()), " but ",
                                                 input, " is ", tf::DataTypeString(requested),
                                                 "; convert it to the accumulator's dtype"));
}

absl::Status Lookup(tf::OpKernelContext* ctx, tf::core::RefCountPtr<SparseAccumulatorResource>* acc) {
  return tf::LookupResource(ctx, tf::HandleFromInput(ctx, 0), acc);
}

// Named accumulator: looked up or created once per kernel, like TensorFlow's ConditionalAccumulatorBaseOp
// (and so, without a shared_name, private to this kernel and deleted with it).
class SparseAccumulatorOp : public tf::OpKernel {
 public:
  explicit SparseAccumulatorOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCreationAttrs(ctx, &dtype_, &shape_, &mean_));
  }

  ~SparseAccumulatorOp() override {
    if (handle_set_ && cinfo_.resource_is_private_to_kernel()) {
      // Ignore NotFound: someone may have destroyed it through the handle already.
      cinfo_.resource_manager()->Delete<SparseAccumulatorResource>(cinfo_.container(), cinfo_.name()).IgnoreError();
    }
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::mutex_lock lock(mu_);
    if (!handle_set_) OP_REQUIRES_OK(ctx, CreateOrLookup(ctx));
    ctx->set_output(0, handle_);
  }

 private:
  absl::Status CreateOrLookup(tf::OpKernelContext* ctx) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TF_RETURN_IF_ERROR(cinfo_.Init(ctx->resource_manager(), def()));
    SparseAccumulatorResource* acc = nullptr;
    TF_RETURN_IF_ERROR(ctx->resource_manager()->LookupOrCreate<SparseAccumulatorResource>(
        cinfo_.container(), cinfo_.name(), &acc, [this](SparseAccumulatorResource** out) {
          *out = new SparseAccumulatorResource(dtype_, shape_, mean_);
          return absl::OkStatus();
        }));
    tf::core::ScopedUnref unref(acc);
    absl::Status compatible = acc->CheckCompatible(dtype_, shape_, mean_);
    if (!compatible.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Accumulator '", cinfo_.name(), "' in container '",
                                                     cinfo_.container(), "': ", compatible.message()));
    }
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tf::DT_RESOURCE, tf::TensorShape({}), &handle_));
    handle_.scalar<tf::ResourceHandle>()() =
        tf::MakeResourceHandle<SparseAccumulatorResource>(ctx, cinfo_.container(), cinfo_.name());
    handle_set_ = true;
    return absl::OkStatus();
  }

  tf::DataType dtype_;
  tf::PartialTensorShape shape_;
  bool mean_ = true;
  tf::mutex mu_;
  tf::ContainerInfo cinfo_ TF_GUARDED_BY(mu_);
  tf::Tensor handle_ TF_GUARDED_BY(mu_);
  bool handle_set_ TF_GUARDED_BY(mu_) = false;
};

// Anonymous accumulator: a new one per run, owned by the reference-counting handle it returns.
class AnonymousSparseAccumulatorOp : public tf::OpKernel {
 public:
  explicit AnonymousSparseAccumulatorOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadCreationAttrs(ctx, &dtype_, &shape_, &mean_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &handle));
    handle->scalar<tf::ResourceHandle>()() = tf::ResourceHandle::MakeRefCountingHandle<SparseAccumulatorResource>(
        new SparseAccumulatorResource(dtype_, shape_, mean_), ctx->device()->name());
  }

 private:
  tf::DataType dtype_;
  tf::PartialTensorShape shape_;
  bool mean_ = true;
};

class ApplyGradientOp : public tf::OpKernel {
 public:
  explicit ApplyGradientOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("has_known_shape", &has_known_shape_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<SparseAccumulatorResource> acc;
    OP_REQUIRES_OK(ctx, Lookup(ctx, &acc));
    OP_REQUIRES_OK(ctx, CheckDtype(*acc, dtype_, "gradient_values"));
    const tf::Tensor& local_step = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckScalar(local_step, "local_step"));
    OP_REQUIRES_OK(ctx, acc->ApplyGradient(local_step.scalar<int64_t>()(), ctx->input(2), ctx->input(3),
                                           has_known_shape_ ? &ctx->input(4) : nullptr, IntraOpShardFn(ctx)));
  }

 private:
  tf::DataType dtype_;
  bool has_known_shape_ = false;
};

class TakeGradientOp : public tf::AsyncOpKernel {
 public:
  explicit TakeGradientOp(tf::OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    tf::core::RefCountPtr<SparseAccumulatorResource> acc;
    OP_REQUIRES_OK_ASYNC(ctx, Lookup(ctx, &acc), done);
    OP_REQUIRES_OK_ASYNC(ctx, CheckDtype(*acc, dtype_, "the dtype attr"), done);
    const tf::Tensor& num_required = ctx->input(1);
    const tf::Tensor& timeout = ctx->input(2);
    OP_REQUIRES_OK_ASYNC(ctx, CheckScalar(num_required, "num_required"), done);
    OP_REQUIRES_OK_ASYNC(ctx, CheckScalar(timeout, "timeout_seconds"), done);
    const int32_t required = num_required.scalar<int32_t>()();
    OP_REQUIRES_ASYNC(
        ctx, required > 0,
        absl::InvalidArgumentError(absl::StrCat("Argument num_required must be positive, but was ", required)), done);
    const float timeout_seconds = timeout.scalar<float>()();
    OP_REQUIRES_ASYNC(ctx, !std::isnan(timeout_seconds),
                      absl::InvalidArgumentError("Argument timeout_seconds must not be NaN (negative: no timeout)"),
                      done);
    // The pending take keeps its reference to the accumulator until it finishes.
    SparseAccumulatorResource* raw = acc.release();
    raw->TakeGradient(ctx, required, timeout_seconds, [raw, done = std::move(done)]() {
      raw->Unref();
      done();
    });
  }

 private:
  tf::DataType dtype_;
};

class NumAccumulatedOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<SparseAccumulatorResource> acc;
    OP_REQUIRES_OK(ctx, Lookup(ctx, &acc));
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    out->scalar<int32_t>()() = acc->NumAccumulated();
  }
};

class SetGlobalStepOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<SparseAccumulatorResource> acc;
    OP_REQUIRES_OK(ctx, Lookup(ctx, &acc));
    OP_REQUIRES_OK(ctx, CheckScalar(ctx->input(1), "new_global_step"));
    acc->SetGlobalStep(ctx->input(1).scalar<int64_t>()());
  }
};

#define TF_EMBED_REGISTER_ACCUMULATOR_KERNELS(T)                                                               \
  REGISTER_KERNEL_BUILDER(Name("TfEmbed>SparseAccumulator").Device(tf::DEVICE_CPU).TypeConstraint<T>("dtype"), \
                          SparseAccumulatorOp);                                                                \
  REGISTER_KERNEL_BUILDER(                                                                                     \
      Name("TfEmbed>AnonymousSparseAccumulator").Device(tf::DEVICE_CPU).TypeConstraint<T>("dtype"),            \
      AnonymousSparseAccumulatorOp);                                                                           \
  REGISTER_KERNEL_BUILDER(                                                                                     \
      Name("TfEmbed>SparseAccumulatorApplyGradient").Device(tf::DEVICE_CPU).TypeConstraint<T>("dtype"),        \
      ApplyGradientOp);                                                                                        \
  REGISTER_KERNEL_BUILDER(                                                                                     \
      Name("TfEmbed>SparseAccumulatorTakeGradient").Device(tf::DEVICE_CPU).TypeConstraint<T>("dtype"),         \
      TakeGradientOp);

TF_EMBED_REGISTER_ACCUMULATOR_KERNELS(Eigen::half)
TF_EMBED_REGISTER_ACCUMULATOR_KERNELS(tf::bfloat16)
TF_EMBED_REGISTER_ACCUMULATOR_KERNELS(float)
TF_EMBED_REGISTER_ACCUMULATOR_KERNELS(double)
#undef TF_EMBED_REGISTER_ACCUMULATOR_KERNELS

REGISTER_KERNEL_BUILDER(Name("TfEmbed>SparseAccumulatorNumAccumulated").Device(tf::DEVICE_CPU), NumAccumulatedOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>SparseAccumulatorSetGlobalStep").Device(tf::DEVICE_CPU), SetGlobalStepOp);

}  // namespace
}  // namespace tf_embed_ops
