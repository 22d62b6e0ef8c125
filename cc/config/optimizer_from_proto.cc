#include "cc/config/optimizer_from_proto.h"

#include <cmath>
#include <initializer_list>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {
namespace {

namespace tpu = ::tensorflow::tpu;

// Range checks, written as "value is in range" so that NaN, which fails every comparison, is rejected too.
bool Finite(float v) { return std::isfinite(v); }
bool NonNegative(float v) { return v >= 0.0f && std::isfinite(v); }
bool Positive(float v) { return v > 0.0f && std::isfinite(v); }
bool UnitClosed(float v) { return v >= 0.0f && v <= 1.0f; }
bool UnitHalfOpen(float v) { return v >= 0.0f && v < 1.0f; }

// One (check passed, field, value, allowed) entry; Set() evaluates them in order and the first failure is the
// error, which names the field, the allowed range and the value.
struct FieldCheck {
  bool ok;
  const char* field;
  float value;
  const char* allowed;
};

// *out = optimizer once every check has passed.
template <typename Optimizer>
absl::Status Set(const std::string& ctx, std::initializer_list<FieldCheck> checks, const Optimizer& optimizer,
                 OptimizerParams* out) {
  for (const FieldCheck& c : checks) {
    if (!c.ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(ctx, ": optimization_parameters.", c.field, " must be ", c.allowed, ", got ", c.value));
    }
  }
  *out = optimizer;
  return absl::OkStatus();
}

