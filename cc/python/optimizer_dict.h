// The optimizers as Python data.  OptimizerDict: a validated table's optimizer (kind = the proto field name,
// hyper-parameters by proto field name from registry.h's ForEachHyperParameter, slots in Load/Retrieve order with
// their default initial values).  OptimizerSchemaList: the whole schema (cc/lib/optimizers/schema.h), from which
// tf_embed_ops builds its optimizer classes, argument checks, docstrings and proto mapping.  A new optimizer
// needs nothing here.
#ifndef TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_
#define TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_

#include <pybind11/pybind11.h>

#include <cmath>
#include <variant>

#include "cc/lib/optimizers/registry.h"

namespace tf_embed_ops {

template <typename Optimizer>
pybind11::dict HyperParameters(const Optimizer& o) {
  pybind11::dict d;
  ForEachHyperParameter(o, [&d](const char* name, auto value) { d[name] = value; });
  return d;
}

// (name, default initial value, per_row) per slot.
inline pybind11::list Slots(Span<SlotInfo> slots) {
  pybind11::list out;
  for (const SlotInfo& s : slots) out.append(pybind11::make_tuple(s.name, s.default_initial_value, s.per_row));
  return out;
}

inline pybind11::dict OptimizerDict(const OptimizerParams& params) {
  return std::visit(
      [&params](const auto& o) {
        pybind11::dict d;
        d["kind"] = o.kName;
        d["hyperparameters"] = HyperParameters(o);
        d["slots"] = Slots(SchemaFor(params).slots);
        d["updates_all_rows"] = o.UpdatesAllRows();
        return d;
      },
      params);
}

// {kind: [(slot, default initial value), ...]} for every optimizer the kernels run.
inline pybind11::dict SupportedOptimizers() {
  pybind11::dict d;
  for (const OptimizerSchema& s : kOptimizerSchemas) d[s.kind] = Slots(s.slots);
  return d;
}

// A Range as {lower, lower_inclusive, upper, upper_inclusive, finite, text}; an absent bound is None.
inline pybind11::dict RangeDict(const Range& r) {
  pybind11::dict d;
  d["lower"] = r.lower.present ? pybind11::object(pybind11::float_(r.lower.value)) : pybind11::none();
  d["lower_inclusive"] = r.lower.inclusive;
  d["upper"] = r.upper.present ? pybind11::object(pybind11::float_(r.upper.value)) : pybind11::none();
  d["upper_inclusive"] = r.upper.inclusive;
  d["finite"] = r.finite;
  d["text"] = r.Describe();
  return d;
}

inline pybind11::dict OptimizerSchemaDict(const OptimizerSchema& s) {
  pybind11::list hyper_parameters;
  for (const HyperParameterSpec& h : s.hyper_parameters) {
    pybind11::dict d;
    d["proto_name"] = h.proto_name;
    d["python_name"] = h.python_name;
    d["type"] = h.type == ValueType::kFloat ? "float" : "bool";
    d["python_default"] = h.type == ValueType::kFloat ? pybind11::object(pybind11::float_(h.python_default))
                                                      : pybind11::object(pybind11::bool_(h.python_default != 0.0));
    d["range"] = RangeDict(h.range);
    d["python_negated"] = h.python_negated;
    d["doc"] = h.doc;
    hyper_parameters.append(d);
  }
  pybind11::list slots;
  for (size_t i = 0; i < s.slots.size; ++i) {
    pybind11::dict d;
    d["name"] = s.slots[i].name;
    d["default_initial_value"] = s.slots[i].default_initial_value;
    d["per_row"] = s.slots[i].per_row;
    const SlotArgumentSpec& arg = s.slot_arguments[i];
    d["python_name"] = arg.python_name != nullptr ? pybind11::object(pybind11::str(arg.python_name)) : pybind11::none();
    d["range"] = RangeDict(arg.range);
    slots.append(d);
  }
  pybind11::dict accumulation;
  accumulation["always"] = s.accumulation.always;
  accumulation["when_set"] =
      s.accumulation.when_set != nullptr ? pybind11::object(pybind11::str(s.accumulation.when_set)) : pybind11::none();
  accumulation["reason"] = s.accumulation.reason;
  pybind11::dict d;
  d["kind"] = s.kind;
  d["python_class"] = s.python_class;
  d["origin"] = s.origin == PythonClassOrigin::kTensorFlow ? "tensorflow" : "catalogue";
  d["summary"] = s.summary;
  d["default_learning_rate"] = std::isnan(s.default_learning_rate)
                                   ? pybind11::none()
                                   : pybind11::object(pybind11::float_(s.default_learning_rate));
  d["learning_rate_doc"] = s.learning_rate_doc;
  d["needs_dynamic_learning_rate"] = s.needs_dynamic_learning_rate;
  d["load_op"] = s.load_op;
  d["extension_field"] = s.extension_field;
  d["accumulation"] = accumulation;
  d["hyper_parameters"] = hyper_parameters;
  d["slots"] = slots;
  return d;
}

// Every schema entry, in schema (OptimizerParams) order.
inline pybind11::list OptimizerSchemaList() {
  pybind11::list out;
  for (const OptimizerSchema& s : kOptimizerSchemas) out.append(OptimizerSchemaDict(s));
  return out;
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_PYTHON_OPTIMIZER_DICT_H_
