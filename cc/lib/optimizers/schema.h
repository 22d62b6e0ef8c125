// THE list of optimizers and everything about each that is not its math: the one place an optimizer is
// described besides its math header (see CONTRIBUTING.md, "Adding an optimizer").
//
// - OptimizerParams: the math structs the engine runs, in schema order.
// - SchemaOf<Optimizer>::kValue: its proto fields and ranges (cc/config validates every config with them), its
//   Python class name, arguments, defaults and docstrings (tf_embed_ops.optimizers generates the class from
//   them), the Python arguments of its slots' initial values, and when it needs gradient accumulation.
//
// Ranges follow TensorFlow's own optimizer classes where one exists (tf.tpu.experimental.embedding's, else the
// Keras class optimization_parameters.proto links to); where those say nothing, the range is what keeps the update
// finite.  The entries say which, where it is not obvious.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SCHEMA_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SCHEMA_H_

#include <array>
#include <cstddef>
#include <string_view>
#include <utility>
#include <variant>

#include "cc/lib/optimizers/adadelta.h"
#include "cc/lib/optimizers/adagrad.h"
#include "cc/lib/optimizers/adagrad_momentum.h"
#include "cc/lib/optimizers/adam.h"
#include "cc/lib/optimizers/assign.h"
#include "cc/lib/optimizers/bounded_adagrad.h"
#include "cc/lib/optimizers/centered_rms_prop.h"
#include "cc/lib/optimizers/frequency_estimator.h"
#include "cc/lib/optimizers/ftrl.h"
#include "cc/lib/optimizers/lion.h"
#include "cc/lib/optimizers/momentum.h"
#include "cc/lib/optimizers/online_yogi.h"
#include "cc/lib/optimizers/proximal_adagrad.h"
#include "cc/lib/optimizers/proximal_yogi.h"
#include "cc/lib/optimizers/rms_prop.h"
#include "cc/lib/optimizers/rowwise_adagrad.h"
#include "cc/lib/optimizers/schema_types.h"
#include "cc/lib/optimizers/sgd.h"

