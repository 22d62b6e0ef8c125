// The touched-row marks of an update whose rows were written in more than one walk (docs/tracking.md): a tiered
// table's cache windows.  After the walks, one bit per de-duplicated row of the plan, or O(1) when the optimizer
// wrote every row (non-lazy Adam).  A single walk marks its rows after it, the same way (table_update.h).
#ifndef TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_

#include <cstdint>

#include "cc/lib/dynamic_table_update.h"  // UpdatesAllRows(TableOptimization), written once there
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
