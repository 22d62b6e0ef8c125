// The vocabulary of the optimizer schema (schema.h): plain constexpr data, no TensorFlow types.  One
// OptimizerSchema describes everything about an optimizer that is not its math: proto field names, Python
// argument names and defaults, valid ranges, the Python arguments that set its slots' initial values, and
// which options need gradient accumulation.  cc/config validates protos with it, the pybind11 config module
// hands it to Python, which builds its classes, argument checks, docstrings and proto mapping from it.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SCHEMA_TYPES_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SCHEMA_TYPES_H_

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <sstream>
#include <string>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

// A read-only view of a constexpr array (C++17 has no std::span).
template <typename T>
struct Span {
  const T* data = nullptr;
  size_t size = 0;
  constexpr const T* begin() const { return data; }
  constexpr const T* end() const { return data + size; }
  constexpr const T& operator[](size_t i) const { return data[i]; }
};

template <typename T, size_t N>
constexpr Span<T> SpanOf(const std::array<T, N>& a) {
  return Span<T>{a.data(), N};
}

// One end of a range.  `present == false` means unbounded on that side.
struct Bound {
  bool present = false;
  double value = 0.0;
  bool inclusive = false;
};

// The valid values of a float argument.  A value is valid when it satisfies every present bound and, when
// `finite`, is finite.  The bounds are written as "is in range", so NaN, which fails every comparison, is
// valid only for Unchecked().  `note` is appended to
// the description ("0 disables it").
struct Range {
  Bound lower;
  Bound upper;
  bool finite = true;
  const char* note = "";

  bool Contains(double v) const {
    if (finite && !std::isfinite(v)) return false;
    if (lower.present && !(lower.inclusive ? v >= lower.value : v > lower.value)) return false;
    if (upper.present && !(upper.inclusive ? v <= upper.value : v < upper.value)) return false;
    return true;
  }

  // "in [0, 1)", "> 0 and finite", ">= 0 and finite (0 disables it)", "finite": the text of every error message,
  // in C++ and (through the config module) in Python.
  std::string Describe() const {
    std::ostringstream out;
    if (lower.present && upper.present) {
      out << "in " << (lower.inclusive ? "[" : "(") << lower.value << ", " << upper.value
          << (upper.inclusive ? "]" : ")");
    } else if (lower.present || upper.present) {
      const Bound& b = lower.present ? lower : upper;
      out << (lower.present ? ">" : "<") << (b.inclusive ? "= " : " ") << b.value << (finite ? " and finite" : "");
    } else {
      out << (finite ? "finite" : "any value");
    }
    if (note[0] != '\0') out << " (" << note << ")";
    return out.str();
  }
};

// Range builders, so schema entries read like the math: ClosedOpen(0, 1) is [0, 1).
constexpr Range Closed(double lo, double hi) { return Range{{true, lo, true}, {true, hi, true}}; }
constexpr Range ClosedOpen(double lo, double hi) { return Range{{true, lo, true}, {true, hi, false}}; }
constexpr Range Open(double lo, double hi) { return Range{{true, lo, false}, {true, hi, false}}; }
constexpr Range AtLeast(double lo, const char* note = "") { return Range{{true, lo, true}, {}, true, note}; }
constexpr Range Above(double lo) { return Range{{true, lo, false}, {}, true}; }
constexpr Range AtMost(double hi) { return Range{{}, {true, hi, true}, true}; }
constexpr Range AnyFinite() { return Range{}; }
// Any value at all, NaN included (a slot's initial value, which TensorFlow does not check either).
constexpr Range Unchecked() { return Range{{}, {}, false}; }

enum class ValueType { kFloat, kBool };

// One field of the optimizer's proto message (e.g. AdamParameters.beta1) and the Python argument that sets it.
struct HyperParameterSpec {
  const char* proto_name;   // field of the optimizer's message in optimization_parameters.proto
  const char* python_name;  // constructor argument and attribute of the Python class
  ValueType type;
  double python_default;  // for kBool: 0 or 1
  Range range;            // kFloat only
  // kBool only: the Python argument is the negation of the proto field (lazy_adam = !use_non_lazy_adam).
  bool python_negated;
  const char* doc;  // one line for the Python docstring
};

constexpr HyperParameterSpec Float(const char* proto, const char* python, double python_default, Range range,
                                   const char* doc) {
  return HyperParameterSpec{proto, python, ValueType::kFloat, python_default, range, false, doc};
}
constexpr HyperParameterSpec Bool(const char* proto, const char* python, bool python_default, const char* doc) {
  return HyperParameterSpec{proto, python, ValueType::kBool, python_default ? 1.0 : 0.0, Unchecked(), false, doc};
}
// A bool whose Python argument means the opposite of the proto field; `python_default` is the argument's.
constexpr HyperParameterSpec NegatedBool(const char* proto, const char* python, bool python_default, const char* doc) {
  return HyperParameterSpec{proto, python, ValueType::kBool, python_default ? 1.0 : 0.0, Unchecked(), true, doc};
}

// The Python argument giving a slot's initial value (slots are not in the proto: a checkpoint carries them).
// Index-aligned with the math header's kSlots, whose default initial value is the argument's default.
struct SlotArgumentSpec {
  const char* python_name;  // nullptr: the Python class takes no argument for this slot (it starts at the default)
  Range range;              // checked in Python only
};

constexpr SlotArgumentSpec SlotArgument(const char* python, Range range = Unchecked()) {
  return SlotArgumentSpec{python, range};
}
constexpr SlotArgumentSpec NoSlotArgument() { return SlotArgumentSpec{nullptr, Unchecked()}; }

