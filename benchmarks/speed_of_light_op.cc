// The speed-of-light kernel's step as a TensorFlow op: SpeedOfLightStep(state) runs one step of the kernel state
// `state` (speed_of_light_open's pointer, as an int64), with nothing else in the op.  speed_of_light.py links it
// to the kernel's library (speed_of_light.cc built with -DSPEED_OF_LIGHT_LIBRARY) and calls it from a
// tf.function: the kernel's work run by TensorFlow as our fused step is, on TensorFlow's thread and through its
// call, which is the least a step run by TensorFlow can take.
#include <cstdint>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

extern "C" void speed_of_light_steps(void* state, int steps);

REGISTER_OP("SpeedOfLightStep")
    .Input("state: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("One step of the speed-of-light kernel state `state` (benchmarks only).");

namespace {

class SpeedOfLightStepOp : public tensorflow::OpKernel {
 public:
  explicit SpeedOfLightStepOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& state = ctx->input(0);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(state.shape()) && state.scalar<int64_t>()() != 0,
                tensorflow::errors::InvalidArgument("SpeedOfLightStep: state must be an open kernel state, got ",
                                                    state.DebugString()));
    speed_of_light_steps(reinterpret_cast<void*>(static_cast<intptr_t>(state.scalar<int64_t>()())), 1);
  }
};

REGISTER_KERNEL_BUILDER(Name("SpeedOfLightStep").Device(tensorflow::DEVICE_CPU), SpeedOfLightStepOp);

}  // namespace
