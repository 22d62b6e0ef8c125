#include "cc/kernels/tiered_table_kernel_util.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "cc/lib/optimizers/registry.h"

namespace tf_embed_ops {

absl::Status LookupTieredConfigTables(tensorflow::OpKernelContext* ctx, int first_input, const EmbeddingConfig& config,
                                      bool check_slots, std::vector<TieredTableRef>* out) {
  const int num_tables = static_cast<int>(config.tables.size());
  out->resize(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const TableSpec& spec = config.tables[t];
    const std::string what = absl::StrCat("tables[", t, "] (table '", spec.name, "' in the config)");
    TF_RETURN_IF_ERROR(LookupTieredTable(ctx, first_input + t, what, &(*out)[t]));
    const TieredTableResource& table = *(*out)[t];
    const std::string mismatch = absl::StrCat(what, ": tiered table '", table.name(), "' has ");
    if (table.dim() != spec.dimension || table.num_rows() != spec.vocabulary_size) {
      return absl::InvalidArgumentError(absl::StrCat(mismatch, table.num_rows(), " rows of dim ", table.dim(),
                                                     " but the config's table has vocabulary_size ",
                                                     spec.vocabulary_size, " and dimension ", spec.dimension));
    }
    const std::vector<SlotInfo> slots = OptimizerSlots(spec.optimization.optimizer);
    if (check_slots && table.num_slots() != static_cast<int64_t>(slots.size())) {
      return absl::InvalidArgumentError(absl::StrCat(mismatch, table.num_slots(), " slots but the config's optimizer '",
                                                     OptimizerName(spec.optimization.optimizer), "' has ",
                                                     slots.size()));
    }
    for (size_t k = 0; check_slots && k < slots.size(); ++k) {
      const int64_t width = SlotWidth(slots[k], spec.dimension);
      if (table.slot_width(static_cast<int64_t>(k)) != width) {
        return absl::InvalidArgumentError(absl::StrCat(mismatch, table.slot_width(static_cast<int64_t>(k)),
                                                       " values per row in slot ", k, " but the optimizer's slot '",
                                                       slots[k].name, "' holds ", width));
      }
    }
    for (int u = 0; u < t; ++u) {
      if ((*out)[u].get() == (*out)[t].get()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": tiered table '", table.name(), "' is also tables[", u,
                                                       "]; every table of the config needs its own tiered table"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
