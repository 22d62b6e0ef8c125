#include "cc/kernels/dynamic_table_kernel_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/lib/optimizers/registry.h"
#include "tensorflow/core/framework/tensor_shape.h"
// TensorFlow's Fingerprint64 (tsl/platform/fingerprint.h) is an inline call of farmhash's, but the pip package
// does not put farmhash.h on the include path that header expects; it ships it under external/.  This calls the
// same function (exported by libtensorflow_framework) that the Fingerprint op's farmhash64 method calls.
#include "external/farmhash_archive/src/farmhash.h"

namespace tf_embed_ops {

int64_t StringKey(const tensorflow::tstring& s) {
  // Two's complement reinterpretation: every fingerprint, including those with the top bit set, is a key.
  return static_cast<int64_t>(::util::Fingerprint64(s.data(), s.size()));
}

absl::Status LookupDynamicTable(tensorflow::OpKernelContext* ctx, int input, const std::string& what,
                                DynamicTableRef* out) {
  if (ctx->input_dtype(input) != tensorflow::DT_RESOURCE) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected a dynamic table handle"));
  }
  return Named(tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), out), what);
}

absl::Status CheckNumSlots(const DynamicTableResource& table, int num_slots, const char* op, const char* consequence) {
  if (num_slots == table.num_slots()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("dynamic table '", table.name(), "': ", op,
                                                 ": num_slots = ", num_slots, " but the table has ", table.num_slots(),
                                                 " optimizer slots", consequence));
}

absl::Status LookupTableAndKeys(tensorflow::OpKernelContext* ctx, TableAndKeys* out) {
  TF_RETURN_IF_ERROR(LookupDynamicTable(ctx, 0, "table", &out->table));
  TF_RETURN_IF_ERROR(ReadKeys(ctx->input(1), *out->table, "keys", &out->scratch, &out->keys));
  out->n = ctx->input(1).NumElements();
  return absl::OkStatus();
}

void DynamicTableOp::Compute(tensorflow::OpKernelContext* ctx) {
  DynamicTableRef table;
  OP_REQUIRES_OK(ctx, LookupDynamicTable(ctx, 0, "table", &table));
  ComputeOn(ctx, table.get());
}

absl::Status LookupConfigTables(tensorflow::OpKernelContext* ctx, int first_input, const EmbeddingConfig& config,
                                bool check_slots, std::vector<DynamicTableRef>* out) {
  const int num_tables = static_cast<int>(config.tables.size());
  out->resize(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const TableSpec& spec = config.tables[t];
    const std::string what = absl::StrCat("tables[", t, "] (table '", spec.name, "' in the config)");
    TF_RETURN_IF_ERROR(LookupDynamicTable(ctx, first_input + t, what, &(*out)[t]));
    const DynamicTableResource& table = *(*out)[t];
    if (table.dim() != spec.dimension) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": dynamic table '", table.name(), "' has dim ", table.dim(),
                                                     " but the config's table has dimension ", spec.dimension));
    }
    const auto& slot_infos = OptimizerSlots(spec.optimization.optimizer);
    const int64_t slots = static_cast<int64_t>(slot_infos.size());
    if (check_slots && table.num_slots() != slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": dynamic table '", table.name(), "' was created with ", table.num_slots(),
          " slot initial values but the config's optimizer has ", slots, " slots (one initial value per slot)"));
    }
    for (int64_t k = 0; check_slots && k < slots; ++k) {
      const int64_t width = SlotWidth(slot_infos[k], spec.dimension);
      if (table.slot_width(k) != width) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": dynamic table '", table.name(), "' keeps ", table.slot_width(k),
                         " values per row in slot ", k, " but the config's optimizer's slot '", slot_infos[k].name,
                         "' holds ", width, " (create the table with slot_widths from the optimizer)"));
      }
    }
    for (int u = 0; u < t; ++u) {
      if ((*out)[u].get() == (*out)[t].get()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": dynamic table '", table.name(), "' is also tables[", u,
                                                       "]; every table of the config needs its own dynamic table"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReadKeys(const tensorflow::Tensor& keys, const DynamicTableResource& table, const std::string& what,
                      std::vector<int64_t>* scratch, const int64_t** out) {
  if (keys.dtype() != table.key_dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": keys are ", tensorflow::DataTypeString(keys.dtype()),
                                                   " but dynamic table '", table.name(), "' has ",
                                                   tensorflow::DataTypeString(table.key_dtype()), " keys"));
  }
  if (keys.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": keys must be rank 1, got shape ", keys.shape().DebugString()));
  }
  if (keys.dtype() == tensorflow::DT_INT64) {
    *out = keys.flat<int64_t>().data();
    return absl::OkStatus();
  }
  const auto strings = keys.flat<tensorflow::tstring>();
  scratch->resize(strings.size());
  for (int64_t i = 0; i < strings.size(); ++i) (*scratch)[i] = StringKey(strings(i));
  *out = scratch->data();
  return absl::OkStatus();
}

absl::Status CheckKeysPerFeature(tensorflow::OpKernelConstruction* ctx, int num_features) {
  tensorflow::DataTypeVector tkeys;
  TF_RETURN_IF_ERROR(ctx->GetAttr("Tkeys", &tkeys));
  if (static_cast<int>(tkeys.size()) == num_features) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("keys has ", tkeys.size(), " tensors but there are ", num_features,
                                                 " features; give one keys tensor per feature"));
}

absl::Status ReadStep(const tensorflow::Tensor& step, int64_t* out) {
  if (!tensorflow::TensorShapeUtils::IsScalar(step.shape())) {
    return absl::InvalidArgumentError(absl::StrCat("step must be a scalar, got shape ", step.shape().DebugString()));
  }
  *out = step.scalar<int64_t>()();
  if (*out < 0) return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", *out));
  return absl::OkStatus();
}

float TableLearningRate(const TableSpec& table, const std::vector<float>& learning_rates) {
  const LearningRate& rate = table.optimization.learning_rate;
  return rate.is_dynamic ? learning_rates[rate.tag] : rate.constant;
}

}  // namespace tf_embed_ops
