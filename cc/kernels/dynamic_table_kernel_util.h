// What the dynamic-table kernels share: resolving table handles, reading keys (string keys are fingerprinted
// here, the one place a string becomes a key), and the step input.
#ifndef TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_KERNEL_UTIL_H_
#define TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_KERNEL_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "cc/lib/embedding_config.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_embed_ops {

using DynamicTableRef = tensorflow::core::RefCountPtr<DynamicTableResource>;

// The key of a string id: TensorFlow's Fingerprint64 (farmhash64) of its bytes as int64, i.e. exactly
// tf.bitcast(tf.fingerprint(s, "farmhash64"), tf.int64) on a little-endian machine, so a graph without this
// plugin computes the same key with one op.
int64_t StringKey(const tensorflow::tstring& s);

// The table behind resource input `input`; `what` names it in errors ("tables[1] (table 'users')").
absl::Status LookupDynamicTable(tensorflow::OpKernelContext* ctx, int input, const std::string& what,
                                DynamicTableRef* out);

// The tables of a fused op (inputs first_input .. first_input + T - 1) checked against the config: distinct
// resources, the config's dimension, and (when `check_slots`) as many slots as the table's optimizer has.
absl::Status LookupConfigTables(tensorflow::OpKernelContext* ctx, int first_input, const EmbeddingConfig& config,
                                bool check_slots, std::vector<DynamicTableRef>* out);

// `keys` (rank 1, the table's key dtype) as int64 keys: int64 tensors are read in place, string tensors are
// fingerprinted into `scratch`.  `what` names the keys ("feature 0 ('user')" or "keys").
absl::Status ReadKeys(const tensorflow::Tensor& keys, const DynamicTableResource& table, const std::string& what,
                      std::vector<int64_t>* scratch, const int64_t** out);

// The num_slots attr of an op that reads or writes rows with their slots (the length of its slots list) equals
// the table's slot count; `op` names the op in the error and `consequence` ends it (e.g. "; nothing was changed").
absl::Status CheckNumSlots(const DynamicTableResource& table, int num_slots, const char* op,
                           const char* consequence = "");

// An op on one dynamic table (input 0): Compute resolves it and runs ComputeOn (as TieredTableOp does for tiered
// tables).
class DynamicTableOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(tensorflow::OpKernelContext* ctx) final;

 protected:
  virtual void ComputeOn(tensorflow::OpKernelContext* ctx, DynamicTableResource* table) = 0;
};

// The base of the kernels whose op has a num_slots attr: reads it, and looks up the table of input 0 checked
// against it.
class DynamicTableSlotsKernel : public tensorflow::OpKernel {
 public:
  explicit DynamicTableSlotsKernel(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
  }

 protected:
  int num_slots() const { return num_slots_; }

  // The table of input 0, with num_slots slots (CheckNumSlots).
  absl::Status LookupTable(tensorflow::OpKernelContext* ctx, const char* op, const char* consequence,
                           DynamicTableRef* table) const {
    TF_RETURN_IF_ERROR(LookupDynamicTable(ctx, 0, "table", table));
    return CheckNumSlots(**table, num_slots_, op, consequence);
  }

 private:
  int num_slots_ = 0;
};

// The table of input 0 and the keys of input 1 (ReadKeys) of a keyed op (Find, Lookup, EvictKeys).
struct TableAndKeys {
  DynamicTableRef table;
  std::vector<int64_t> scratch;  // string keys' fingerprints
  const int64_t* keys = nullptr;
  int64_t n = 0;
};
absl::Status LookupTableAndKeys(tensorflow::OpKernelContext* ctx, TableAndKeys* out);

// The Tkeys attr has one entry per feature (the shape function checks it too, but only in graphs).
absl::Status CheckKeysPerFeature(tensorflow::OpKernelConstruction* ctx, int num_features);

// The step input: an int64 scalar >= 0.
absl::Status ReadStep(const tensorflow::Tensor& step, int64_t* out);

// Learning rates: the dynamic tag's scalar or the table's constant.
float TableLearningRate(const TableSpec& table, const std::vector<float>& learning_rates);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_DYNAMIC_TABLE_KERNEL_UTIL_H_
