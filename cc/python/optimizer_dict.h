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