// The optimizers we implement, with the same ranges as TensorFlow's own optimizers where it has one.
absl::Status FromImplemented(const tpu::OptimizationParameters& params, const std::string& ctx, OptimizerParams* out) {
  switch (params.parameters_case()) {
    case tpu::OptimizationParameters::kStochasticGradientDescent:
      return Set(ctx, {}, Sgd{}, out);
    case tpu::OptimizationParameters::kAdagrad:
      return Set(ctx, {}, Adagrad{}, out);
    case tpu::OptimizationParameters::kAdagradMomentum: {
      // TF's AdagradMomentum raises for exponent <= 0 and epsilon <= 0 (a zero epsilon divides 0 by 0 on the
      // first update of an untouched accumulator).
      const auto& m = params.adagrad_momentum();
      return Set(ctx,
                 {{Positive(m.exponent()), "adagrad_momentum.exponent", m.exponent(), "> 0 and finite"},
                  {Positive(m.epsilon()), "adagrad_momentum.epsilon", m.epsilon(), "> 0 and finite"},
                  {Finite(m.momentum()), "adagrad_momentum.momentum", m.momentum(), "finite"},
                  {Finite(m.beta2()), "adagrad_momentum.beta2", m.beta2(), "finite"}},
                 AdagradMomentum{m.momentum(), m.use_nesterov(), m.exponent(), m.beta2(), m.epsilon()}, out);
    }
    case tpu::OptimizationParameters::kAdam: {
      // Same ranges as TF's Adam: betas in [0, 1), epsilon > 0.
      const auto& m = params.adam();
      return Set(ctx,
                 {{UnitHalfOpen(m.beta1()), "adam.beta1", m.beta1(), "in [0, 1)"},
                  {UnitHalfOpen(m.beta2()), "adam.beta2", m.beta2(), "in [0, 1)"},
                  {Positive(m.epsilon()), "adam.epsilon", m.epsilon(), "> 0 and finite"}},
                 Adam{m.beta1(), m.beta2(), m.epsilon(), m.use_non_lazy_adam(), m.use_sum_inside_sqrt()}, out);
    }
    case tpu::OptimizationParameters::kFtrl: {
      // TF's FTRL documents l1, l2 >= 0 and learning_rate_power <= 0 (a positive power makes the per-coordinate
      // step grow with the accumulated squared gradient).
      const auto& m = params.ftrl();
      return Set(
          ctx,
          {{NonNegative(m.l1()), "ftrl.l1", m.l1(), ">= 0 and finite"},
           {NonNegative(m.l2()), "ftrl.l2", m.l2(), ">= 0 and finite"},
           {m.lr_power() <= 0.0f && std::isfinite(m.lr_power()), "ftrl.lr_power", m.lr_power(), "<= 0 and finite"},
           {NonNegative(m.beta()), "ftrl.beta", m.beta(), ">= 0 and finite"}},
          Ftrl{m.l1(), m.l2(), m.lr_power(), m.beta(), m.multiply_linear_by_lr(), m.allow_zero_accumulator()}, out);
    }
    case tpu::OptimizationParameters::kMomentum: {
      const auto& m = params.momentum();
      return Set(ctx, {{NonNegative(m.momentum()), "momentum.momentum", m.momentum(), ">= 0 and finite"}},
                 Momentum{m.momentum(), m.use_nesterov()}, out);
    }
    case tpu::OptimizationParameters::kRmsProp: {
      const auto& m = params.rms_prop();
      return Set(ctx,
                 {{UnitClosed(m.rho()), "rms_prop.rho", m.rho(), "in [0, 1]"},
                  {NonNegative(m.momentum()), "rms_prop.momentum", m.momentum(), ">= 0 and finite"},
                  {NonNegative(m.epsilon()), "rms_prop.epsilon", m.epsilon(), ">= 0 and finite"}},
                 RmsProp{m.rho(), m.momentum(), m.epsilon()}, out);
    }
    case tpu::OptimizationParameters::kCenteredRmsProp: {
      const auto& m = params.centered_rms_prop();
      return Set(ctx,
                 {{UnitClosed(m.rho()), "centered_rms_prop.rho", m.rho(), "in [0, 1]"},
                  {NonNegative(m.momentum()), "centered_rms_prop.momentum", m.momentum(), ">= 0 and finite"},
                  {NonNegative(m.epsilon()), "centered_rms_prop.epsilon", m.epsilon(), ">= 0 and finite"}},
                 CenteredRmsProp{m.rho(), m.momentum(), m.epsilon()}, out);
    }
    case tpu::OptimizationParameters::kAdadelta: {
      const auto& m = params.adadelta();
      return Set(ctx,
                 {{UnitClosed(m.rho()), "adadelta.rho", m.rho(), "in [0, 1]"},
                  {NonNegative(m.epsilon()), "adadelta.epsilon", m.epsilon(), ">= 0 and finite"}},
                 Adadelta{m.rho(), m.epsilon()}, out);
    }
    case tpu::OptimizationParameters::kProximalAdagrad: {
      const auto& m = params.proximal_adagrad();
      return Set(ctx,
                 {{NonNegative(m.l1()), "proximal_adagrad.l1", m.l1(), ">= 0 and finite"},
                  {NonNegative(m.l2()), "proximal_adagrad.l2", m.l2(), ">= 0 and finite"}},
                 ProximalAdagrad{m.l1(), m.l2()}, out);
    }
    case tpu::OptimizationParameters::kLion: {
      const auto& m = params.lion();
      return Set(ctx,
                 {{UnitClosed(m.beta1()), "lion.beta1", m.beta1(), "in [0, 1]"},
                  {UnitClosed(m.beta2()), "lion.beta2", m.beta2(), "in [0, 1]"}},
                 Lion{m.beta1(), m.beta2(), m.use_non_lazy_lion()}, out);
    }
    case tpu::OptimizationParameters::kBoundedAdagrad: {
      const auto& m = params.bounded_adagrad();
      return Set(ctx,
                 {{NonNegative(m.max_var_update()), "bounded_adagrad.max_var_update", m.max_var_update(),
                   ">= 0 and finite (0 disables it)"},
                  {NonNegative(m.max_accumulator()), "bounded_adagrad.max_accumulator", m.max_accumulator(),
                   ">= 0 and finite (0 disables it)"}},
                 BoundedAdagrad{m.update_accumulator_first(), m.max_var_update(), m.max_accumulator()}, out);
    }
    case tpu::OptimizationParameters::kOnlineYogi: {
      const auto& m = params.online_yogi();
      return Set(ctx,
                 {{NonNegative(m.l1()), "online_yogi.l1", m.l1(), ">= 0 and finite"},
                  {NonNegative(m.l2()), "online_yogi.l2", m.l2(), ">= 0 and finite"},
                  {UnitClosed(m.beta2()), "online_yogi.beta2", m.beta2(), "in [0, 1]"}},
                 OnlineYogi{m.l1(), m.l2(), m.beta2()}, out);
    }
    case tpu::OptimizationParameters::kProximalYogi: {
      const auto& m = params.proximal_yogi();
      return Set(ctx,
                 {{NonNegative(m.l1()), "proximal_yogi.l1", m.l1(), ">= 0 and finite"},
                  {NonNegative(m.l2()), "proximal_yogi.l2", m.l2(), ">= 0 and finite"},
                  {UnitHalfOpen(m.beta1()), "proximal_yogi.beta1", m.beta1(), "in [0, 1)"},
                  {UnitHalfOpen(m.beta2()), "proximal_yogi.beta2", m.beta2(), "in [0, 1)"},
                  {Positive(m.epsilon()), "proximal_yogi.epsilon", m.epsilon(), "> 0 and finite"}},
                 ProximalYogi{m.l1(), m.l2(), m.beta1(), m.beta2(), m.epsilon()}, out);
    }
    case tpu::OptimizationParameters::kFrequencyEstimator: {
      const auto& m = params.frequency_estimator();
      // The global step arrives as the table's learning rate (TPUEstimator passed float(global_step)); a
      // constant would freeze the estimate's clock.
      if (!params.learning_rate().has_dynamic()) {
        return absl::InvalidArgumentError(
            absl::StrCat(ctx,
                         ": frequency_estimator takes the current global step as its learning rate, so "
                         "optimization_parameters.learning_rate must be dynamic (a tag), got constant ",
                         params.learning_rate().constant()));
      }
      return Set(ctx,
                 {{m.tau() > 0.0f && m.tau() < 1.0f, "frequency_estimator.tau", m.tau(), "in (0, 1)"},
                  {Positive(m.max_delta()), "frequency_estimator.max_delta", m.max_delta(), "> 0 and finite"},
                  {NonNegative(m.outlier_threshold()), "frequency_estimator.outlier_threshold", m.outlier_threshold(),
                   ">= 0 and finite"},
                  {Finite(m.weight_exponent()), "frequency_estimator.weight_exponent", m.weight_exponent(), "finite"}},
                 FrequencyEstimator{m.tau(), m.max_delta(), m.outlier_threshold(), m.weight_exponent()}, out);
    }
    case tpu::OptimizationParameters::kAssign:
      return Set(ctx, {}, Assign{}, out);
    default:
      return absl::InternalError(absl::StrCat(ctx, ": FromImplemented called for an optimizer we do not implement"));
  }
}

}  // namespace