namespace tf_embed_ops {

// The five optimizers of tf.tpu.experimental.embedding first, then the rest of optimization_parameters.proto
// whose update rule is public (or, for BoundedAdagrad and the Yogis, documented in docs/optimizers.md as a
// reading), then the optimizers that are not in the TPU proto (FBGEMM's row-wise Adagrad).  Every alternative
// needs a SchemaOf specialization below (a missing one does not compile).
using OptimizerParams = std::variant<Sgd, Adagrad, AdagradMomentum, Adam, Ftrl, Momentum, RmsProp, CenteredRmsProp,
                                     Adadelta, ProximalAdagrad, Lion, BoundedAdagrad, OnlineYogi, ProximalYogi,
                                     FrequencyEstimator, Assign, RowWiseAdagrad>;

template <typename Optimizer>
struct SchemaOf;

namespace schema_internal {
inline constexpr auto kTensorFlow = PythonClassOrigin::kTensorFlow;
inline constexpr auto kCatalogue = PythonClassOrigin::kCatalogue;
}  // namespace schema_internal

// ---- TensorFlow's five (tf.tpu.experimental.embedding); ranges as their constructors check them ----

template <>
struct SchemaOf<Sgd> {
  static constexpr std::array<HyperParameterSpec, 0> kHyperParameters{};
  static constexpr std::array<SlotArgumentSpec, 0> kSlotArguments{};
  static constexpr OptimizerSchema kValue =
      Entry<Sgd>(Describe("SGD", schema_internal::kTensorFlow, "Stochastic gradient descent: `w -= lr * g`.", 0.01)
                     .LoadOp("LoadTPUEmbeddingStochasticGradientDescentParameters"),
                 kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<Adagrad> {
  static constexpr std::array<HyperParameterSpec, 0> kHyperParameters{};
  static constexpr std::array<SlotArgumentSpec, 1> kSlotArguments{
      {SlotArgument("initial_accumulator_value", Above(0))}};
  static constexpr OptimizerSchema kValue =
      Entry<Adagrad>(Describe("Adagrad", schema_internal::kTensorFlow,
                              "Adagrad without epsilon: `a += g^2; w -= lr * g / sqrt(a)`.", 0.001)
                         .LoadOp("LoadTPUEmbeddingAdagradParameters"),
                     kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<AdagradMomentum> {
  static constexpr std::array<HyperParameterSpec, 5> kHyperParameters{{
      Float("momentum", "momentum", 0.0, AnyFinite(), "the momentum decay."),
      Bool("use_nesterov", "use_nesterov", false, "use the Nesterov form."),
      Float("exponent", "exponent", 2.0, Above(0), "the preconditioner exponent (2: square root)."),
      Float("beta2", "beta2", 1.0, AnyFinite(), "accumulator decay (1: a plain sum, as Adagrad)."),
      Float("epsilon", "epsilon", 1e-10, Above(0), "added to the accumulator before the power."),
  }};
  static constexpr std::array<SlotArgumentSpec, 2> kSlotArguments{{NoSlotArgument(), NoSlotArgument()}};
  static constexpr OptimizerSchema kValue = Entry<AdagradMomentum>(
      Describe("AdagradMomentum", schema_internal::kTensorFlow,
               "Adagrad with momentum: `s = g * (a + epsilon)^(-1/exponent); m = momentum*m + s; w -= lr*m`.", 0.001),
      kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<Adam> {
  static constexpr std::array<HyperParameterSpec, 5> kHyperParameters{{
      Float("beta1", "beta_1", 0.9, ClosedOpen(0, 1), "decay of the first moment."),
      Float("beta2", "beta_2", 0.999, ClosedOpen(0, 1), "decay of the second moment."),
      Float("epsilon", "epsilon", 1e-7, Above(0), "added to the denominator."),
      NegatedBool("use_non_lazy_adam", "lazy_adam", true, "update only the rows a step touches."),
      Bool("use_sum_inside_sqrt", "sum_inside_sqrt", true, "divide by `sqrt(v + epsilon^2)`."),
  }};
  static constexpr std::array<SlotArgumentSpec, 2> kSlotArguments{{NoSlotArgument(), NoSlotArgument()}};
  static constexpr OptimizerSchema kValue = Entry<Adam>(
      Describe("Adam", schema_internal::kTensorFlow,
               "Adam without bias correction (fold it into a dynamic learning rate).", 0.001)
          .LoadOp("LoadTPUEmbeddingADAMParameters")
          .NeedsAccumulationWhen("use_non_lazy_adam",
                                 "non-lazy Adam needs gradient accumulation (it updates every row every step from "
                                 "the summed gradient)"),
      kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<Ftrl> {
  static constexpr std::array<HyperParameterSpec, 6> kHyperParameters{{
      Float("l1", "l1_regularization_strength", 0.0, AtLeast(0), "L1 regularization strength."),
      Float("l2", "l2_regularization_strength", 0.0, AtLeast(0), "L2 regularization strength."),
      Float("lr_power", "learning_rate_power", -0.5, AtMost(0), "the accumulator power (a positive one grows steps)."),
      Float("beta", "beta", 0.0, AtLeast(0), "added to the quadratic term."),
      Bool("multiply_linear_by_lr", "multiply_linear_by_learning_rate", false,
           "store linear * learning rate in the `linears` slot."),
      Bool("allow_zero_accumulator", "allow_zero_accumulator", false, "deprecated and ignored, as on TPU."),
  }};
  static constexpr std::array<SlotArgumentSpec, 2> kSlotArguments{
      {SlotArgument("initial_accumulator_value", Above(0)), NoSlotArgument()}};
  static constexpr OptimizerSchema kValue = Entry<Ftrl>(
      Describe("FTRL", schema_internal::kTensorFlow, "FTRL-proximal.", 0.001).LoadOp("LoadTPUEmbeddingFTRLParameters"),
      kHyperParameters, kSlotArguments);
};

// ---- the rest of the catalogue (tf_embed_ops.optimizers) ----

template <>
struct SchemaOf<Momentum> {
  static constexpr std::array<HyperParameterSpec, 2> kHyperParameters{{
      Float("momentum", "momentum", 0.9, AtLeast(0), "the momentum decay."),
      Bool("use_nesterov", "use_nesterov", false, "use the Nesterov form."),
  }};
  static constexpr std::array<SlotArgumentSpec, 1> kSlotArguments{{SlotArgument("initial_momentum_value")}};
  static constexpr OptimizerSchema kValue =
      Entry<Momentum>(Describe("Momentum", schema_internal::kCatalogue,
                               "Momentum (TensorFlow's `ApplyMomentum`): `m = momentum*m + g; w -= lr*m` (Nesterov: "
                               "`w -= lr*g + lr*momentum*m`).",
                               0.01)
                          .LoadOp("LoadTPUEmbeddingMomentumParameters"),
                      kHyperParameters, kSlotArguments);
};

// epsilon > 0 for RMSProp, CenteredRMSProp and Adadelta: TensorFlow's TPU embedding classes refuse epsilon <= 0
// wherever they take one (Adam, AdagradMomentum), and a zero epsilon divides 0 by 0 on a slot that decays to (or
// starts at) zero.  Keras' RMSprop and Adadelta, which the proto links to, do not check it.
template <>
struct SchemaOf<RmsProp> {
  static constexpr std::array<HyperParameterSpec, 3> kHyperParameters{{
      Float("rho", "rho", 0.9, Closed(0, 1), "decay of the squared-gradient average."),
      Float("momentum", "momentum", 0.0, AtLeast(0), "the momentum decay."),
      Float("epsilon", "epsilon", 1e-7, Above(0), "added inside the square root."),
  }};
  static constexpr std::array<SlotArgumentSpec, 2> kSlotArguments{
      {SlotArgument("initial_ms_value"), SlotArgument("initial_mom_value")}};
  static constexpr OptimizerSchema kValue =
      Entry<RmsProp>(Describe("RMSProp", schema_internal::kCatalogue,
                              "RMSProp (TensorFlow's `ApplyRMSProp`): `ms += (g^2 - ms)(1 - rho); mom = momentum*mom + "
                              "lr*g/sqrt(ms + epsilon); w -= mom`.",
                              0.001)
                         .LoadOp("LoadTPUEmbeddingRMSPropParameters"),
                     kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<CenteredRmsProp> {
  static constexpr std::array<SlotArgumentSpec, 3> kSlotArguments{
      {SlotArgument("initial_ms_value"), SlotArgument("initial_mom_value"), SlotArgument("initial_mg_value")}};
  static constexpr OptimizerSchema kValue = Entry<CenteredRmsProp>(
      Describe("CenteredRMSProp", schema_internal::kCatalogue,
               "Centered RMSProp (TensorFlow's `ApplyCenteredRMSProp`): RMSProp with `mg += (g - mg)(1 - rho)` and "
               "the denominator `sqrt(ms - mg^2 + epsilon)`.",
               0.001)
          .LoadOp("LoadTPUEmbeddingCenteredRMSPropParameters"),
      SchemaOf<RmsProp>::kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<Adadelta> {
  static constexpr std::array<HyperParameterSpec, 2> kHyperParameters{{
      Float("rho", "rho", 0.95, Closed(0, 1), "the decay rate."),
      Float("epsilon", "epsilon", 1e-7, Above(0), "added inside both square roots."),
  }};
  static constexpr std::array<SlotArgumentSpec, 2> kSlotArguments{
      {SlotArgument("initial_accumulator_value"), SlotArgument("initial_update_value")}};
  static constexpr OptimizerSchema kValue = Entry<Adadelta>(
      Describe("Adadelta", schema_internal::kCatalogue,
               "Adadelta (TensorFlow's `ApplyAdadelta`): `a = rho*a + (1 - rho)*g^2; u = sqrt(upd + epsilon) / "
               "sqrt(a + epsilon) * g; upd = rho*upd + (1 - rho)*u^2; w -= lr*u`.",
               0.001)
          .LoadOp("LoadTPUEmbeddingAdadeltaParameters"),
      kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<ProximalAdagrad> {
  static constexpr std::array<HyperParameterSpec, 2> kHyperParameters{{
      Float("l1", "l1_regularization_strength", 0.0, AtLeast(0), "L1 regularization strength."),
      Float("l2", "l2_regularization_strength", 0.0, AtLeast(0), "L2 regularization strength."),
  }};
  static constexpr std::array<SlotArgumentSpec, 1> kSlotArguments{
      {SlotArgument("initial_accumulator_value", Above(0))}};
  static constexpr OptimizerSchema kValue = Entry<ProximalAdagrad>(
      Describe("ProximalAdagrad", schema_internal::kCatalogue,
               "Proximal Adagrad (TensorFlow's `ApplyProximalAdagrad`), with l1/l2 regularization.", 0.001)
          .LoadOp("LoadTPUEmbeddingProximalAdagradParameters"),
      kHyperParameters, kSlotArguments);
};

// Lion's betas in [0, 1]: Keras' Lion (the class the proto links to) accepts beta_1 = 1 (the step follows the old
// momentum alone) and does not bound beta_2; both ends keep the update finite.  Keras refuses beta_1 = 0 only
// because Lion then reduces to signSGD, a valid rule a TPU config may ask for, so 0 stays accepted.
template <>
struct SchemaOf<Lion> {
  static constexpr std::array<HyperParameterSpec, 3> kHyperParameters{{
      Float("beta1", "beta_1", 0.9, Closed(0, 1), "weight of the old momentum in the update direction."),
      Float("beta2", "beta_2", 0.99, Closed(0, 1), "decay of the momentum."),
      NegatedBool("use_non_lazy_lion", "lazy_lion", true,
                  "update only the rows a step touches (False: every row every step)."),
  }};
  static constexpr std::array<SlotArgumentSpec, 1> kSlotArguments{{SlotArgument("initial_momentum_value")}};
  static constexpr OptimizerSchema kValue = Entry<Lion>(
      Describe("Lion", schema_internal::kCatalogue,
               "Lion: `c = beta_1*m + (1 - beta_1)*g; w -= lr*sign(c); m = beta_2*m + (1 - beta_2)*g`.", 0.0001)
          .NeedsAccumulationWhen("use_non_lazy_lion",
                                 "non-lazy Lion needs gradient accumulation (it updates every row every step from "
                                 "the summed gradient)"),
      kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<BoundedAdagrad> {
  static constexpr std::array<HyperParameterSpec, 3> kHyperParameters{{
      Bool("update_accumulator_first", "update_accumulator_first", false,
           "use the updated accumulator for the step size."),
      Float("max_var_update", "max_var_update", 0.0, AtLeast(0, "0 disables it"), "caps |step| per element."),
      Float("max_accumulator", "max_accumulator", 0.0, AtLeast(0, "0 disables it"), "caps the accumulator."),
  }};
  static constexpr std::array<SlotArgumentSpec, 1> kSlotArguments{
      {SlotArgument("initial_accumulator_value", Above(0))}};
  static constexpr OptimizerSchema kValue = Entry<BoundedAdagrad>(
      Describe("BoundedAdagrad", schema_internal::kCatalogue,
               "Bounded Adagrad (our documented reading of the proto's parameters; see docs/optimizers.md).", 0.001),
      kHyperParameters, kSlotArguments);
};

// Online Yogi's beta2 in [0, 1), as Adam's and Proximal Yogi's: the proto asks for the bias correction to be folded
// into the learning rate as lr * sqrt(1 - beta2^t) / (1 - beta1^t), which is 0 for beta2 = 1.
template <>
struct SchemaOf<OnlineYogi> {
  static constexpr std::array<HyperParameterSpec, 3> kHyperParameters{{
      Float("l1", "l1_regularization_strength", 0.0, AtLeast(0), "L1 regularization strength."),
      Float("l2", "l2_regularization_strength", 0.0, AtLeast(0), "L2 regularization strength."),
      Float("beta2", "beta_2", 0.999, ClosedOpen(0, 1), "decay of the second moment."),
  }};
  static constexpr std::array<SlotArgumentSpec, 2> kSlotArguments{
      {SlotArgument("initial_v_value", Above(0)), SlotArgument("initial_linear_value")}};
  static constexpr OptimizerSchema kValue =
      Entry<OnlineYogi>(Describe("OnlineYogi", schema_internal::kCatalogue,
                                 "Online Yogi (our documented reading: FTRL-proximal with Yogi's second moment; see "
                                 "docs/optimizers.md).  No bias correction: fold it into a dynamic learning rate.",
                                 0.001),
                        kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<ProximalYogi> {
  static constexpr std::array<HyperParameterSpec, 5> kHyperParameters{{
      Float("l1", "l1_regularization_strength", 0.0, AtLeast(0), "L1 regularization strength."),
      Float("l2", "l2_regularization_strength", 0.0, AtLeast(0), "L2 regularization strength."),
      Float("beta1", "beta_1", 0.9, ClosedOpen(0, 1), "decay of the first moment."),
      Float("beta2", "beta_2", 0.999, ClosedOpen(0, 1), "decay of the second moment."),
      Float("epsilon", "epsilon", 1e-3, Above(0), "added to the denominator."),
  }};
  static constexpr std::array<SlotArgumentSpec, 2> kSlotArguments{
      {SlotArgument("initial_v_value"), SlotArgument("initial_m_value")}};
  static constexpr OptimizerSchema kValue = Entry<ProximalYogi>(
      Describe("ProximalYogi", schema_internal::kCatalogue,
               "Proximal Yogi (the public proximal Yogi rule, no bias correction; see docs/optimizers.md).", 0.001)
          .LoadOp("LoadTPUEmbeddingProximalYogiParameters"),
      kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<FrequencyEstimator> {
  static constexpr std::array<HyperParameterSpec, 4> kHyperParameters{{
      Float("tau", "tau", 0.01, Open(0, 1), "weight of the newest interval in the running average."),
      Float("max_delta", "max_delta", 1000.0, Above(0), "cap of an interval (and the table's initial value)."),
      Float("outlier_threshold", "outlier_threshold", 2.0, AtLeast(0),
            "an interval this many times the average replaces it."),
      Float("weight_exponent", "weight_exponent", 1.0, AnyFinite(),
            "the exponent of the `(delta / max_delta) ** weight_exponent` weight transform."),
  }};
  static constexpr std::array<SlotArgumentSpec, 1> kSlotArguments{{SlotArgument("initial_last_hit_step")}};
  static constexpr OptimizerSchema kValue = Entry<FrequencyEstimator>(
      Describe("FrequencyEstimator", schema_internal::kCatalogue,
               "Frequency estimator: the table row holds D, the average number of steps between hits of the row.  "
               "The current global step arrives as the table's learning rate, which must therefore be a callable "
               "returning it (as TPUEstimator passed `float(global_step)`); the gradient is ignored.  Initialise "
               "the table to `max_delta` (e.g. `TableConfig(initializer=tf.constant_initializer(max_delta))`); dim 1 "
               "as on TPU.",
               0.0)
          .DynamicLearningRate("a zero-argument callable returning the current global step.")
          .LoadOp("LoadTPUEmbeddingFrequencyEstimatorParameters"),
      kHyperParameters, kSlotArguments);
};

template <>
struct SchemaOf<Assign> {
  static constexpr std::array<HyperParameterSpec, 0> kHyperParameters{};
  static constexpr std::array<SlotArgumentSpec, 0> kSlotArguments{};
  static constexpr OptimizerSchema kValue = Entry<Assign>(
      Describe("Assign", schema_internal::kCatalogue,
               "Assign: `w = g` (the row's summed gradient).  The learning rate is unused.", 1.0)
          .LearningRateDoc("unused (any float or callable).")
          .AlwaysNeedsAccumulation(
              "assign needs gradient accumulation (it assigns the row's summed gradient; without accumulation the "
              "result would be whichever contribution of the row came last)"),
      kHyperParameters, kSlotArguments);
};

// ---- not in the TPU proto: carried in an extension field of OptimizationParameters ----

// The OptimizationParameters field numbers tf_embed_ops claims for optimizers TensorFlow's proto lacks, far above
// TensorFlow's own (1-30 today) so that a field TensorFlow adds cannot collide.
inline constexpr int kRowWiseAdagradField = 100001;

// FBGEMM's row-wise Adagrad (fbgemm_gpu split_table_batched_embeddings_ops_training.py: eps defaults to 1e-8,
// weight_decay to 0).  epsilon > 0: the accumulator starts at 0, so epsilon alone keeps the first step finite for a
// zero gradient; weight_decay >= 0 as FBGEMM's modes use it; the accumulator's initial value >= 0 (its square root
// is taken).
template <>
struct SchemaOf<RowWiseAdagrad> {
  static constexpr std::array<HyperParameterSpec, 3> kHyperParameters{{
      Float("epsilon", "epsilon", 1e-8, Above(0), "added to the square root of the row's accumulator."),
      Float("weight_decay", "weight_decay", 0.0, AtLeast(0, "0 disables it"),
            "FBGEMM's weight decay: L2 (folded into the gradient) unless `decoupled_weight_decay`."),
      Bool("decoupled_weight_decay", "decoupled_weight_decay", false,
           "FBGEMM's DECOUPLED mode: `w *= 1 - lr * weight_decay` instead of L2."),
  }};
  static constexpr std::array<SlotArgumentSpec, 1> kSlotArguments{
      {SlotArgument("initial_accumulator_value", AtLeast(0))}};
  static constexpr OptimizerSchema kValue = Entry<RowWiseAdagrad>(
      Describe("RowWiseAdagrad", schema_internal::kCatalogue,
               "Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD): one accumulator per row, `a += mean(g^2); w -= "
               "lr * g / (sqrt(a) + epsilon)`.  Not a TPU optimizer: a config with it runs on tf_embed_ops' kernels "
               "but cannot be exported for a TPU.",
               0.01)
          .NotInTpuProto(kRowWiseAdagradField),
      kHyperParameters, kSlotArguments);
};

// Every optimizer's schema, index-aligned with OptimizerParams.
template <size_t... I>
constexpr std::array<OptimizerSchema, sizeof...(I)> MakeOptimizerSchemas(std::index_sequence<I...>) {
  return {SchemaOf<std::variant_alternative_t<I, OptimizerParams>>::kValue...};
}
inline constexpr std::array<OptimizerSchema, std::variant_size_v<OptimizerParams>> kOptimizerSchemas =
    MakeOptimizerSchemas(std::make_index_sequence<std::variant_size_v<OptimizerParams>>{});

// The schema of `kind` (a proto oneof field name), or nullptr when tf_embed_ops does not run it.
inline const OptimizerSchema* FindOptimizerSchema(std::string_view kind) {
  for (const OptimizerSchema& s : kOptimizerSchemas) {
    if (kind == s.kind) return &s;
  }
  return nullptr;
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SCHEMA_H_
