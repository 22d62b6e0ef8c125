// The speed-of-light kernel's step as TensorFlow ops: SpeedOfLightStep(state) runs one step of the kernel state
// `state` (speed_of_light_open's pointer, as an int64), with nothing else in the op; SpeedOfLightForward(state) and
// SpeedOfLightBackward(state) run its two halves, as a training step must (the model's backward pass sits between
// the activations and the update, so our step is two ops too). speed_of_light.py links them to the kernel's library
// (speed_of_light.cc built with -DSPEED_OF_LIGHT_LIBRARY) and calls them from a tf.function: the kernel's work run
// by TensorFlow as our fused step is, on TensorFlow's thread and through its call.
#include <cstdint>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"

extern "C" void speed_of_light_steps(void* state, int steps);
extern "C" void speed_of_light_forward(void* state);
extern "C" void speed_of_light_backward(void* state);

#define SPEED_OF_LIGHT_OP(NAME, DOC)                      \
  REGISTER_OP(NAME)                                       \
      .Input("state: int64")                              \
      .SetIsStateful()                                    \
      .SetShapeFn(tensorflow::shape_inference::NoOutputs) \
      .Doc(DOC " of the speed-of-light kernel state `state` (benchmarks only).")

SPEED_OF_LIGHT_OP("SpeedOfLightStep", "One step");
SPEED_OF_LIGHT_OP("SpeedOfLightForward", "A step's forward half");
SPEED_OF_LIGHT_OP("SpeedOfLightBackward", "A step's backward half (de-duplication, accumulation, update)");

namespace {

// Runs `run` on the kernel state its one input names.
template <void (*run)(void*)>
class SpeedOfLightOp : public tensorflow::OpKernel {
 public:
  explicit SpeedOfLightOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const tensorflow::Tensor& state = ctx->input(0);
    OP_REQUIRES(
        ctx, tensorflow::TensorShapeUtils::IsScalar(state.shape()) && state.scalar<int64_t>()() != 0,
        tensorflow::errors::InvalidArgument(name(), ": state must be an open kernel state, got ", state.DebugString()));
    run(reinterpret_cast<void*>(static_cast<intptr_t>(state.scalar<int64_t>()())));
  }
};

void OneStep(void* state) { speed_of_light_steps(state, 1); }

REGISTER_KERNEL_BUILDER(Name("SpeedOfLightStep").Device(tensorflow::DEVICE_CPU), SpeedOfLightOp<OneStep>);
REGISTER_KERNEL_BUILDER(Name("SpeedOfLightForward").Device(tensorflow::DEVICE_CPU),
                        SpeedOfLightOp<speed_of_light_forward>);
REGISTER_KERNEL_BUILDER(Name("SpeedOfLightBackward").Device(tensorflow::DEVICE_CPU),
                        SpeedOfLightOp<speed_of_light_backward>);

}  // namespace
