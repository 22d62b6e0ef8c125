// Questions about the optimizer a table runs, answered by its math struct.  The list of optimizers and their
// schema (proto fields, ranges, Python names) live in schema.h; adding an optimizer touches only its math header
// and its schema entry there.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "cc/lib/optimizers/schema.h"
#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

// Calls visit(proto_name, value) for each hyper-parameter of `o` in proto field order: the names are its schema
// entry's, the values its HyperParameters() (references to its members, so a visitor taking `const auto&` sees
// the member itself).  The schema is the one list of names; HyperParametersMatchSchema below checks, when this
// compiles, that both lists agree in length and type.
template <typename Optimizer, typename Visitor>
void ForEachHyperParameter(const Optimizer& o, Visitor&& visit) {
  constexpr Span<HyperParameterSpec> kSpecs = SchemaOf<Optimizer>::kValue.hyper_parameters;
  std::apply(
      [&](const auto&... value) {
        size_t i = 0;
        (visit(kSpecs[i++].proto_name, value), ...);
      },
      o.HyperParameters());
}

namespace registry_internal {
template <typename T>
constexpr bool IsOfType(ValueType type) {
  return type == ValueType::kBool ? std::is_same_v<T, bool> : std::is_same_v<T, float>;
}

template <typename Optimizer, typename Values, size_t... I>
constexpr bool HyperParametersMatchSchema(std::index_sequence<I...>) {
  constexpr Span<HyperParameterSpec> kSpecs = SchemaOf<Optimizer>::kValue.hyper_parameters;
  return kSpecs.size == sizeof...(I) &&
         (IsOfType<std::decay_t<std::tuple_element_t<I, Values>>>(kSpecs[I].type) && ...);
}

template <typename Optimizer>
constexpr bool HyperParametersMatchSchema() {
  using Values = decltype(std::declval<const Optimizer&>().HyperParameters());
  return HyperParametersMatchSchema<Optimizer, Values>(std::make_index_sequence<std::tuple_size_v<Values>>{});
}

template <size_t... K>
constexpr bool EveryOptimizerMatchesItsSchema(std::index_sequence<K...>) {
  return (HyperParametersMatchSchema<std::variant_alternative_t<K, OptimizerParams>>() && ...);
}
}  // namespace registry_internal

static_assert(
    registry_internal::EveryOptimizerMatchesItsSchema(std::make_index_sequence<std::variant_size_v<OptimizerParams>>{}),
    "an optimizer's HyperParameters() and its schema entry's hyper_parameters differ in length or type");

inline const char* OptimizerName(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return o.kName; }, p);
}

inline std::vector<SlotInfo> OptimizerSlots(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return std::vector<SlotInfo>(o.kSlots.begin(), o.kSlots.end()); }, p);
}

inline bool OptimizerUpdatesAllRows(const OptimizerParams& p) {
  return std::visit([](const auto& o) { return o.UpdatesAllRows(); }, p);
}

// The schema entry of the optimizer `p` holds.
inline const OptimizerSchema& SchemaFor(const OptimizerParams& p) { return kOptimizerSchemas[p.index()]; }

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_REGISTRY_H_
