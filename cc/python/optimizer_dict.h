// The optimizer structs of cc/lib as Python dicts: kind (the proto field name), hyper-parameters (the struct's
// ForEachHyperParameter, named as in the proto), slots in Load/Retrieve order with their default initial values.
// A new optimizer needs nothing here.
#ifndef TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_
#define TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_

#include <pybind11/pybind11.h>

#include <utility>
#include <variant>

#include "cc/lib/optimizers/registry.h"

namespace tf_embed_ops {

template <typename Optimizer>
pybind11::dict HyperParameters(const Optimizer& o) {
  pybind11::dict d;
  o.ForEachHyperParameter([&d](const char* name, auto value) { d[name] = value; });
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