absl::Status OptimizerFromProto(const tpu::OptimizationParameters& params, const std::string& context,
                                OptimizerParams* out) {
  switch (params.parameters_case()) {
    case tpu::OptimizationParameters::kStochasticGradientDescent:
    case tpu::OptimizationParameters::kAdagrad:
    case tpu::OptimizationParameters::kAdagradMomentum:
    case tpu::OptimizationParameters::kAdam:
    case tpu::OptimizationParameters::kFtrl:
    case tpu::OptimizationParameters::kMomentum:
    case tpu::OptimizationParameters::kRmsProp:
    case tpu::OptimizationParameters::kCenteredRmsProp:
    case tpu::OptimizationParameters::kAdadelta:
    case tpu::OptimizationParameters::kProximalAdagrad:
    case tpu::OptimizationParameters::kLion:
    case tpu::OptimizationParameters::kBoundedAdagrad:
    case tpu::OptimizationParameters::kOnlineYogi:
    case tpu::OptimizationParameters::kProximalYogi:
    case tpu::OptimizationParameters::kFrequencyEstimator:
    case tpu::OptimizationParameters::kAssign:
      return FromImplemented(params, context, out);
    case tpu::OptimizationParameters::kMdlAdagradLight:
      return absl::UnimplementedError(absl::StrCat(
          context,
          ": optimizer 'mdl_adagrad_light' is not implemented by tf_embed_ops: its update rule is not public"));
    case tpu::OptimizationParameters::kFrequencyAwareAdagrad:
      return absl::UnimplementedError(absl::StrCat(
          context,
          ": optimizer 'frequency_aware_adagrad' is not implemented by tf_embed_ops: the proto's description of its "
          "update is garbled (it multiplies by the gradient twice) and no implementation is public, so any reading "
          "could silently differ from TPU"));
    case tpu::OptimizationParameters::kUserDefinedProgram:
      return absl::UnimplementedError(absl::StrCat(
          context,
          ": optimizer 'user_defined_program' is not implemented by tf_embed_ops: it is an XLA HLO program, and "
          "TensorFlow's CPU package offers custom ops no HLO interpreter to run it"));
    case tpu::OptimizationParameters::PARAMETERS_NOT_SET:
      return absl::InvalidArgumentError(absl::StrCat(
          context,
          ": no optimization algorithm specified (optimization_parameters.parameters is not set; expected one of "
          "stochastic_gradient_descent, adagrad, adagrad_momentum, adam, ftrl, momentum, rms_prop, centered_rms_prop, "
          "adadelta, proximal_adagrad, lion, bounded_adagrad, online_yogi, proximal_yogi, frequency_estimator, "
          "assign)"));
    default: {
      // Name the algorithm by its proto field, which is what the user wrote in a .pbtxt.
      const auto* field = params.GetDescriptor()->FindFieldByNumber(static_cast<int>(params.parameters_case()));
      const std::string name = field != nullptr ? std::string(field->name())
                                                : absl::StrCat("field ", static_cast<int>(params.parameters_case()));
      return absl::UnimplementedError(
          absl::StrCat(context, ": optimizer '", name, "' is not implemented by tf_embed_ops"));
    }
  }
}

}  // namespace tf_embed_ops
