// The fused update's touched-row hook (docs/tracking.md), shared by the static and dynamic kernels: after a
// table's row walk, one store per de-duplicated row of the plan, or O(1) when the optimizer wrote every row
// (non-lazy Adam).
#ifndef TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_

#include <cstdint>

#include "cc/lib/dynamic_table_update.h"  // UpdatesAllRows(TableOptimization)
#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/touched_rows.h"

namespace tf_embed_ops {

inline void MarkUpdatedRows(const RowGradientPlan& plan, bool all_rows, TouchedRows* touched) {
  touched->BeginUpdate();
  if (all_rows) {
    touched->MarkAll();
    return;
  }
  for (int64_t u = 0; u < plan.num_rows(); ++u) touched->Mark(plan.row(u));
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_
