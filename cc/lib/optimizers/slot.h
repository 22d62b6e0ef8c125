// A slot of an optimizer: its name (as in the TPU Load/Retrieve ops, which is also the checkpoint suffix
// `<table>/<slot>`), the value TensorFlow's Python optimizer fills it with when the user gives none, and its row
// width: the table's `dim` (one value per element, every TPU optimizer) or 1 (one value per row, row-wise
// Adagrad).  The width is the one source of the slot's shape: [vocabulary_size, SlotWidth(slot, dim)] in the
// kernels, the Python variables and the checkpoints.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SLOT_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SLOT_H_

#include <cstdint>

namespace tf_embed_ops {

struct SlotInfo {
  const char* name;
  float default_initial_value;
  bool per_row = false;  // true: one value per row, a [vocabulary_size, 1] slot
};

// The number of floats a row of this slot holds in a table of `dim` columns.
constexpr int64_t SlotWidth(const SlotInfo& slot, int64_t dim) { return slot.per_row ? 1 : dim; }

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SLOT_H_
