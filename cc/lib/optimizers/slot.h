// A slot of an optimizer: its name (as in the TPU Load/Retrieve ops, which is also the checkpoint suffix
// `<table>/<slot>`) and the value TensorFlow's Python optimizer fills it with when the user gives none.
#ifndef TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SLOT_H_
#define TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SLOT_H_

namespace tf_embed_ops {

struct SlotInfo {
  const char* name;
  float default_initial_value;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_OPTIMIZERS_SLOT_H_
