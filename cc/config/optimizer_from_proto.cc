#include "cc/config/optimizer_from_proto.h"

#include <cmath>
#include <initializer_list>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {
namespace {

namespace tpu = ::tensorflow::tpu;

// Checks are written as "value is in range" so that NaN, which fails every comparison, is rejected too.
absl::Status Require(bool ok, const std::string& context, const std::string& field, float value, const char* allowed) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(context, ": optimization_parameters.", field, " must be ", allowed, ", got ", value));
}

absl::Status FromAdagradMomentum(const tpu::AdagradMomentumParameters& m, const std::string& ctx,
                                 OptimizerParams* out) {
  // TF's AdagradMomentum raises for exponent <= 0 and epsilon <= 0 (a zero epsilon divides 0 by 0 on the
  // first update of an untouched accumulator).
  if (auto s = Require(m.exponent() > 0.0f && std::isfinite(m.exponent()), ctx, "adagrad_momentum.exponent",
                       m.exponent(), "> 0 and finite");
      !s.ok())
    return s;
  if (auto s = Require(m.epsilon() > 0.0f && std::isfinite(m.epsilon()), ctx, "adagrad_momentum.epsilon", m.epsilon(),
                       "> 0 and finite");
      !s.ok())
    return s;
  if (auto s = Require(std::isfinite(m.momentum()), ctx, "adagrad_momentum.momentum", m.momentum(), "finite"); !s.ok())
    return s;
  if (auto s = Require(std::isfinite(m.beta2()), ctx, "adagrad_momentum.beta2", m.beta2(), "finite"); !s.ok()) return s;
  AdagradMomentum o;
  o.momentum = m.momentum();
  o.use_nesterov = m.use_nesterov();
  o.exponent = m.exponent();
  o.beta2 = m.beta2();
  o.epsilon = m.epsilon();
  *out = o;
  return absl::OkStatus();
}

absl::Status FromAdam(const tpu::AdamParameters& m, const std::string& ctx, OptimizerParams* out) {
  // Same ranges as TF's Adam: betas in [0, 1), epsilon > 0.
  if (auto s = Require(m.beta1() >= 0.0f && m.beta1() < 1.0f, ctx, "adam.beta1", m.beta1(), "in [0, 1)"); !s.ok())
    return s;
  if (auto s = Require(m.beta2() >= 0.0f && m.beta2() < 1.0f, ctx, "adam.beta2", m.beta2(), "in [0, 1)"); !s.ok())
    return s;
  if (auto s =
          Require(m.epsilon() > 0.0f && std::isfinite(m.epsilon()), ctx, "adam.epsilon", m.epsilon(), "> 0 and finite");
      !s.ok())
    return s;
  Adam o;
  o.beta1 = m.beta1();
  o.beta2 = m.beta2();
  o.epsilon = m.epsilon();
  o.use_non_lazy_adam = m.use_non_lazy_adam();
  o.use_sum_inside_sqrt = m.use_sum_inside_sqrt();
  *out = o;
  return absl::OkStatus();
}

absl::Status FromFtrl(const tpu::FtrlParameters& m, const std::string& ctx, OptimizerParams* out) {
  // TF's FTRL documents l1, l2 >= 0 and learning_rate_power <= 0 (a positive power makes the per-coordinate
  // step grow with the accumulated squared gradient).
  if (auto s = Require(m.l1() >= 0.0f && std::isfinite(m.l1()), ctx, "ftrl.l1", m.l1(), ">= 0 and finite"); !s.ok())
    return s;
  if (auto s = Require(m.l2() >= 0.0f && std::isfinite(m.l2()), ctx, "ftrl.l2", m.l2(), ">= 0 and finite"); !s.ok())
    return s;
  if (auto s = Require(m.lr_power() <= 0.0f && std::isfinite(m.lr_power()), ctx, "ftrl.lr_power", m.lr_power(),
                       "<= 0 and finite");
      !s.ok())
    return s;
  if (auto s = Require(m.beta() >= 0.0f && std::isfinite(m.beta()), ctx, "ftrl.beta", m.beta(), ">= 0 and finite");
      !s.ok())
    return s;
  Ftrl o;
  o.l1 = m.l1();
  o.l2 = m.l2();
  o.lr_power = m.lr_power();
  o.beta = m.beta();
  o.multiply_linear_by_lr = m.multiply_linear_by_lr();
  o.allow_zero_accumulator = m.allow_zero_accumulator();
  *out = o;
  return absl::OkStatus();
}

