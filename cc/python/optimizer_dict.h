// The optimizer structs of cc/lib as Python dicts: kind (the proto field name), hyper-parameters (the struct's
// fields, named as in the proto), slots in Load/Retrieve order with their default initial values.  A new
// optimizer adds one HyperParameters overload here.
#ifndef TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_
#define TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_

#include <pybind11/pybind11.h>

#include <utility>
#include <variant>

#include "cc/lib/optimizers/registry.h"

namespace tf_embed_ops {

inline pybind11::dict HyperParameters(const Sgd&) { return pybind11::dict(); }
inline pybind11::dict HyperParameters(const Adagrad&) { return pybind11::dict(); }

inline pybind11::dict HyperParameters(const AdagradMomentum& o) {
  pybind11::dict d;
  d["momentum"] = o.momentum;
  d["use_nesterov"] = o.use_nesterov;
  d["exponent"] = o.exponent;
  d["beta2"] = o.beta2;
  d["epsilon"] = o.epsilon;
  return d;
}

inline pybind11::dict HyperParameters(const Adam& o) {
  pybind11::dict d;
  d["beta1"] = o.beta1;
  d["beta2"] = o.beta2;
  d["epsilon"] = o.epsilon;
  d["use_non_lazy_adam"] = o.use_non_lazy_adam;
  d["use_sum_inside_sqrt"] = o.use_sum_inside_sqrt;
  return d;
}

inline pybind11::dict HyperParameters(const Ftrl& o) {
  pybind11::dict d;
  d["l1"] = o.l1;
  d["l2"] = o.l2;
  d["lr_power"] = o.lr_power;
  d["beta"] = o.beta;
  d["multiply_linear_by_lr"] = o.multiply_linear_by_lr;
  d["allow_zero_accumulator"] = o.allow_zero_accumulator;
  return d;
}

// The rest of the catalogue (docs/optimizers.md); field names as in optimization_parameters.proto.
inline pybind11::dict HyperParameters(const Momentum& o) {
  pybind11::dict d;
  d["momentum"] = o.momentum;
  d["use_nesterov"] = o.use_nesterov;
  return d;
}

template <typename RmsPropLike>
pybind11::dict RmsPropHyperParameters(const RmsPropLike& o) {
  pybind11::dict d;
  d["rho"] = o.rho;
  d["momentum"] = o.momentum;
  d["epsilon"] = o.epsilon;
  return d;
}
inline pybind11::dict HyperParameters(const RmsProp& o) { return RmsPropHyperParameters(o); }
inline pybind11::dict HyperParameters(const CenteredRmsProp& o) { return RmsPropHyperParameters(o); }

inline pybind11::dict HyperParameters(const Adadelta& o) {
  pybind11::dict d;
  d["rho"] = o.rho;
  d["epsilon"] = o.epsilon;
  return d;
}

inline pybind11::dict HyperParameters(const ProximalAdagrad& o) {
  pybind11::dict d;
  d["l1"] = o.l1;
  d["l2"] = o.l2;
  return d;
}

inline pybind11::dict HyperParameters(const Lion& o) {
  pybind11::dict d;
  d["beta1"] = o.beta1;
  d["beta2"] = o.beta2;
  d["use_non_lazy_lion"] = o.use_non_lazy_lion;
  return d;
}

inline pybind11::dict HyperParameters(const BoundedAdagrad& o) {
  pybind11::dict d;
  d["update_accumulator_first"] = o.update_accumulator_first;
  d["max_var_update"] = o.max_var_update;
  d["max_accumulator"] = o.max_accumulator;
  return d;
}

inline pybind11::dict HyperParameters(const OnlineYogi& o) {
  pybind11::dict d;
  d["l1"] = o.l1;
  d["l2"] = o.l2;
  d["beta2"] = o.beta2;
  return d;
}

inline pybind11::dict HyperParameters(const ProximalYogi& o) {
  pybind11::dict d;
  d["l1"] = o.l1;
  d["l2"] = o.l2;
  d["beta1"] = o.beta1;
  d["beta2"] = o.beta2;
  d["epsilon"] = o.epsilon;
  return d;
}

inline pybind11::dict HyperParameters(const FrequencyEstimator& o) {
  pybind11::dict d;
  d["tau"] = o.tau;
  d["max_delta"] = o.max_delta;
  d["outlier_threshold"] = o.outlier_threshold;
  d["weight_exponent"] = o.weight_exponent;
  return d;
}

inline pybind11::dict HyperParameters(const Assign&) { return pybind11::dict(); }

template <typename Optimizer>
pybind11::list Slots() {
  pybind11::list slots;
  for (const SlotInfo& s : Optimizer::kSlots) slots.append(pybind11::make_tuple(s.name, s.default_initial_value));
  return slots;
}

inline pybind11::dict OptimizerDict(const OptimizerParams& params) {
  return std::visit(
      [](const auto& o) {
        using Optimizer = std::decay_t<decltype(o)>;
        pybind11::dict d;
        d["kind"] = Optimizer::kName;
        d["hyperparameters"] = HyperParameters(o);
        d["slots"] = Slots<Optimizer>();
        d["updates_all_rows"] = o.UpdatesAllRows();
        return d;
      },
      params);
}

// {kind: [(slot, default initial value), ...]} for every alternative of OptimizerParams.
template <size_t... I>
pybind11::dict SupportedOptimizersImpl(std::index_sequence<I...>) {
  pybind11::dict d;
  ((d[std::variant_alternative_t<I, OptimizerParams>::kName] = Slots<std::variant_alternative_t<I, OptimizerParams>>()),
   ...);
  return d;
}

inline pybind11::dict SupportedOptimizers() {
  return SupportedOptimizersImpl(std::make_index_sequence<std::variant_size_v<OptimizerParams>>{});
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_
