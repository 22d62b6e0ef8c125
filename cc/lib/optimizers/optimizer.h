// The frame every optimizer's math struct (cc/lib/optimizers/<name>.h) is built on, so that a header states only
// what is its own:
//   kName       the proto oneof field name ("adam")
//   kSlots      its slots in TensorFlow's Load/Retrieve order, with the value each starts at by default
//   its hyper-parameters as members, and HyperParameters(): references to them in proto field order (their
//               names are in the optimizer's schema entry, schema.h; registry.h's ForEachHyperParameter pairs them)
//   its update: UpdateElement(lr, g, w, slot...) for one element, when the row update is that at every position
//               (ElementWiseOptimizer), else UpdateRow(lr, g, w, slots, dim) for the whole row
//   UpdatesAllRows() when an option makes every row update every step (non-lazy).
// `slots` holds kSlots.size() row pointers, each SlotWidth(kSlots[k], dim) floats wide.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_OPTIMIZER_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_OPTIMIZER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#include "cc/lib/optimizers/slot.h"

namespace tf_embed_ops {

// What an optimizer has unless it says otherwise: no hyper-parameters, and only the rows a step touches update.
struct OptimizerDefaults {
  std::tuple<> HyperParameters() const { return {}; }
  bool UpdatesAllRows() const { return false; }
};

namespace optimizer_internal {
template <typename ElementUpdate, size_t... K>
inline void ForEachElement(const float* g, float* w, float* const* slots, int64_t dim, const ElementUpdate& update,
                           std::index_sequence<K...>) {
  const std::array<float*, sizeof...(K)> slot = {slots[K]...};
  for (int64_t i = 0; i < dim; ++i) update(g[i], w[i], slot[K][i]...);
}
}  // namespace optimizer_internal

// The row loop, written once: update(g[i], w[i], slots[0][i], ..., slots[kNumSlots - 1][i]) for i = 0 .. dim - 1,
// in order.  `update` is a lambda taking (const float& g, float& w, float& slot...), inlined into the loop (no
// indirect call), so the loop vectorises as a hand-written one.  g is a reference so that the element reads g[i]
// wherever its formula does, as such a loop would (the compiler cannot assume the rows do not overlap).
template <size_t kNumSlots, typename ElementUpdate>
inline void ForEachElement(const float* g, float* w, float* const* slots, int64_t dim, const ElementUpdate& update) {
  optimizer_internal::ForEachElement(g, w, slots, dim, update, std::make_index_sequence<kNumSlots>{});
}

// An optimizer whose row update is Self::UpdateElement(lr, g, w, slot...) at each element of the row.
template <typename Self>
struct ElementWiseOptimizer : OptimizerDefaults {
  void UpdateRow(float lr, const float* g, float* w, float* const* slots, int64_t dim) const {
    const Self& self = static_cast<const Self&>(*this);
    ForEachElement<Self::kSlots.size()>(g, w, slots, dim, [&](const float& g_i, float& w_i, auto&... slot_i) {
      self.UpdateElement(lr, g_i, w_i, slot_i...);
    });
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_OPTIMIZER_H_