// Range checks of the rest of the catalogue, written as "value is in range" so NaN fails too.
bool Finite(float v) { return std::isfinite(v); }
bool NonNegative(float v) { return v >= 0.0f && std::isfinite(v); }
bool Positive(float v) { return v > 0.0f && std::isfinite(v); }
bool UnitClosed(float v) { return v >= 0.0f && v <= 1.0f; }
bool UnitHalfOpen(float v) { return v >= 0.0f && v < 1.0f; }

// A list of (check passed, field, value, allowed) evaluated in order; the first failure is the error.
struct FieldCheck {
  bool ok;
  const char* field;
  float value;
  const char* allowed;
};

absl::Status CheckAll(std::initializer_list<FieldCheck> checks, const std::string& ctx) {
  for (const FieldCheck& c : checks) {
    if (auto s = Require(c.ok, ctx, c.field, c.value, c.allowed); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FromCatalogue(const tpu::OptimizationParameters& params, const std::string& ctx, OptimizerParams* out) {
  switch (params.parameters_case()) {
    case tpu::OptimizationParameters::kMomentum: {
      const auto& m = params.momentum();
      if (auto s = CheckAll({{NonNegative(m.momentum()), "momentum.momentum", m.momentum(), ">= 0 and finite"}}, ctx);
          !s.ok())
        return s;
      *out = Momentum{m.momentum(), m.use_nesterov()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kRmsProp: {
      const auto& m = params.rms_prop();
      if (auto s = CheckAll({{UnitClosed(m.rho()), "rms_prop.rho", m.rho(), "in [0, 1]"},
                             {NonNegative(m.momentum()), "rms_prop.momentum", m.momentum(), ">= 0 and finite"},
                             {NonNegative(m.epsilon()), "rms_prop.epsilon", m.epsilon(), ">= 0 and finite"}},
                            ctx);
          !s.ok())
        return s;
      *out = RmsProp{m.rho(), m.momentum(), m.epsilon()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kCenteredRmsProp: {
      const auto& m = params.centered_rms_prop();
      if (auto s = CheckAll({{UnitClosed(m.rho()), "centered_rms_prop.rho", m.rho(), "in [0, 1]"},
                             {NonNegative(m.momentum()), "centered_rms_prop.momentum", m.momentum(), ">= 0 and finite"},
                             {NonNegative(m.epsilon()), "centered_rms_prop.epsilon", m.epsilon(), ">= 0 and finite"}},
                            ctx);
          !s.ok())
        return s;
      *out = CenteredRmsProp{m.rho(), m.momentum(), m.epsilon()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kAdadelta: {
      const auto& m = params.adadelta();
      if (auto s = CheckAll({{UnitClosed(m.rho()), "adadelta.rho", m.rho(), "in [0, 1]"},
                             {NonNegative(m.epsilon()), "adadelta.epsilon", m.epsilon(), ">= 0 and finite"}},
                            ctx);
          !s.ok())
        return s;
      *out = Adadelta{m.rho(), m.epsilon()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kProximalAdagrad: {
      const auto& m = params.proximal_adagrad();
      if (auto s = CheckAll({{NonNegative(m.l1()), "proximal_adagrad.l1", m.l1(), ">= 0 and finite"},
                             {NonNegative(m.l2()), "proximal_adagrad.l2", m.l2(), ">= 0 and finite"}},
                            ctx);
          !s.ok())
        return s;
      *out = ProximalAdagrad{m.l1(), m.l2()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kLion: {
      const auto& m = params.lion();
      if (auto s = CheckAll({{UnitClosed(m.beta1()), "lion.beta1", m.beta1(), "in [0, 1]"},
                             {UnitClosed(m.beta2()), "lion.beta2", m.beta2(), "in [0, 1]"}},
                            ctx);
          !s.ok())
        return s;
      *out = Lion{m.beta1(), m.beta2(), m.use_non_lazy_lion()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kBoundedAdagrad: {
      const auto& m = params.bounded_adagrad();
      if (auto s = CheckAll({{NonNegative(m.max_var_update()), "bounded_adagrad.max_var_update", m.max_var_update(),
                              ">= 0 and finite (0 disables it)"},
                             {NonNegative(m.max_accumulator()), "bounded_adagrad.max_accumulator", m.max_accumulator(),
                              ">= 0 and finite (0 disables it)"}},
                            ctx);
          !s.ok())
        return s;
      *out = BoundedAdagrad{m.update_accumulator_first(), m.max_var_update(), m.max_accumulator()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kOnlineYogi: {
      const auto& m = params.online_yogi();
      if (auto s = CheckAll({{NonNegative(m.l1()), "online_yogi.l1", m.l1(), ">= 0 and finite"},
                             {NonNegative(m.l2()), "online_yogi.l2", m.l2(), ">= 0 and finite"},
                             {UnitClosed(m.beta2()), "online_yogi.beta2", m.beta2(), "in [0, 1]"}},
                            ctx);
          !s.ok())
        return s;
      *out = OnlineYogi{m.l1(), m.l2(), m.beta2()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kProximalYogi: {
      const auto& m = params.proximal_yogi();
      if (auto s = CheckAll({{NonNegative(m.l1()), "proximal_yogi.l1", m.l1(), ">= 0 and finite"},
                             {NonNegative(m.l2()), "proximal_yogi.l2", m.l2(), ">= 0 and finite"},
                             {UnitHalfOpen(m.beta1()), "proximal_yogi.beta1", m.beta1(), "in [0, 1)"},
                             {UnitHalfOpen(m.beta2()), "proximal_yogi.beta2", m.beta2(), "in [0, 1)"},
                             {Positive(m.epsilon()), "proximal_yogi.epsilon", m.epsilon(), "> 0 and finite"}},
                            ctx);
          !s.ok())
        return s;
      *out = ProximalYogi{m.l1(), m.l2(), m.beta1(), m.beta2(), m.epsilon()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kFrequencyEstimator: {
      const auto& m = params.frequency_estimator();
      if (auto s = CheckAll(
              {{m.tau() > 0.0f && m.tau() < 1.0f, "frequency_estimator.tau", m.tau(), "in (0, 1)"},
               {Positive(m.max_delta()), "frequency_estimator.max_delta", m.max_delta(), "> 0 and finite"},
               {NonNegative(m.outlier_threshold()), "frequency_estimator.outlier_threshold", m.outlier_threshold(),
                ">= 0 and finite"},
               {Finite(m.weight_exponent()), "frequency_estimator.weight_exponent", m.weight_exponent(), "finite"}},
              ctx);
          !s.ok())
        return s;
      // The global step arrives as the table's learning rate (TPUEstimator passed float(global_step)); a
      // constant would freeze the estimate's clock.
      if (!params.learning_rate().has_dynamic()) {
        return absl::InvalidArgumentError(
            absl::StrCat(ctx,
                         ": frequency_estimator takes the current global step as its learning rate, so "
                         "optimization_parameters.learning_rate must be dynamic (a tag), got constant ",
                         params.learning_rate().constant()));
      }
      *out = FrequencyEstimator{m.tau(), m.max_delta(), m.outlier_threshold(), m.weight_exponent()};
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kAssign:
      *out = Assign{};
      return absl::OkStatus();
    default:
      return absl::InternalError(absl::StrCat(ctx, ": FromCatalogue called for a non-catalogue optimizer"));
  }
}

}  // namespace

absl::Status OptimizerFromProto(const tpu::OptimizationParameters& params, const std::string& context,
                                OptimizerParams* out) {
  switch (params.parameters_case()) {
    case tpu::OptimizationParameters::kStochasticGradientDescent:
      *out = Sgd{};
      return absl::OkStatus();
    case tpu::OptimizationParameters::kAdagrad:
      *out = Adagrad{};
      return absl::OkStatus();
    case tpu::OptimizationParameters::kAdagradMomentum:
      return FromAdagradMomentum(params.adagrad_momentum(), context, out);
    case tpu::OptimizationParameters::kAdam:
      return FromAdam(params.adam(), context, out);
    case tpu::OptimizationParameters::kFtrl:
      return FromFtrl(params.ftrl(), context, out);
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
      return FromCatalogue(params, context, out);
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