// Where the Python class comes from.
enum class PythonClassOrigin {
  kTensorFlow,  // tf.tpu.experimental.embedding.<python_class>: TensorFlow's own class, mapped field for field
  kCatalogue,   // tf_embed_ops.optimizers.<python_class>: generated from this schema
};

// When the optimizer needs gradient accumulation (the summed gradient of a row).
struct AccumulationRule {
  bool always = false;             // e.g. Assign, which assigns the summed gradient
  const char* when_set = nullptr;  // a kBool proto field that, when true, makes it update every row every step
  const char* reason = "";         // the error message's explanation: "<what> needs gradient accumulation (<why>)"
};

struct OptimizerSchema {
  const char* kind;          // the optimization_parameters.parameters oneof field ("adam"); the math's kName
  const char* python_class;  // "Adam"
  PythonClassOrigin origin;
  const char* summary;           // the docstring's first paragraph (formula and source)
  double default_learning_rate;  // NaN: the Python class has no default (it must be given)
  const char* learning_rate_doc;
  bool needs_dynamic_learning_rate;  // the learning rate input carries something else (the global step)
  const char* load_op;               // tf.raw_ops name of TensorFlow's TPU Load op, or "" when TensorFlow has none
  // 0: `kind` is a field of the OptimizationParameters.parameters oneof.  > 0: the optimizer is not in TensorFlow's
  // proto; a config carries it in the OptimizationParameters field of this number (which TensorFlow's message does
  // not have, so it stays an unknown field that every protobuf runtime keeps), a length-delimited message whose
  // field i + 1 is hyper_parameters[i] (float: fixed32, bool: varint).  See docs/config.md, "Optimizers that are
  // not in the TPU proto".
  int extension_field;
  AccumulationRule accumulation;
  // The proto message's fields, in field order: also the order of the math struct's HyperParameters(), whose
  // members they name (registry.h, ForEachHyperParameter).
  Span<HyperParameterSpec> hyper_parameters;
  Span<SlotInfo> slots;                   // the math header's kSlots (Load/Retrieve order)
  Span<SlotArgumentSpec> slot_arguments;  // index-aligned with slots
};

// The per-optimizer parts of a schema entry, built as Describe(...).LoadOp(...)... so every part is named;
// Entry<Optimizer>() adds the hyper-parameters, and the slots from the math header.
struct OptimizerDescription {
  const char* python_class = "";
  PythonClassOrigin origin = PythonClassOrigin::kCatalogue;
  const char* summary = "";
  double default_learning_rate = 0.0;
  const char* learning_rate_doc = "float, or a zero-argument callable for a dynamic learning rate.";
  bool needs_dynamic_learning_rate = false;
  const char* load_op = "";
  int extension_field = 0;
  AccumulationRule accumulation;

  // The tf.raw_ops name of TensorFlow's TPU Load op for this optimizer (its Retrieve op is named alike).
  constexpr OptimizerDescription LoadOp(const char* op) const {
    OptimizerDescription d = *this;
    d.load_op = op;
    return d;
  }
  // The learning rate is a dynamic input carrying something else (the frequency estimator's global step): the
  // Python argument has no default and must be a callable, and a config must give a tag.
  constexpr OptimizerDescription DynamicLearningRate(const char* doc) const {
    OptimizerDescription d = *this;
    d.needs_dynamic_learning_rate = true;
    d.default_learning_rate = std::numeric_limits<double>::quiet_NaN();
    d.learning_rate_doc = doc;
    return d;
  }
  // The optimizer is not in TensorFlow's TPU proto: configs carry it in OptimizationParameters field `number`
  // (see OptimizerSchema::extension_field), and exporting such a config for a TPU is an error.
  constexpr OptimizerDescription NotInTpuProto(int number) const {
    OptimizerDescription d = *this;
    d.extension_field = number;
    return d;
  }
  constexpr OptimizerDescription LearningRateDoc(const char* doc) const {
    OptimizerDescription d = *this;
    d.learning_rate_doc = doc;
    return d;
  }
  // `reason` reads "<what> needs gradient accumulation (<why>)".
  constexpr OptimizerDescription AlwaysNeedsAccumulation(const char* reason) const {
    OptimizerDescription d = *this;
    d.accumulation = AccumulationRule{true, nullptr, reason};
    return d;
  }
  constexpr OptimizerDescription NeedsAccumulationWhen(const char* bool_field, const char* reason) const {
    OptimizerDescription d = *this;
    d.accumulation = AccumulationRule{false, bool_field, reason};
    return d;
  }
};

// The Python class name, where it comes from, its docstring's first paragraph and its default learning rate.
constexpr OptimizerDescription Describe(const char* python_class, PythonClassOrigin origin, const char* summary,
                                        double default_learning_rate) {
  OptimizerDescription d;
  d.python_class = python_class;
  d.origin = origin;
  d.summary = summary;
  d.default_learning_rate = default_learning_rate;
  return d;
}

template <typename Optimizer, size_t NumHyperParameters, size_t NumSlotArguments>
constexpr OptimizerSchema Entry(const OptimizerDescription& d,
                                const std::array<HyperParameterSpec, NumHyperParameters>& hyper_parameters,
                                const std::array<SlotArgumentSpec, NumSlotArguments>& slot_arguments) {
  static_assert(NumSlotArguments == Optimizer::kSlots.size(),
                "a schema entry lists one slot argument per slot of the optimizer's kSlots");
  return OptimizerSchema{Optimizer::kName,
                         d.python_class,
                         d.origin,
                         d.summary,
                         d.default_learning_rate,
                         d.learning_rate_doc,
                         d.needs_dynamic_learning_rate,
                         d.load_op,
                         d.extension_field,
                         d.accumulation,
                         SpanOf(hyper_parameters),
                         SpanOf(Optimizer::kSlots),
                         SpanOf(slot_arguments)};
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SCHEMA_TYPES_H_
