#include "cc/config/optimizer_from_proto.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {
namespace {

namespace tpu = ::tensorflow::tpu;

// Checks are written as "value is in range" so that NaN, which fails every comparison, is rejected too.
absl::Status Require(bool ok, const std::string& context, const std::string& field, float value,
                     const char* allowed) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(context, ": optimization_parameters.", field, " must be ", allowed,
                                                 ", got ", value));
}

absl::Status FromAdagradMomentum(const tpu::AdagradMomentumParameters& m, const std::string& ctx,
                                 OptimizerParams* out) {
  // TF's AdagradMomentum raises for exponent <= 0 and epsilon <= 0 (a zero epsilon divides 0 by 0 on the
  // first update of an untouched accumulator).
  if (auto s = Require(m.exponent() > 0.0f && std::isfinite(m.exponent()), ctx, "adagrad_momentum.exponent",
                       m.exponent(), "> 0 and finite");
      !s.ok())
    return s;
  if (auto s = Require(m.epsilon() > 0.0f && std::isfinite(m.epsilon()), ctx, "adagrad_momentum.epsilon",
                       m.epsilon(), "> 0 and finite");
      !s.ok())
    return s;
  if (auto s = Require(std::isfinite(m.momentum()), ctx, "adagrad_momentum.momentum", m.momentum(), "finite");
      !s.ok())
    return s;
  if (auto s = Require(std::isfinite(m.beta2()), ctx, "adagrad_momentum.beta2", m.beta2(), "finite"); !s.ok())
    return s;
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
  if (auto s = Require(m.epsilon() > 0.0f && std::isfinite(m.epsilon()), ctx, "adam.epsilon", m.epsilon(),
                       "> 0 and finite");
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
    case tpu::OptimizationParameters::PARAMETERS_NOT_SET:
      return absl::InvalidArgumentError(absl::StrCat(
          context,
          ": no optimization algorithm specified (optimization_parameters.parameters is not set; expected one of "
          "stochastic_gradient_descent, adagrad, adagrad_momentum, adam, ftrl)"));
    default: {
      // Name the algorithm by its proto field, which is what the user wrote in a .pbtxt.
      const auto* field = params.GetDescriptor()->FindFieldByNumber(static_cast<int>(params.parameters_case()));
      const std::string name = field != nullptr ? std::string(field->name())
                                                : absl::StrCat("field ", static_cast<int>(params.parameters_case()));
      return absl::UnimplementedError(absl::StrCat(
          context, ": optimizer '", name,
          "' is not implemented by tf_embed_ops (supported: stochastic_gradient_descent, adagrad, adagrad_momentum, "
          "adam, ftrl)"));
    }
  }
}

}  // namespace tf_embed_ops
